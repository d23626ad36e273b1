// `duet validate`: the simulator's error against live runs of the same trace on the same
// cluster. For each load (a rate scale of the trace) it starts `duet serve --cluster`, replays
// the trace against it with `duet replay` and stops it, --repeats times (round the loads: each
// load's first run, then each one's second, ...); simulates the same
// trace on the same cluster file with `duet simulate`; and compares the summary.json files
// metric by metric (validate_report.h: TTFT, TPOT, ITL and E2E at mean, p50, p90 and p99; output
// throughput; prefix hit rate; PD's KV transfer time; the live median with the runs' range).
// Every run is a child process (SimGrid allows one simulation per process) whose files and log
// stay in the output directory. The servers' step logs say where the error comes from
// (validate_steps.h). Writes validation.json (and with --report a page, validate_html.h) and
// prints a table; exits 1 when an error exceeds its --tolerance.
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/child_processes.h"
#include "cli/commands.h"
#include "cli/machine_cpu.h"
#include "cli/validate_arrivals.h"
#include "cli/validate_flags.h"
#include "cli/validate_html.h"
#include "cli/validate_machine.h"
#include "cli/validate_report.h"
#include "cli/validate_schedule.h"
#include "cli/validate_steps.h"
#include "common/json_util.h"
#include "common/text.h"
#include "deploy/engine_settings.h"
#include "models/step_profile.h"
#include "policies/engine.h"
#include "sim/cluster_spec.h"

namespace duet::cli {
namespace {

namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::json;

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

// What traffic the cluster file's profile was fitted to, beside the traffic validated here:
// {"source": the profile's source, "traffic": "this" (the same trace file and selection: the
// error measured is not on traffic the profile was not fitted to), "same_trace_other_selection",
// "other", "ladders" (calibrated without a trace) or "none" (no fitted profile)}.
json ProfileTraffic(const sim::ClusterSpec& cluster, const std::string& trace_path,
                    const std::vector<std::string>& selection) {
  const models::StepProfile* profile = cluster.cost_model.profile.get();
  if (!profile) return {{"source", nullptr}, {"traffic", "none"}};
  const json& source = profile->source;
  std::string traffic = "ladders";
  if (source.contains("trace") && source["trace"].contains("path")) {
    const bool same_file = SameFile(source["trace"]["path"].get<std::string>(), trace_path);
    traffic = !same_file                                        ? "other"
              : source["trace"]["selection"] == json(selection) ? "this"
                                                                : "same_trace_other_selection";
  }
  return {{"source", source}, {"traffic", traffic}};
}

// What the live servers ran that a simulation against their runs must run too, beside the KV
// blocks: each instance (name, role, tp, dp, node) and the engine's settings.
json ClusterLayout(const sim::ClusterSpec& cluster) {
  json instances = json::array();
  for (std::size_t i = 0; i < cluster.instances.size(); ++i) {
    const deploy::InstanceSpec& spec = cluster.instances[i];
    instances.push_back({{"name", spec.name},
                         {"role", policies::ToString(spec.role)},
                         {"tp", spec.tp},
                         {"dp", spec.dp},
                         {"node", cluster.placements.at(i).node}});
  }
  return {{"instances", instances}, {"engine", deploy::EngineSettingsToJson(cluster.engine)}};
}

// One live run of a load, its files in DIR with SUFFIX ("" for a load's first run, "-2", ...):
// serve.log, steps.jsonl, live/ and replay.log.
struct LiveRun {
  json summary;          // live/summary.json
  std::string step_log;  // the server's steps.jsonl
  Seconds replay_s = 0;  // the replay's wall time
  ChildUsage client, server;
  // The whole machine over the server's life (from before its start to after its stop), where
  // /proc/stat could be read, and that span's wall time.
  std::optional<MachineCpu> machine;
  Seconds serve_s = 0;
};

// Starts `serve` (its arguments but --step-log) afresh, so that one run's prefix caches stay
// out of the next; replays the trace against it with `replay` (its arguments but --endpoint and
// --out); stops it (SIGTERM: it drains). Errors name the child that failed and end with its
// log's tail; a request that failed in the replay fails the run.
Result<LiveRun> RunLive(ChildProcesses& children, std::vector<std::string> serve,
                        std::vector<std::string> replay, const std::string& dir,
                        const std::string& suffix) {
  LiveRun run;
  run.step_log = dir + "/steps" + suffix + ".jsonl";
  const std::string serve_log = dir + "/serve" + suffix + ".log";
  const std::string replay_log = dir + "/replay" + suffix + ".log";
  const std::string live_dir = dir + "/live" + suffix;
  serve.insert(serve.end(), {"--step-log", run.step_log});
  const std::optional<MachineCpu> machine_before = ReadMachineCpu();
  const auto serve_start = std::chrono::steady_clock::now();
  auto server = children.Spawn(serve, serve_log);
  if (!server) return server.status();
  auto address = WaitServing(children, *server, serve_log, 300);
  if (!address) return address.status();
  replay.insert(replay.end(), {"--endpoint", *address, "--out", live_dir});
  const auto replay_start = std::chrono::steady_clock::now();
  auto replayer = children.Spawn(replay, replay_log);
  if (!replayer) return replayer.status();
  const int replayed = children.Wait(*replayer, 1e6).value_or(-1);
  run.replay_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - replay_start).count();
  const int served = children.Stop(*server, 120);
  run.serve_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - serve_start).count();
  if (const std::optional<MachineCpu> after = ReadMachineCpu(); after && machine_before)
    run.machine = MachineCpu{after->busy_s - machine_before->busy_s,
                             after->steal_s - machine_before->steal_s};
  if (replayed != 0)
    return Status::Error("duet replay failed (status " + std::to_string(replayed) + "):\n" +
                         Tail(replay_log));
  if (served != 0)
    return Status::Error("duet serve failed (status " + std::to_string(served) + "):\n" +
                         Tail(serve_log));
  auto summary = ReadRunSummary(live_dir);
  if (!summary) return summary.status();
  run.summary = std::move(*summary);
  const json& requests = run.summary["requests"];
  if (requests["failed"].get<std::int64_t>() > 0)
    return Status::Error(requests["failed"].dump() + " of " + requests["total"].dump() +
                         " requests failed in the live run (" + requests["failed_reasons"].dump() +
                         "; " + replay_log + ")");
  run.client = children.UsageOf(*replayer).value_or(ChildUsage{});
  run.server = children.UsageOf(*server).value_or(ChildUsage{});
  return run;
}

// --again: live run K of a load as a previous duet validate left it in DIR.
Result<LiveRun> RecordedRun(const std::string& dir, const std::string& suffix) {
  LiveRun run;
  run.step_log = dir + "/steps" + suffix + ".jsonl";
  if (!fs::exists(run.step_log)) return Status::Error(run.step_log + ": no such file");
  auto summary = ReadRunSummary(dir + "/live" + suffix);
  if (!summary) return summary.status();
  run.summary = std::move(*summary);
  return run;
}

// The machine the live runs shared: the replay client runs beside the server, and what either
// takes from the engine's cores lengthens its forward passes, which calibration timed on an idle
// machine. Summed over the runs.
json CpuOf(const std::vector<LiveRun>& runs) {
  double replay_s = 0;
  ChildUsage client, server;
  std::optional<MachineCpu> machine = MachineCpu{};
  Seconds serve_s = 0;
  for (const LiveRun& run : runs) {
    replay_s += run.replay_s;
    client.cpu_s += run.client.cpu_s;
    client.involuntary_switches += run.client.involuntary_switches;
    server.cpu_s += run.server.cpu_s;
    server.involuntary_switches += run.server.involuntary_switches;
    serve_s += run.serve_s;
    if (machine && run.machine) {
      machine->busy_s += run.machine->busy_s;
      machine->steal_s += run.machine->steal_s;
    } else {
      machine.reset();
    }
  }
  const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  json cpu = {{"replay_s", replay_s},
              {"cores", cores},
              {"client_cpu_s", client.cpu_s},
              {"client_cores", client.cpu_s / replay_s},
              {"client_involuntary_switches", client.involuntary_switches},
              {"server_cpu_s", server.cpu_s},
              {"server_involuntary_switches", server.involuntary_switches}};
  // The rest of the machine over the servers' lives: what other processes used (the machine's
  // busy time less the server's and the client's, to /proc/stat's tick) and the steal.
  if (machine) {
    cpu["serve_s"] = serve_s;
    cpu["machine_busy_cpu_s"] = machine->busy_s;
    cpu["other_cpu_s"] = std::max(0.0, machine->busy_s - server.cpu_s - client.cpu_s);
    cpu["steal_s"] = machine->steal_s;
    cpu["steal_pct"] = 100 * machine->steal_s / (serve_s * cores);
  }
  return cpu;
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
     "metric), throughput=2, hit_rate=5, kv_transfer=20, kv_part=50 and tpot_part=10 (PD), "
     "ttft_part=50; exit 1 when one is exceeded")
    ("tolerance-at", po::value<std::string>()->default_value("plain"),
     "which simulation --tolerance holds: plain (from the profile as calibrated) or live-speed "
     "(every step priced at the machine's speed during the live runs, measured by the live steps "
     "against calibration's own measurements: for a machine whose speed moves between "
     "calibration and the live runs by more than the tolerance; a fit off its own measurements "
     "still fails)")
    ("repeats", po::value<int>()->default_value(1),
     "live runs per load (1 to 10), each on a fresh server: the live value is their median, "
     "reported with their range, and the simulation's error is stated against it; the runs go "
     "round the loads (each load's first, then each one's second, ...), so that a load's range "
     "spans the machine's drift over the whole validation")
    ("serve-args", po::value<std::string>()->default_value(""),
     "more arguments for duet serve, space-separated (e.g. --threads 2 --workers thread)")
    ("report",
     "also write OUT/report.html: one self-contained page with each load's live and simulated "
     "CDFs of TTFT, TPOT and E2E, the error table and where the error comes from")
    ("again",
     "simulate and report again every load whose live runs a previous duet validate left in "
     "OUT, starting no server: for a changed simulator or profile. The same trace and selection, "
     "no --rate-scales, the runs' repeats and KV blocks as recorded; what was measured beside the "
     "runs (the machine's timings, CPU use) is kept from OUT/validation.json")
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
  const std::string tolerance_at = vm["tolerance-at"].as<std::string>();
  if (tolerance_at != "plain" && tolerance_at != "live-speed")
    return Fail("--tolerance-at: plain or live-speed, got '" + Excerpt(tolerance_at, 40) + "'",
                kExitUsage);
  const int repeats = vm["repeats"].as<int>();
  if (repeats < 1 || repeats > 10)
    return Fail("--repeats: give 1 to 10 live runs per load, got " + std::to_string(repeats),
                kExitUsage);
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
  if (tolerance_at == "live-speed" &&
      (!cluster->cost_model.profile || cluster->cost_model.profile->measurements.empty()))
    return Fail(
        "--tolerance-at live-speed: the cluster file's cost model must be a profile with the "
        "measurements it was fitted to (duet calibrate's), against which the live steps are "
        "timed",
        kExitUsage);
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

  // The KV capacity the simulator plans from the cluster file, in both worlds.
  const std::int64_t kv_blocks = cluster->placements.front().memory.kv_blocks;
  const json layout = ClusterLayout(*cluster);
  const bool again = vm.count("again") > 0;
  const std::string previous_path = (fs::path(out_dir) / "validation.json").string();
  json recorded;  // --again: the previous report, whose loads are this run's
  if (again) {
    if (!vm["rate-scales"].defaulted())
      return Fail("--again simulates every load recorded in OUT: give no --rate-scales",
                  kExitUsage);
    auto previous = ReadJsonFile(previous_path);
    if (previous)
      previous =
          RecordedReport(*previous, previous_path,
                         {vm["trace"].as<std::string>(), TraceSelectionArgs(vm),
                          vm["repeats"].defaulted() ? std::nullopt : std::optional<int>(repeats),
                          kv_blocks, layout});
    if (!previous) return Fail("--again: " + previous.error(), kExitUsage);
    recorded = std::move(*previous);
    scales->clear();
    for (const json& load : recorded["loads"]) scales->push_back(load["rate_scale"].get<double>());
  }

  const std::vector<Metric> metrics = Metrics(cluster->tiers.any());
  json report = {{"cluster", cluster_path},
                 {"model", vm["model"].as<std::string>()},
                 {"trace", vm["trace"].as<std::string>()},
                 {"trace_selection", TraceSelectionArgs(vm)},
                 {"length_scale", vm["length-scale"].as<double>()},
                 {"profile", ProfileTraffic(*cluster, trace->source, TraceSelectionArgs(vm))},
                 {"kv_blocks", kv_blocks},
                 {"layout", layout},
                 {"serve_args", vm["serve-args"].as<std::string>()},
                 {"loads", json::array()}};
  if (again) {
    // The live runs' servers had the recorded arguments, whatever --serve-args says now.
    report["again"] = {{"live_runs_from", previous_path}};
    report["serve_args"] = recorded.value("serve_args", json());
  }
  // The machine's drift from its calibration: the profile's own shapes timed before and after
  // every live run (validate_machine.h), and, where the cluster places instances side by side
  // on a node, beside another instance's steps.
  std::optional<MachineReference> reference;
  // --again: the timings recorded beside the live runs, each load's (null: none), kept where
  // they were read against this profile's calibration, read again against its own measurements
  // where it is another (RereadReference), or why there are none.
  std::vector<json> recorded_machine;
  if (again) {
    const json timed_source = recorded.value("profile", json::object()).value("source", json());
    const bool same_calibration = timed_source == report["profile"]["source"];
    if (recorded.contains("machine_not_timed")) {
      report["machine_not_timed"] = recorded["machine_not_timed"];
    } else if (!cluster->cost_model.profile) {
      report["machine_not_timed"] = "the cost model is not a profile measured on a machine";
    } else {
      for (const json& load : recorded["loads"]) {
        const json timed = load.value("machine", json());
        auto reread = same_calibration || !timed.is_object()
                          ? Result<json>(timed)
                          : RereadReference(timed, timed_source, *cluster->cost_model.profile);
        if (!reread) {
          report["machine_not_timed"] =
              "the live runs' machine timings cannot be read against this profile: " +
              reread.error();
          recorded_machine.clear();
          break;
        }
        recorded_machine.push_back(std::move(*reread));
      }
      if (!recorded_machine.empty())
        report["again"]["machine"] =
            same_calibration ? "kept" : "read against this profile's measurements of their shapes";
    }
  } else if (const models::StepProfile* profile = cluster->cost_model.profile.get()) {
    std::set<int> nodes;
    for (const sim::InstancePlacement& p : cluster->placements) nodes.insert(p.node);
    auto created = MachineReference::Create(vm["model"].as<std::string>(), *profile,
                                            nodes.size() < cluster->placements.size());
    if (created)
      reference.emplace(std::move(*created));
    else
      report["machine_not_timed"] = created.error();
  } else {
    report["machine_not_timed"] = "the cost model is not a profile measured on a machine";
  }
  constexpr int kReferenceRepeats = 5;
  bool exceeded = false;
  ChildProcesses children;
  auto load_dir = [&](double r) { return (fs::path(out_dir) / ("rate-" + RateText(r))).string(); };
  // The trace as a load replays it: the selection at rate scale `r`.
  auto load_trace_of = [&](double r) {
    std::vector<std::string> args = trace_args;
    args.insert(args.end(), {"--rate-scale", RateText(r)});
    return args;
  };
  // Each load's live runs, or with --again the recorded ones, and the machine's reference timed
  // before its first run and after each (a timing between two runs serves both).
  std::vector<std::vector<LiveRun>> live(scales->size());
  std::vector<std::vector<json>> timings(scales->size());
  if (again) {
    report["run_order"] = recorded.value("run_order", "load by load");
    for (std::size_t li = 0; li < scales->size(); ++li) {
      const double r = (*scales)[li];
      for (int k = 1; k <= recorded["loads"][li]["repeats"].get<int>(); ++k) {
        auto run = RecordedRun(load_dir(r), RunSuffix(k));
        if (!run) return Fail("--again: rate scale " + RateText(r) + ": " + run.error());
        live[li].push_back(std::move(*run));
      }
    }
  } else {
    // The runs go round the loads, each load's first run, then each one's second, and so on, so
    // that a load's runs sample the machine over the whole validation rather than over the few
    // minutes one load's runs take back to back: a shared VM's speed moves by several percent
    // from one load to the next (2.8-9.5% on 2026-12-03, docs/validation.md), which back to
    // back would fall on one load as an error and not in its runs' spread.
    report["run_order"] = "round the loads";
    std::vector<std::string> serve = {"serve",
                                      "--cluster",
                                      cluster_path,
                                      "--model",
                                      vm["model"].as<std::string>(),
                                      "--port",
                                      "0",
                                      "--kv-blocks",
                                      std::to_string(kv_blocks)};
    serve.insert(serve.end(), serve_extra.begin(), serve_extra.end());
    json latest;  // the reference's latest timing
    if (reference) latest = reference->Time(kReferenceRepeats);
    for (int k = 1; k <= repeats; ++k) {
      for (std::size_t li = 0; li < scales->size(); ++li) {
        const double r = (*scales)[li];
        const std::string dir = load_dir(r);
        fs::create_directories(dir, ec);
        // Prompt token ids from the model's vocabulary.
        std::vector<std::string> replay = {"replay", "--progress", "never", "--vocab-size",
                                           std::to_string(cluster->model.vocab_size)};
        const std::vector<std::string> load_trace = load_trace_of(r);
        replay.insert(replay.end(), load_trace.begin(), load_trace.end());
        std::fprintf(stderr, "duet validate: rate scale %s: live run %d of %d\n",
                     RateText(r).c_str(), k, repeats);
        if (reference && k == 1) timings[li].push_back(latest);
        auto run = RunLive(children, serve, replay, dir, RunSuffix(k));
        if (!run) return Fail("rate scale " + RateText(r) + ": " + run.error());
        live[li].push_back(std::move(*run));
        if (reference) timings[li].push_back(latest = reference->Time(kReferenceRepeats));
      }
    }
  }
  for (std::size_t li = 0; li < scales->size(); ++li) {
    const double r = (*scales)[li];
    const std::string dir = load_dir(r);
    const std::vector<LiveRun>& runs = live[li];
    const int load_repeats = static_cast<int>(runs.size());

    // `duet simulate` of this load from `cluster_file` on `trace` into DIR/sim-NAME (DIR/sim
    // for "") with its step log there (steps.jsonl), logging to DIR/simulate-NAME.log; returns
    // its summary.json. Errors say "duet simulate" and then `what` (e.g. " (without host
    // time)").
    const std::vector<std::string> load_trace = load_trace_of(r);
    auto simulate = [&](const std::string& cluster_file, const std::vector<std::string>& trace,
                        const std::string& name, const std::string& what) -> Result<json> {
      const std::string suffix = name.empty() ? "" : "-" + name;
      const std::string out = dir + "/sim" + suffix, log = dir + "/simulate" + suffix + ".log";
      std::vector<std::string> args = {"simulate", "--cluster",  cluster_file,
                                       "--out",    out,          "--progress",
                                       "never",    "--step-log", out + "/steps.jsonl"};
      args.insert(args.end(), trace.begin(), trace.end());
      auto run = children.Spawn(args, log);
      if (!run) return run.status();
      if (const int status = children.Wait(*run, 1e6).value_or(-1); status != 0)
        return Status::Error("duet simulate" + what + " failed (status " + std::to_string(status) +
                             "):\n" + Tail(log));
      return ReadRunSummary(out);
    };
    std::fprintf(stderr, "duet validate: rate scale %s: simulation\n", RateText(r).c_str());
    auto simulated_summary = simulate(cluster_path, load_trace, "", "");
    if (!simulated_summary) return Fail(simulated_summary.error());

    json load = {{"rate_scale", r},
                 {"repeats", load_repeats},
                 {"completed_live", runs.front().summary["requests"]["completed"]},
                 {"completed_simulated", (*simulated_summary)["requests"]["completed"]},
                 {"metrics", json::object()}};
    std::vector<json> live_runs;
    for (const LiveRun& run : runs) live_runs.push_back(run.summary);
    std::vector<std::string> live_dirs;  // each run's live/, live-2/, ...
    for (int k = 1; k <= load_repeats; ++k) live_dirs.push_back(dir + "/live" + RunSuffix(k));
    for (const Metric& m : metrics) {
      json& entry = load["metrics"][m.name] = Compare(m, live_runs, *simulated_summary);
      if (tolerance_at == "plain") HoldTolerance(m, *tolerances, "error_pct", entry, &exceeded);
    }
    std::vector<std::string> step_logs;
    for (const LiveRun& run : runs) step_logs.push_back(run.step_log);
    auto steps = AttributeSteps(step_logs, *cluster, *simulated_summary);
    if (!steps) return Fail(steps.error());
    load["steps"] = *steps;
    // Which steps each live run ran (validate_schedule.h), for the schedules' comparison and the
    // hand-over's measurement.
    std::vector<std::vector<Schedule>> live_schedules;
    for (const std::string& log : step_logs) {
      auto s = ReadSchedules(log, *cluster);
      if (!s) return Fail(s.error());
      live_schedules.push_back(std::move(*s));
    }
    // The same load simulated again from `cluster_file` on `trace` (DIR/sim-NAME): each
    // metric's "simulated_KEY" and "error_KEY_pct".
    auto simulate_again = [&](const std::string& cluster_file,
                              const std::vector<std::string>& trace, const std::string& name,
                              const std::string& key, const std::string& what) -> Status {
      auto summary = simulate(cluster_file, trace, name, " (" + what + ")");
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
    // The same from a changed profile (DIR/profile-NAME.json, DIR/cluster-NAME.json); returns
    // that cluster file.
    auto resimulate = [&](const models::StepProfile& profile, const std::string& name,
                          const std::string& key, const std::string& what) -> Result<std::string> {
      auto changed = WriteClusterWithProfile(*cluster, profile, dir, name);
      if (!changed) return changed.status();
      if (Status s = simulate_again(*changed, load_trace, name, key, what); !s.ok()) return s;
      return changed;
    };
    if (reference) load["machine"] = SummarizeReference(timings[li]);
    if (li < recorded_machine.size() && !recorded_machine[li].is_null())
      load["machine"] = recorded_machine[li];
    // Simulations whose schedules are compared beside the plain one's.
    std::vector<VariantLog> variants;
    std::optional<std::string> as_live_cluster;
    if (const models::StepProfile* profile = cluster->cost_model.profile.get()) {
      // With the steps priced as they ran live: how much of each error the step costs account
      // for.
      auto [as_live, as_live_scales] = ProfileAsLive(*cluster, *steps);
      auto written = resimulate(as_live, "as-live", "as_live", "steps priced as they ran live");
      if (!written) return Fail(written.error());
      as_live_cluster = *written;
      load["as_live"] = {{"scales", as_live_scales}};
      variants.push_back({"as_live", "as live", dir + "/sim-as-live/steps.jsonl"});
      // And handing requests over as the live runs did (an idle engine's wake-up, the
      // frontend's time per request): how much of the rest the schedule's grouping accounts
      // for. Only where the live step logs measured the wake-up.
      std::vector<std::string> live_csvs;
      for (const std::string& live : live_dirs) live_csvs.push_back(live + "/requests.csv");
      auto hand_over = MeasureLiveHandOver(live_schedules, live_csvs, as_live);
      if (!hand_over) return Fail(hand_over.error());
      if (hand_over->wakes > 0) {
        if (auto s = resimulate(ProfileWithHandOver(as_live, *hand_over), "as-live-hand-over",
                                "as_live_hand_over", "as live, handing over as live");
            !s)
          return Fail(s.error());
        load["as_live_hand_over"] = hand_over->ToJson();
        variants.push_back({"as_live_hand_over", "as live handing over as live",
                            dir + "/sim-as-live-hand-over/steps.jsonl"});
      }
      // At the machine's measured speed: each kind of step priced slower (or faster) by what the
      // profile's reference shape of its kind, timed alone beside the live runs, took against
      // calibration, so that the error left is not the machine's drift.
      if (load.contains("machine") && load["machine"].is_object()) {
        auto [at_speed, scales] = ProfileAtMachineSpeed(*profile, load["machine"]);
        if (auto s = resimulate(at_speed, "machine-speed", "at_machine_speed",
                                "at the machine's measured speed");
            !s)
          return Fail(s.error());
        load["at_machine_speed"] = std::move(scales);
      }
      // At the live runs' own speed against calibration's measurements (validate_steps.h): the
      // error left when the machine's drift between calibration and the live runs is not one.
      const json live_speed = LiveSpeed(*profile, *steps);
      if (live_speed.is_object()) {
        if (auto s = resimulate(ProfileScaled(*profile, live_speed["scale"].get<double>()),
                                "live-speed", "at_live_speed", "at the live runs' speed");
            !s)
          return Fail(s.error());
        load["at_live_speed"] = live_speed;
      }
      // With the steps slower, all of them and each class's that priced live steps apart: how
      // much each metric moves with the step costs (validate_report.h).
      constexpr double kSlower = 1.05;
      std::map<std::string, json> slower;
      for (int c = -1; c < static_cast<int>(models::kShapeClasses); ++c) {
        std::optional<models::ShapeClass> only;
        if (c >= 0) only = static_cast<models::ShapeClass>(c);
        const std::string name = only ? models::ToString(*only) : "all";
        if (only && load["steps"]["classes"][name]["steps"].get<std::int64_t>() == 0) continue;
        auto written = WriteClusterWithProfile(*cluster, ProfileScaled(*profile, kSlower, only),
                                               dir, "slower-" + name);
        if (!written) return Fail(written.error());
        auto summary =
            simulate(*written, load_trace, "slower-" + name,
                     " (with " + (only ? name + " steps" : "every step") + " 5% slower)");
        if (!summary) return Fail(summary.error());
        slower[name] = std::move(*summary);
      }
      load["sensitivity"] = Sensitivity(load, metrics, *simulated_summary, kSlower, slower);
      if (tolerance_at == "live-speed") {
        if (!live_speed.is_object()) {
          const json& st = load["steps"];
          char why[256];
          std::snprintf(why, sizeof why,
                        "the live forward passes took %.6f s, which the profile prices at %.6f s, "
                        "%.6f s of it what it adds after idle spells and other steps and beside "
                        "other instances'",
                        st["forward_s"].get<double>(), st["priced_s"].get<double>(),
                        AddedBeyondShape(st));
          return Fail("--tolerance-at live-speed: rate scale " + RateText(r) +
                      ": no live step time to time the machine by (" + why + ")");
        }
        for (const Metric& m : metrics)
          HoldTolerance(m, *tolerances, "error_at_live_speed_pct", load["metrics"][m.name],
                        &exceeded);
      }
      MarkToleranceBelowDrift(load);
      // Without the profile's host time: how much of each error pricing it removes.
      if (profile->host) {
        models::StepProfile no_host = *profile;
        no_host.host.reset();
        if (auto s = resimulate(no_host, "no-host", "without_host", "without host time"); !s)
          return Fail(s.error());
      }
    }
    // Which steps each world ran: the live runs', the simulation's and its variants'.
    auto schedule = CompareSchedules(live_schedules, dir + "/sim/steps.jsonl", variants, *cluster);
    if (!schedule) return Fail(schedule.error());
    load["schedule"] = *schedule;
    // Requests that follow others: again with each sent when the first live run sent it
    // (validate_arrivals.h), and also with the steps priced as they ran live.
    if (trace->HasDependencies()) {
      const std::string csv = dir + "/live/requests.csv", sent = dir + "/trace-live-send.jsonl";
      if (Status s = WriteAtLiveSendTimes(*trace, ReadText(csv), csv, sent); !s.ok()) {
        load["at_live_send"] = {{"not_simulated", s.message()}};
      } else {
        const std::vector<std::string> at_live_send = {"--trace", sent, "--trace-format",
                                                       "mooncake"};
        load["at_live_send"] = {{"trace", sent}};
        if (Status s = simulate_again(cluster_path, at_live_send, "live-send", "at_live_send",
                                      "at the live send times");
            !s.ok())
          return Fail(s.message());
        if (as_live_cluster) {
          if (Status s = simulate_again(*as_live_cluster, at_live_send, "as-live-live-send",
                                        "as_live_at_live_send", "as live at the live send times");
              !s.ok())
            return Fail(s.message());
        }
      }
    }
    // The load against its --tolerance, and what each miss is down to.
    StateGoal(load);
    // Where each world's percentiles fall among the live runs' requests.
    if (Status s = PlaceInLive(load, metrics, live_dirs); !s.ok()) return Fail(s.message());
    load["cpu"] = again ? recorded["loads"][li]["cpu"] : CpuOf(runs);
    report["loads"].push_back(load);
  }

  PrintValidation(report, metrics);
  const std::string report_path = (fs::path(out_dir) / "validation.json").string();
  {
    std::ofstream out(report_path);
    out << report.dump(1) << "\n";
    if (!out) return Fail("--out: cannot write " + report_path);
  }
  std::printf("wrote %s\n", report_path.c_str());
  if (vm.count("report")) {
    const std::string html_path = (fs::path(out_dir) / "report.html").string();
    if (Status s = WriteValidationHtml(report, metrics, out_dir, html_path); !s.ok())
      return Fail(s.message());
    std::printf("wrote %s\n", html_path.c_str());
  }
  if (exceeded) return Fail("an error exceeds its --tolerance (marked !)");
  return kExitOk;
}

}  // namespace duet::cli
