// `duet validate`: the simulator's error against a live run of the same trace on the same
// cluster. For each load (a rate scale of the trace) it starts `duet serve --cluster`, replays
// the trace against it with `duet replay`, stops it, simulates the same trace on the same
// cluster file with `duet simulate`, and compares the two summary.json files metric by metric
// (TTFT, TPOT, ITL and E2E at mean, p50, p90 and p99; output throughput; prefix hit rate; PD's
// KV transfer time).
// Every run is a child process (SimGrid allows one simulation per process) whose files and log
// stay in the output directory. The server's step log says where the error comes from: the
// live steps' forward passes against the cost model's price for their shapes, and the time
// each live iteration spends outside its forward pass. Writes validation.json and prints a
// table; exits 1 when an error exceeds its --tolerance.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/engine/step_log.h"
#include "cli/child_processes.h"
#include "cli/commands.h"
#include "cli/validate_flags.h"
#include "common/json_util.h"
#include "models/step_profile.h"
#include "sim/cluster_spec.h"

namespace duet::cli {
namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::json;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The last lines of a child's log, for an error message.
std::string Tail(const std::string& path) {
  const std::string text = ReadText(path);
  const auto from = text.size() > 600 ? text.size() - 600 : 0;
  return text.substr(from);
}

// Waits for `duet serve` to print where it serves ("serving NAME at http://HOST:PORT (...").
Result<std::string> WaitServing(ChildProcesses& children, pid_t server, const std::string& log,
                                Seconds timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string text = ReadText(log);
    const auto at = text.find(" at http://");
    if (text.find("duet serve: serving ") != std::string::npos && at != std::string::npos) {
      const auto end = text.find(' ', at + 4);
      return text.substr(at + 4, end - (at + 4));
    }
    if (auto status = children.Wait(server, 0))
      return Status::Error("duet serve exited (status " + std::to_string(*status) +
                           ") before serving:\n" + Tail(log));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Error("duet serve did not start serving within " +
                       std::to_string(static_cast<int>(timeout_s)) + " s:\n" + Tail(log));
}

// The live steps of one load (the server's step log) beside the cost model's price for their
// shapes, by shape class, decode steps also by batch size (1, 2-3, 4-7, ...: backends change
// kernels with it), and the live iterations' time outside their forward passes.
Result<json> AttributeSteps(const std::string& step_log, const sim::ClusterSpec& cluster,
                            const json& simulated_summary) {
  struct Class {
    std::int64_t steps = 0;
    double forward_s = 0, priced_s = 0;
    std::vector<double> errors;  // per step, priced / forward - 1
  };
  std::array<Class, models::kShapeClasses> classes;
  // Of each class, the steps a fitted profile prices with the pieces above its split (the
  // class's split rows or more: StepFit::PiecesFor).
  std::array<Class, models::kShapeClasses> above_split;
  const models::StepProfile* profile = cluster.cost_model.profile.get();
  std::map<int, Class> decode_bands;  // by floor(log2(rows))
  std::vector<std::unique_ptr<models::StepCostModel>> cost_models;
  for (std::size_t i = 0; i < cluster.instances.size(); ++i)
    cost_models.push_back(sim::MakeStepCostModel(cluster, i));
  // By quarter of the live run (from the first step's start to the last's): whether the same
  // shapes ran slower in one stretch of it (a machine's speed moving) or throughout.
  struct Step {
    Seconds start_s, forward_s, priced_s;
  };
  std::vector<Step> by_start;
  double iteration_s = 0;
  bool async = false;  // asynchronous steps: a forward pass overlaps its iteration
  // Iterations that logged their host time: by phase, and as the cost model prices it.
  std::int64_t host_steps = 0;
  double host_outside_s = 0, host_priced_s = 0;
  std::array<double, models::kHostPhases> host_phase_s{};
  Status bad_instance = Status::Ok();
  const Status read =
      backend::ReadStepLog(ReadText(step_log), step_log, [&](const backend::StepLogLine& line) {
        if (line.instance >= static_cast<int>(cost_models.size())) {
          if (bad_instance.ok())
            bad_instance = Status::Error(step_log + ": instance " + std::to_string(line.instance) +
                                         " is not in the cluster file");
          return;
        }
        const models::ShapeClass shape_class = models::ClassOf(models::FeaturesOf(line.step.shape));
        const double priced =
            cost_models[static_cast<std::size_t>(line.instance)]->StepTime(line.step.shape);
        auto add = [&](Class& c) {
          ++c.steps;
          c.forward_s += line.step.seconds;
          c.priced_s += priced;
          c.errors.push_back(priced / line.step.seconds - 1);
        };
        add(classes[static_cast<std::size_t>(shape_class)]);
        const auto& instance = cluster.instances[static_cast<std::size_t>(line.instance)];
        if (const models::StepFit* fit = profile ? profile->FitFor(instance.tp) : nullptr) {
          const Tokens split = fit->split_rows[static_cast<std::size_t>(shape_class)];
          if (split > 0 &&
              models::FeaturesOf(line.step.shape).tokens() >= static_cast<double>(split))
            add(above_split[static_cast<std::size_t>(shape_class)]);
        }
        if (shape_class == models::ShapeClass::kDecode)
          add(decode_bands
                  [std::bit_width(static_cast<std::uint64_t>(line.step.shape.decode_tokens)) - 1]);
        iteration_s += line.iteration_s;
        async = async || line.async;
        by_start.push_back({line.start_s, line.step.seconds, priced});
        if (line.host) {
          ++host_steps;
          host_outside_s += line.HostSeconds();
          host_priced_s +=
              cost_models[static_cast<std::size_t>(line.instance)]->HostTime(line.host->counts);
          for (std::size_t p = 0; p < models::kHostPhases; ++p)
            host_phase_s[p] += line.host->phase_s[p];
        }
      });
  if (!read.ok()) return read;
  if (!bad_instance.ok()) return bad_instance;
  auto pct = [](double priced, double measured) {
    return measured > 0 ? json(100 * (priced / measured - 1)) : json();
  };
  json out = {{"classes", json::object()}};
  std::int64_t steps = 0;
  double forward_s = 0, priced_s = 0;
  for (std::size_t k = 0; k < classes.size(); ++k) {
    Class& c = classes[k];
    steps += c.steps;
    forward_s += c.forward_s;
    priced_s += c.priced_s;
    json median;
    if (!c.errors.empty()) {
      auto mid = c.errors.begin() + static_cast<std::ptrdiff_t>(c.errors.size() / 2);
      std::nth_element(c.errors.begin(), mid, c.errors.end());
      median = 100 * *mid;
    }
    json& entry = out["classes"][models::ToString(static_cast<models::ShapeClass>(k))];
    entry = {{"steps", c.steps},
             {"forward_s", c.forward_s},
             {"priced_s", c.priced_s},
             {"error_pct", pct(c.priced_s, c.forward_s)},
             {"median_step_error_pct", median}};
    const Class& a = above_split[k];
    if (a.steps > 0)
      entry["above_split"] = {{"steps", a.steps},
                              {"forward_s", a.forward_s},
                              {"priced_s", a.priced_s},
                              {"error_pct", pct(a.priced_s, a.forward_s)}};
  }
  out["decode_by_rows"] = json::array();
  for (const auto& [band, c] : decode_bands) {
    out["decode_by_rows"].push_back({{"rows_from", std::int64_t{1} << band},
                                     {"rows_to", (std::int64_t{2} << band) - 1},
                                     {"steps", c.steps},
                                     {"forward_s", c.forward_s},
                                     {"priced_s", c.priced_s},
                                     {"error_pct", pct(c.priced_s, c.forward_s)}});
  }
  out["live_steps"] = steps;
  const json::json_pointer simulated_steps("/sim/engine_steps");
  out["simulated_steps"] =
      simulated_summary.contains(simulated_steps) ? simulated_summary[simulated_steps] : json();
  out["forward_s"] = forward_s;
  out["priced_s"] = priced_s;
  out["priced_error_pct"] = pct(priced_s, forward_s);
  out["iteration_s"] = iteration_s;
  out["outside_forward_ms_per_step"] =
      steps > 0 && !async ? json(1e3 * (iteration_s - forward_s) / static_cast<double>(steps))
                          : json();
  if (host_steps > 0) {
    // Per iteration, in ms: each phase, the rest outside the forward pass ("other": the loop's
    // own bookkeeping between phases), and what the cost model prices (0 where it does not).
    const double per = 1e3 / static_cast<double>(host_steps);
    json host = {{"steps", host_steps}, {"outside_forward_ms", per * host_outside_s}};
    double phases = 0;
    for (std::size_t p = 0; p < models::kHostPhases; ++p) {
      host[std::string(models::kHostPhaseNames[p]) + "_ms"] = per * host_phase_s[p];
      phases += host_phase_s[p];
    }
    host["other_ms"] = per * (host_outside_s - phases);
    host["priced_ms"] = per * host_priced_s;
    host["priced_error_pct"] = pct(host_priced_s, host_outside_s);
    out["host_per_step"] = std::move(host);
  }
  std::array<double, 4> quarter_forward{}, quarter_priced{};
  if (!by_start.empty()) {
    const auto [first, last] =
        std::minmax_element(by_start.begin(), by_start.end(),
                            [](const Step& a, const Step& b) { return a.start_s < b.start_s; });
    const double span = last->start_s - first->start_s;
    for (const Step& s : by_start) {
      const auto q = span > 0
                         ? std::min<std::size_t>(
                               3, static_cast<std::size_t>(4 * (s.start_s - first->start_s) / span))
                         : 0;
      quarter_forward[q] += s.forward_s;
      quarter_priced[q] += s.priced_s;
    }
  }
  out["priced_error_pct_by_quarter"] = json::array();
  for (std::size_t q = 0; q < 4; ++q)
    out["priced_error_pct_by_quarter"].push_back(pct(quarter_priced[q], quarter_forward[q]));
  return out;
}

// The cluster file's fitted profile with the pieces of each shape class scaled by what the live
// steps they priced took over their price (`steps`: AttributeSteps'; below and above a class's
// split apart; pieces that priced no live step are left as they are): a simulation from it
// prices steps as they ran live, so the error left in it is not the step costs'. Returns the
// profile and the scales: per class, and "<class> above split" where a class is split.
std::pair<models::StepProfile, json> ProfileAsLive(const sim::ClusterSpec& cluster,
                                                   const json& steps) {
  models::StepProfile profile = *cluster.cost_model.profile;
  json scales = json::object();
  auto ratio = [](double forward_s, double priced_s) {
    return forward_s > 0 && priced_s > 0 ? forward_s / priced_s : 1.0;
  };
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    const std::string name = models::ToString(static_cast<models::ShapeClass>(c));
    const json& cls = steps["classes"][name];
    std::int64_t below_steps = cls["steps"].get<std::int64_t>();
    double forward_s = cls["forward_s"].get<double>(), priced_s = cls["priced_s"].get<double>();
    double k_above = 1;
    if (cls.contains("above_split")) {
      const json& a = cls["above_split"];
      k_above = ratio(a["forward_s"].get<double>(), a["priced_s"].get<double>());
      below_steps -= a["steps"].get<std::int64_t>();
      forward_s -= a["forward_s"].get<double>();
      priced_s -= a["priced_s"].get<double>();
      scales[name + " above split"] = k_above;
    }
    const double k = below_steps > 0 ? ratio(forward_s, priced_s) : 1.0;
    scales[name] = k;
    for (models::StepFit& fit : profile.fits) {
      for (models::AffinePiece& piece : fit.pieces[c])
        for (double& v : piece.seconds_per) v *= k;
      for (models::AffinePiece& piece : fit.pieces_above[c])
        for (double& v : piece.seconds_per) v *= k_above;
    }
  }
  return {std::move(profile), scales};
}

// The cluster file again with `profile` as its cost model, written to DIR/profile-NAME.json and
// DIR/cluster-NAME.json; returns the cluster file's path.
Result<std::string> WriteClusterWithProfile(const sim::ClusterSpec& cluster,
                                            const models::StepProfile& profile,
                                            const std::string& dir, const std::string& name) {
  const std::string profile_path =
      fs::absolute(fs::path(dir) / ("profile-" + name + ".json")).string();
  const std::string cluster_path = (fs::path(dir) / ("cluster-" + name + ".json")).string();
  auto doc = ReadJsonFile(cluster.path);
  if (!doc) return doc.status();
  sim::AbsolutizeClusterRefs(*doc, fs::absolute(cluster.path).parent_path().string());
  (*doc)["cost_model"]["profile"] = profile_path;
  for (const auto& [path, text] : {std::pair{profile_path, models::FormatStepProfile(profile)},
                                   std::pair{cluster_path, doc->dump(1) + "\n"}}) {
    std::ofstream out(path);
    out << text;
    if (!out) return Status::Error("--out: cannot write " + path);
  }
  return cluster_path;
}

// "+1.2%", or "n/a" for a null.
std::string Percent(const json& value) {
  if (!value.is_number()) return "n/a";
  char text[32];
  std::snprintf(text, sizeof text, "%+.1f%%", value.get<double>());
  return text;
}

std::string Scale(double r) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", r);
  return text;
}

}  // namespace

int Validate(int argc, char** argv) {
  po::options_description opts(
      "duet validate: the simulator's error against a live run of the same trace");
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("cluster", po::value<std::string>()->required(),
     "the cluster file both worlds run (its cost_model prices the simulated steps: a profile "
     "duet calibrate measured on this machine)")
    ("model", po::value<std::string>()->required(), "the model directory duet serve loads")
    ("rate-scales", po::value<std::string>()->default_value("0.5,1,2"),
     "the loads: rate scales of the trace, e.g. light, near saturation and overload")
    ("tolerance", po::value<std::string>()->default_value(""),
     "the largest error allowed, in percent: p50=5,p99=10 (by statistic), ttft_ms.p50=5 (one "
     "metric), throughput=2, hit_rate=5, kv_transfer=20 (PD); exit 1 when one is exceeded")
    ("serve-args", po::value<std::string>()->default_value(""),
     "more arguments for duet serve, space-separated (e.g. --threads 2 --workers thread)")
    ("out", po::value<std::string>()->default_value("validation"), "output directory");
  // clang-format on
  AddTraceOptions(opts);
  po::variables_map vm;
  int code = kExitOk;
  if (!ParseArgs(argc, argv, opts, vm, &code)) return code;
  auto scales = ParseRateScales(vm["rate-scales"].as<std::string>());
  if (!scales) return Fail(scales.error(), kExitUsage);
  auto tolerances = ParseTolerances(vm["tolerance"].as<std::string>());
  if (!tolerances) return Fail(tolerances.error(), kExitUsage);
  for (const char* flag : {"rate-scale", "seed"}) {
    if (!vm[flag].defaulted())
      return Fail(std::string("--") + flag + ": validate sets it for each run (--rate-scales)",
                  kExitUsage);
  }
  // Checked before anything runs: the trace and the cluster file.
  int trace_code = kExitOk;
  auto trace = LoadTrace(vm, &trace_code);
  if (!trace) return Fail(trace.error(), trace_code);
  const std::string cluster_path = vm["cluster"].as<std::string>();
  auto cluster = sim::LoadClusterSpec(cluster_path, DataDir());
  if (!cluster) return Fail(cluster.error());
  const std::string out_dir = vm["out"].as<std::string>();
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return Fail("--out: cannot create " + out_dir + ": " + ec.message());

  std::vector<std::string> trace_args = {"--trace", vm["trace"].as<std::string>()};
  for (const std::string& arg : TraceSelectionArgs(vm)) trace_args.push_back(arg);
  std::vector<std::string> serve_extra;
  {
    std::stringstream in(vm["serve-args"].as<std::string>());
    for (std::string word; in >> word;) {
      for (const char* own : {"--cluster", "--model", "--port", "--kv-blocks", "--step-log"}) {
        if (word == own) return Fail("--serve-args: validate sets " + word + " itself", kExitUsage);
      }
      serve_extra.push_back(word);
    }
  }

  const std::vector<Metric> metrics = Metrics();
  json report = {{"cluster", cluster_path},
                 {"model", vm["model"].as<std::string>()},
                 {"trace", vm["trace"].as<std::string>()},
                 {"trace_selection", TraceSelectionArgs(vm)},
                 {"length_scale", vm["length-scale"].as<double>()},
                 {"loads", json::array()}};
  bool exceeded = false;
  ChildProcesses children;
  for (double r : *scales) {
    const std::string dir = (fs::path(out_dir) / ("rate-" + Scale(r))).string();
    fs::create_directories(dir, ec);
    std::vector<std::string> scale = {"--rate-scale", Scale(r)};
    std::fprintf(stderr, "duet validate: rate scale %s: live run\n", Scale(r).c_str());

    // The KV capacity the simulator plans from the cluster file, in both worlds.
    std::vector<std::string> serve = {"serve",
                                      "--cluster",
                                      cluster_path,
                                      "--model",
                                      vm["model"].as<std::string>(),
                                      "--port",
                                      "0",
                                      "--kv-blocks",
                                      std::to_string(cluster->placements.front().memory.kv_blocks),
                                      "--step-log",
                                      dir + "/steps.jsonl"};
    serve.insert(serve.end(), serve_extra.begin(), serve_extra.end());
    auto server = children.Spawn(serve, dir + "/serve.log");
    if (!server) return Fail(server.error());
    auto address = WaitServing(children, *server, dir + "/serve.log", 300);
    if (!address) return Fail(address.error());
    // Prompt token ids from the model's vocabulary.
    std::vector<std::string> replay = {
        "replay", "--endpoint",   *address,
        "--out",  dir + "/live",  "--progress",
        "never",  "--vocab-size", std::to_string(cluster->model.vocab_size)};
    replay.insert(replay.end(), trace_args.begin(), trace_args.end());
    replay.insert(replay.end(), scale.begin(), scale.end());
    const auto replay_start = std::chrono::steady_clock::now();
    auto replayer = children.Spawn(replay, dir + "/replay.log");
    if (!replayer) return Fail(replayer.error());
    const int replayed = children.Wait(*replayer, 1e6).value_or(-1);
    const double replay_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - replay_start).count();
    const int served = children.Stop(*server, 120);
    if (replayed != 0)
      return Fail("duet replay failed (status " + std::to_string(replayed) + "):\n" +
                  Tail(dir + "/replay.log"));
    if (served != 0)
      return Fail("duet serve failed (status " + std::to_string(served) + "):\n" +
                  Tail(dir + "/serve.log"));

    std::fprintf(stderr, "duet validate: rate scale %s: simulation\n", Scale(r).c_str());
    std::vector<std::string> simulate = {"simulate",   "--cluster",  cluster_path, "--out",
                                         dir + "/sim", "--progress", "never"};
    simulate.insert(simulate.end(), trace_args.begin(), trace_args.end());
    simulate.insert(simulate.end(), scale.begin(), scale.end());
    auto simulator = children.Spawn(simulate, dir + "/simulate.log");
    if (!simulator) return Fail(simulator.error());
    const int simulated = children.Wait(*simulator, 1e6).value_or(-1);
    if (simulated != 0)
      return Fail("duet simulate failed (status " + std::to_string(simulated) + "):\n" +
                  Tail(dir + "/simulate.log"));

    auto live = ReadJsonFile(dir + "/live/summary.json");
    auto simulated_summary = ReadJsonFile(dir + "/sim/summary.json");
    if (!live) return Fail(live.error());
    if (!simulated_summary) return Fail(simulated_summary.error());
    const json& requests = (*live)["requests"];
    if (requests["failed"].get<std::int64_t>() > 0)
      return Fail("rate scale " + Scale(r) + ": " + requests["failed"].dump() + " of " +
                  requests["total"].dump() + " requests failed in the live run (" +
                  requests["failed_reasons"].dump() + "; " + dir + "/replay.log)");
    json load = {{"rate_scale", r},
                 {"completed_live", (*live)["requests"]["completed"]},
                 {"completed_simulated", (*simulated_summary)["requests"]["completed"]},
                 {"metrics", json::object()}};
    for (const Metric& m : metrics) {
      const json& a = live->contains(m.pointer) ? (*live)[m.pointer] : json();
      const json& b =
          simulated_summary->contains(m.pointer) ? (*simulated_summary)[m.pointer] : json();
      json entry = {{"live", a}, {"simulated", b}, {"error_pct", nullptr}};
      if (a.is_number() && b.is_number() && a.get<double>() != 0) {
        const double error = 100.0 * (b.get<double>() - a.get<double>()) / a.get<double>();
        entry["error_pct"] = error;
        auto tol = tolerances->find(m.name);
        if (tol == tolerances->end()) tol = tolerances->find(m.statistic);
        if (tol != tolerances->end()) {
          entry["tolerance_pct"] = tol->second;
          const bool over = std::abs(error) > tol->second;
          entry["within"] = !over;
          exceeded |= over;
        }
      }
      load["metrics"][m.name] = entry;
    }
    auto steps = AttributeSteps(dir + "/steps.jsonl", *cluster, *simulated_summary);
    if (!steps) return Fail(steps.error());
    load["steps"] = *steps;
    // The same load simulated again from a changed profile (DIR/sim-NAME): each metric's
    // "simulated_KEY" and "error_KEY_pct".
    auto resimulate = [&](const models::StepProfile& profile, const std::string& name,
                          const std::string& key, const std::string& what) -> Status {
      auto changed = WriteClusterWithProfile(*cluster, profile, dir, name);
      if (!changed) return changed.status();
      std::vector<std::string> again = {"simulate",           "--cluster",  *changed, "--out",
                                        dir + "/sim-" + name, "--progress", "never"};
      again.insert(again.end(), trace_args.begin(), trace_args.end());
      again.insert(again.end(), scale.begin(), scale.end());
      const std::string log = dir + "/simulate-" + name + ".log";
      auto run = children.Spawn(again, log);
      if (!run) return run.status();
      if (const int status = children.Wait(*run, 1e6).value_or(-1); status != 0)
        return Status::Error("duet simulate (" + what + ") failed (status " +
                             std::to_string(status) + "):\n" + Tail(log));
      auto summary = ReadJsonFile(dir + "/sim-" + name + "/summary.json");
      if (!summary) return summary.status();
      for (const Metric& m : metrics) {
        json& entry = load["metrics"][m.name];
        const json& b = summary->contains(m.pointer) ? (*summary)[m.pointer] : json();
        entry["simulated_" + key] = b;
        entry["error_" + key + "_pct"] = nullptr;
        if (b.is_number() && entry["live"].is_number() && entry["live"].get<double>() != 0)
          entry["error_" + key + "_pct"] =
              100.0 * (b.get<double>() / entry["live"].get<double>() - 1);
      }
      return Status::Ok();
    };
    if (const models::StepProfile* profile = cluster->cost_model.profile.get()) {
      // With the steps priced as they ran live: how much of each error the step costs account
      // for.
      auto [as_live, as_live_scales] = ProfileAsLive(*cluster, *steps);
      if (Status s = resimulate(as_live, "as-live", "as_live", "steps priced as they ran live");
          !s.ok())
        return Fail(s.message());
      load["as_live"] = {{"scales", as_live_scales}};
      // Without the profile's host time: how much of each error pricing it removes.
      if (profile->host) {
        models::StepProfile no_host = *profile;
        no_host.host.reset();
        if (Status s = resimulate(no_host, "no-host", "without_host", "without host time"); !s.ok())
          return Fail(s.message());
      }
    }
    // The machine the live run shared: the replay client runs beside the server, and what
    // either takes from the engine's cores lengthens its forward passes, which calibration
    // timed on an idle machine.
    const ChildUsage client = children.UsageOf(*replayer).value_or(ChildUsage{});
    const ChildUsage server_usage = children.UsageOf(*server).value_or(ChildUsage{});
    load["cpu"] = {{"replay_s", replay_s},
                   {"cores", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))},
                   {"client_cpu_s", client.cpu_s},
                   {"client_cores", client.cpu_s / replay_s},
                   {"client_involuntary_switches", client.involuntary_switches},
                   {"server_cpu_s", server_usage.cpu_s},
                   {"server_involuntary_switches", server_usage.involuntary_switches}};
    report["loads"].push_back(load);
  }

  // The table: one row per metric, live / simulated / error per load.
  std::printf("%-32s", "metric");
  for (double r : *scales)
    std::printf(" | %-30s", ("rate x" + Scale(r) + ": live, sim, error").c_str());
  std::printf("\n");
  for (const Metric& m : metrics) {
    std::printf("%-32s", m.name.c_str());
    for (const json& load : report["loads"]) {
      const json& e = load["metrics"][m.name];
      char cell[64];
      if (e["error_pct"].is_number()) {
        std::snprintf(cell, sizeof cell, "%.2f, %.2f, %+.1f%%%s", e["live"].get<double>(),
                      e["simulated"].get<double>(), e["error_pct"].get<double>(),
                      e.contains("within") && !e["within"].get<bool>() ? " !" : "");
      } else {
        std::snprintf(cell, sizeof cell, "n/a");
      }
      std::printf(" | %-30s", cell);
    }
    std::printf("\n");
  }
  // Where the error comes from, per load.
  for (const json& load : report["loads"]) {
    const json& s = load["steps"];
    std::string classes;
    for (const auto& [name, c] : s["classes"].items()) {
      if (c["steps"].get<std::int64_t>() == 0) continue;
      classes += (classes.empty() ? "" : ", ") + name + " " + Percent(c["error_pct"]);
    }
    std::string quarters;
    for (const json& q : s["priced_error_pct_by_quarter"])
      quarters += (quarters.empty() ? "" : ", ") + Percent(q);
    std::string bands;
    for (const json& b : s["decode_by_rows"]) {
      const auto from = b["rows_from"].get<std::int64_t>(), to = b["rows_to"].get<std::int64_t>();
      bands += (bands.empty() ? "" : ", ") + std::to_string(from) +
               (to > from ? "-" + std::to_string(to) : std::string()) + " " +
               Percent(b["error_pct"]);
    }
    char outside[96] = "the forward passes overlap their iterations (asynchronous steps)";
    if (s["outside_forward_ms_per_step"].is_number())
      std::snprintf(outside, sizeof outside,
                    "each live iteration spends %.2f ms outside its forward pass",
                    s["outside_forward_ms_per_step"].get<double>());
    std::printf(
        "steps at x%s: %lld live, %s simulated; the cost model prices the live steps' forward "
        "passes (%.2f s) at %s (%s; decode by batch rows %s; by quarter of the run %s); %s\n",
        Scale(load["rate_scale"].get<double>()).c_str(),
        static_cast<long long>(s["live_steps"].get<std::int64_t>()),
        s["simulated_steps"].is_number() ? s["simulated_steps"].dump().c_str() : "n/a",
        s["forward_s"].get<double>(), Percent(s["priced_error_pct"]).c_str(), classes.c_str(),
        bands.empty() ? "n/a" : bands.c_str(), quarters.c_str(), outside);
    if (s.contains("host_per_step")) {
      const json& h = s["host_per_step"];
      std::string phases;
      for (const std::string_view name : models::kHostPhaseNames) {
        const std::string key(name);
        char part[64];
        std::snprintf(part, sizeof part, "%s %.1f", key.c_str(),
                      1e3 * h[key + "_ms"].get<double>());
        phases += (phases.empty() ? "" : ", ") + std::string(part);
      }
      std::printf(
          "host at x%s: per iteration %.1f us outside the forward pass (%s, other %.1f us); the "
          "cost model prices %.1f us (%s)\n",
          Scale(load["rate_scale"].get<double>()).c_str(),
          1e3 * h["outside_forward_ms"].get<double>(), phases.c_str(),
          1e3 * h["other_ms"].get<double>(), 1e3 * h["priced_ms"].get<double>(),
          Percent(h["priced_error_pct"]).c_str());
    }
    if (load.contains("as_live")) {
      std::string scales;
      for (const auto& [name, k] : load["as_live"]["scales"].items()) {
        char scale[64];
        std::snprintf(scale, sizeof scale, "%s x%.3f", name.c_str(), k.get<double>());
        scales += (scales.empty() ? "" : ", ") + std::string(scale);
      }
      std::string errors;
      for (const char* name :
           {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50", "ttft_ms.p99", "tpot_ms.p99", "e2e_ms.p99"})
        errors += std::string(errors.empty() ? "" : ", ") + name + " " +
                  Percent(load["metrics"][name]["error_as_live_pct"]);
      std::printf(
          "as live at x%s: with the steps priced as they ran live (%s) the simulation's errors "
          "are %s\n",
          Scale(load["rate_scale"].get<double>()).c_str(), scales.c_str(), errors.c_str());
    }
    if (load["metrics"]["ttft_ms.p50"].contains("error_without_host_pct")) {
      std::string errors;
      for (const char* name : {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"})
        errors += std::string(errors.empty() ? "" : ", ") + name + " " +
                  Percent(load["metrics"][name]["error_without_host_pct"]) + " (with it " +
                  Percent(load["metrics"][name]["error_pct"]) + ")";
      std::printf("without host time at x%s: the simulation's errors are %s\n",
                  Scale(load["rate_scale"].get<double>()).c_str(), errors.c_str());
    }
    const json& cpu = load["cpu"];
    std::printf(
        "cpu at x%s: over the %.1f s replay the client used %.1f CPU-s (%.2f of %d cores); the "
        "server, from its start to its stop, %.1f CPU-s, preempted %lld times\n",
        Scale(load["rate_scale"].get<double>()).c_str(), cpu["replay_s"].get<double>(),
        cpu["client_cpu_s"].get<double>(), cpu["client_cores"].get<double>(),
        cpu["cores"].get<int>(), cpu["server_cpu_s"].get<double>(),
        static_cast<long long>(cpu["server_involuntary_switches"].get<std::int64_t>()));
  }
  const std::string report_path = (fs::path(out_dir) / "validation.json").string();
  {
    std::ofstream out(report_path);
    out << report.dump(1) << "\n";
    if (!out) return Fail("--out: cannot write " + report_path);
  }
  std::printf("wrote %s\n", report_path.c_str());
  if (exceeded) return Fail("an error exceeds its --tolerance (marked !)");
  return kExitOk;
}

}  // namespace duet::cli
