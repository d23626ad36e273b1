// `duet validate` as a user runs it: a real `duet serve` on loopback replayed by `duet replay`,
// the same trace simulated on the same cluster file priced by a profile `duet calibrate`
// measured, and the two compared metric by metric; the live steps (the server's step log)
// priced by the same profile; tolerances that fail the run; bad flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "models/host_time.h"
#include "models/step_profile.h"
#include "policies/metrics.h"

#include "tests/common/shared_traces.h"
#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ValidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const RunResult made = RunDuet({"make-test-model", "--out", tmp_.File("model")});
    ASSERT_EQ(made.exit_code, 0) << made;
    const RunResult calibrated = RunDuet({"calibrate", "--model", tmp_.File("model"), "--out",
                                          tmp_.File("profile.json"), "--repeats", "2"});
    ASSERT_EQ(calibrated.exit_code, 0) << calibrated;
    // One colocated instance of the test model in engine threads, priced by its profile.
    tmp_.Write("cluster.json", R"({
      "model": "./model",
      "nodes": [{"gpus": 1, "gpu": "tiny-gpu", "nic": {"bandwidth_GBps": 10, "latency_us": 1}}],
      "instances": [{"role": "colocated"}],
      "engine": {"max_num_seqs": 8, "reserved_gib": 0.25},
      "cost_model": {"kind": "fitted", "profile": "profile.json"}})");
    // Bursts (requests arriving together: 1 and 2, 6 to 8, 10 and 11) so that decode batches of
    // several rows run however fast the test model's steps are (they take well under a
    // millisecond once the server has warmed up).
    tmp_.Write("trace.json", R"({"num_requests": 12, "seed": 5, "block_tokens": 16,
      "arrival": {"process": "gamma", "rate_per_s": 20, "cv": 4},
      "input": {"dist": "uniform", "min": 16, "max": 96},
      "output": {"dist": "uniform", "min": 4, "max": 16}})");
  }
  RunResult Validate(std::vector<std::string> extra,
                     const std::string& serve_args = "--workers thread --threads 1") {
    std::vector<std::string> args = {"validate",
                                     "--cluster",
                                     tmp_.File("cluster.json"),
                                     "--model",
                                     tmp_.File("model"),
                                     "--trace",
                                     trace_,
                                     "--out",
                                     tmp_.File("out"),
                                     "--serve-args",
                                     serve_args};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunDuet(args);
  }

  TempDir tmp_;
  std::string trace_ = tmp_.File("trace.json");
};

// The prompt tokens the live run's requests sent (its requests.csv).
std::int64_t PromptTokens(const std::string& requests_csv) {
  std::ifstream in(requests_csv);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("request_id,arrival_s,input_tokens,", 0), 0u) << line;
  std::int64_t total = 0;
  while (std::getline(in, line)) {
    const auto a = line.find(',') + 1, b = line.find(',', a) + 1;
    total += std::stoll(line.substr(b, line.find(',', b) - b));
  }
  return total;
}

// What the profile adds to the price of a live step for what its instance ran before it: after
// an idle spell of 1 ms or more since its previous iteration ended in the log (or since the
// run's clock began, before its first), what its after_idle says; right after another step,
// what its after_step says after that step's shape.
class AfterPrices {
 public:
  explicit AfterPrices(const models::StepProfile& profile)
      : cost_(profile.fits.at(0), std::nullopt, profile.after_idle, profile.after_step) {}
  double Of(const json& line, const models::StepShape& shape) {
    const int instance = line["instance"].get<int>();
    const double start = line["start_s"].get<double>();
    const auto last = last_.find(instance);
    const double spell = start - (last == last_.end() ? 0 : last->second.first);
    const double extra = spell >= models::kIdleGap || last == last_.end()
                             ? cost_.AfterIdle(shape, spell)
                             : cost_.AfterStep(shape, last->second.second);
    last_.insert_or_assign(instance, std::pair{start + line["iteration_s"].get<double>(), shape});
    return extra;
  }

 private:
  models::FittedCostModel cost_;
  std::map<int, std::pair<double, models::StepShape>> last_;  // by instance: its end, its shape
};

// The simulation again with its steps priced as they ran live: each class's pieces (and, where
// the class is split, its pieces above the split apart) scaled by the live forward passes they
// priced over their price, recomputed here from the step log, less what the profile adds for
// what ran before the steps (which the scaled profile adds as it is); the errors of that
// simulation.
void ExpectSimulatedAsLive(const json& load, const std::string& dir,
                           const models::StepProfile& profile) {
  ASSERT_TRUE(load.contains("as_live")) << load;
  const models::StepFit& fit = profile.fits.at(0);
  std::array<std::array<double, 2>, models::kShapeClasses> forward{}, priced{};  // below, above
  std::array<bool, models::kShapeClasses> above_split{};  // a step above the class's split ran
  AfterPrices after(profile);
  std::ifstream in(dir + "/steps.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json doc = json::parse(line);
    auto shape = models::ParseStepShape(doc, "steps.jsonl");
    ASSERT_TRUE(shape.ok()) << shape.error();
    const models::StepFeatures f = models::FeaturesOf(*shape);
    const auto c = static_cast<std::size_t>(models::ClassOf(f));
    const bool above = fit.split_rows[c] > 0 && f.tokens() >= double(fit.split_rows[c]);
    forward[c][above] += doc["seconds"].get<double>() - after.Of(doc, *shape);
    above_split[c] = above_split[c] || above;
    priced[c][above] += models::FittedCostModel(fit).StepTime(*shape);
  }
  auto scaled = models::LoadStepProfile(dir + "/profile-as-live.json");
  ASSERT_TRUE(scaled.ok()) << scaled.error();
  const models::StepFit& as_live = scaled->fits.at(0);
  const json& scales = load["as_live"]["scales"];
  int split_classes = 0;
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    const std::string name = models::ToString(static_cast<models::ShapeClass>(c));
    // (1 where the profile's additions for what ran before took all of the passes' time, as a
    // noisy two-repeat calibration of the tiny model can price them.)
    auto ratio = [](double f, double p) { return f > 0 && p > 0 ? f / p : 1.0; };
    const double k = ratio(forward[c][0], priced[c][0]);
    const double k_above = ratio(forward[c][1], priced[c][1]);
    EXPECT_NEAR(scales[name].get<double>(), k, 1e-9 * k) << name;
    if (above_split[c]) {
      ++split_classes;
      EXPECT_NEAR(scales[name + " above split"].get<double>(), k_above, 1e-9 * k_above) << name;
    }
    for (auto [pieces, original, scale] :
         {std::tuple{&as_live.pieces[c], &fit.pieces[c], k},
          std::tuple{&as_live.pieces_above[c], &fit.pieces_above[c], k_above}}) {
      ASSERT_EQ(pieces->size(), original->size()) << name;
      for (std::size_t p = 0; p < original->size(); ++p)
        for (std::size_t col = 0; col < models::kFitColumns; ++col) {
          const double want = scale * (*original)[p].seconds_per[col];
          EXPECT_NEAR((*pieces)[p].seconds_per[col], want, 1e-15 + 1e-9 * want)
              << name << " piece " << p << " column " << col;
        }
    }
  }
  EXPECT_EQ(scales.size(), models::kShapeClasses + split_classes) << scales;
  const json live = ReadJson(dir + "/live/summary.json");
  const json sim = ReadJson(dir + "/sim-as-live/summary.json");
  EXPECT_EQ(sim["requests"]["completed"], live["requests"]["completed"]);
  for (const char* name : {"ttft_ms.p50", "e2e_ms.p99", "tpot_ms.mean"}) {
    const json& m = load["metrics"][name];
    EXPECT_DOUBLE_EQ(m["error_as_live_pct"].get<double>(),
                     100 * (m["simulated_as_live"].get<double>() / m["live"].get<double>() - 1))
        << m;
  }
}

// Simulated again as live and handing over as live: the as-live profile with the live runs'
// median wake-up (every run starts with its engine idle, so a message wakes it at least once) and
// frontend time per request, which the simulation then prices on each waking step.
void ExpectHandedOverAsLive(const json& load, const std::string& dir) {
  ASSERT_TRUE(load.contains("as_live_hand_over")) << load;
  const json& h = load["as_live_hand_over"];
  EXPECT_GE(h["wakes"].get<int>(), 1) << h;
  EXPECT_EQ(h["requests"], load["completed_live"]) << h;
  auto as_live = models::LoadStepProfile(dir + "/profile-as-live.json");
  auto handing = models::LoadStepProfile(dir + "/profile-as-live-hand-over.json");
  ASSERT_TRUE(as_live.ok() && handing.ok());
  EXPECT_EQ(models::StepProfileToJson(*handing)["fits"],
            models::StepProfileToJson(*as_live)["fits"]);
  ASSERT_TRUE(handing->host && handing->frontend);
  EXPECT_NEAR(1e3 * handing->host->wake_s, h["wake_ms"].get<double>(), 1e-12);
  EXPECT_NEAR(1e3 * handing->frontend->request_s, h["frontend_request_ms"].get<double>(), 1e-12);
  const json& c = load["schedule"]["instances"].begin().value();
  EXPECT_NEAR(c["simulated_as_live_hand_over"]["wake_ms"].get<double>(), h["wake_ms"].get<double>(),
              1e-9)
      << c;
  EXPECT_DOUBLE_EQ(c["simulated"]["wake_ms"].get<double>(), 0) << "no wake-up priced" << c;
  const json& m = load["metrics"]["ttft_ms.p50"];
  EXPECT_DOUBLE_EQ(
      m["error_as_live_hand_over_pct"].get<double>(),
      100 * (m["simulated_as_live_hand_over"].get<double>() / m["live"].get<double>() - 1))
      << m;
}

// Which steps each world ran, per instance: the one instance's live and simulated schedules,
// the simulated one read from the simulation's own step log, which holds every step it ran.
void ExpectSchedulesCompared(const json& load) {
  ASSERT_TRUE(load.contains("schedule")) << load;
  const json& instances = load["schedule"]["instances"];
  ASSERT_EQ(instances.size(), 1u) << instances;
  const json& c = instances.begin().value();
  EXPECT_EQ(c["simulated"]["steps"], load["steps"]["simulated_steps"]) << c;
  EXPECT_EQ(c["live_runs"].size(), load["repeats"].get<std::size_t>()) << c;
  EXPECT_EQ(c["live"]["steps"].get<double>(), load["steps"]["live_steps"].get<double>()) << c;
  // Every request completes in both worlds and makes all its tokens: the same decode tokens.
  EXPECT_EQ(c["live"]["decode_tokens"].get<double>(), c["simulated"]["decode_tokens"].get<double>())
      << c;
  for (const char* world : {"live", "simulated", "simulated_as_live"}) {
    // The first step of the run begins after an idle spell, and takes one request at least.
    EXPECT_GE(c[world]["after_idle_steps"].get<double>(), 1) << world << c;
    EXPECT_GE(c[world]["rows_per_step_after_idle"].get<double>(), 1) << world << c;
    EXPECT_GE(c[world]["decode_rows_per_token"].get<double>(), 1) << world << c;
  }
}

// The live steps' forward passes beside the profile's price for their shapes: recomputed here
// from the server's step log and the profile. Adds the decode bands it saw to `bands`.
void ExpectStepsAttributed(const json& load, const std::string& dir,
                           const models::StepProfile& profile, std::set<std::int64_t>* bands) {
  const models::StepFit& fit = profile.fits.at(0);
  const std::string step_log = dir + "/steps.jsonl";
  const json& s = load["steps"];
  std::int64_t steps = 0, prompt_tokens = 0;
  double forward_s = 0, priced_s = 0, iteration_s = 0, stream_s = 0, cpu_s = 0;
  std::vector<std::array<double, 3>> by_start;                 // start, forward, priced
  std::map<std::int64_t, std::array<double, 3>> decode_bands;  // rows_from: steps, forward, priced
  AfterPrices after(profile);
  double after_s = 0;
  std::ifstream in(step_log);
  for (std::string line; std::getline(in, line);) {
    const json doc = json::parse(line);
    auto shape = models::ParseStepShape(doc, step_log);
    ASSERT_TRUE(shape.ok()) << shape.error();
    ++steps;
    prompt_tokens += shape->PrefillTokens();
    forward_s += doc["seconds"].get<double>();
    cpu_s += doc["forward_cpu_s"].get<double>();  // every line has it
    iteration_s += doc["iteration_s"].get<double>();
    const double extra = after.Of(doc, *shape);
    after_s += extra;
    const double priced = models::FittedCostModel(fit).StepTime(*shape) + extra;
    priced_s += priced;
    if (shape->prefill.empty()) {  // decode only: bands 1, 2-3, 4-7, ...
      std::int64_t from = 1;
      while (2 * from <= shape->decode_tokens) from *= 2;
      auto& band = decode_bands[from];
      band[0] += 1;
      band[1] += doc["seconds"].get<double>();
      band[2] += priced;
    }
    by_start.push_back({doc["start_s"].get<double>(), doc["seconds"].get<double>(), priced});
    stream_s += doc["host"]["stream_s"].get<double>();
  }
  EXPECT_EQ(prompt_tokens, PromptTokens(dir + "/live/requests.csv")) << "each prefilled once";
  EXPECT_EQ(s["live_steps"], steps);
  std::int64_t class_steps = 0;
  for (const auto& [name, c] : s["classes"].items()) class_steps += c["steps"].get<std::int64_t>();
  EXPECT_EQ(class_steps, steps);
  EXPECT_NEAR(s["forward_s"].get<double>(), forward_s, 1e-9 * forward_s);
  EXPECT_NEAR(s["priced_s"].get<double>(), priced_s, 1e-9 * priced_s);
  EXPECT_NEAR(s["priced_error_pct"].get<double>(), 100 * (priced_s / forward_s - 1), 1e-6);
  // The profile prices steps after idle spells and right after other kinds of step (calibrate
  // timed them): the run's first step at least follows an idle spell.
  ASSERT_TRUE(profile.after_idle);
  ASSERT_TRUE(profile.after_step);
  EXPECT_GT(after_s, 0);
  EXPECT_NEAR(s.value("after_idle_s", 0.0) + s.value("after_step_s", 0.0), after_s, 1e-9);
  if (load["repeats"] == 1) {  // the one run's is the load's, overall and per class
    ASSERT_EQ(s["priced_error_pct_by_run"].size(), 1u) << s;
    EXPECT_NEAR(s["priced_error_pct_by_run"][0].get<double>(), s["priced_error_pct"].get<double>(),
                1e-9);
    for (const auto& [name, c] : s["classes"].items()) {
      ASSERT_EQ(c["priced_error_pct_by_run"].size(), 1u) << name << c;
      EXPECT_EQ(c["priced_error_pct_by_run"][0].is_number(), c["error_pct"].is_number()) << name;
      if (c["error_pct"].is_number()) {
        EXPECT_NEAR(c["priced_error_pct_by_run"][0].get<double>(), c["error_pct"].get<double>(),
                    1e-9)
            << name;
      }
    }
  }
  // The passes' time on a core, and the prices against it.
  EXPECT_EQ(s["on_cpu"]["steps"], steps) << s;
  EXPECT_NEAR(s["on_cpu"]["share"].get<double>(), cpu_s / forward_s, 1e-9) << s;
  EXPECT_NEAR(s["on_cpu"]["priced_error_pct"].get<double>(), 100 * (priced_s / cpu_s - 1), 1e-6);
  EXPECT_NEAR(s["outside_forward_ms_per_step"].get<double>(),
              1e3 * (iteration_s - forward_s) / static_cast<double>(steps), 1e-6);
  EXPECT_GT(s["simulated_steps"].get<std::int64_t>(), 0) << s;
  // Every live iteration logged its host time; the profile has no host fit, so none is priced.
  const json& host = s["host_per_step"];
  EXPECT_EQ(host["steps"], steps);
  EXPECT_NEAR(host["outside_forward_ms"].get<double>(),
              s["outside_forward_ms_per_step"].get<double>(), 1e-9);
  EXPECT_NEAR(host["stream_ms"].get<double>(), 1e3 * stream_s / static_cast<double>(steps), 1e-9);
  EXPECT_EQ(host["priced_ms"], 0.0);
  ASSERT_EQ(s["decode_by_rows"].size(), decode_bands.size()) << s;
  std::size_t i = 0;
  for (const auto& [from, band] : decode_bands) {
    const json& b = s["decode_by_rows"][i++];
    EXPECT_EQ(b["rows_from"], from);
    EXPECT_EQ(b["rows_to"], 2 * from - 1);
    EXPECT_EQ(b["steps"], band[0]);
    EXPECT_NEAR(b["error_pct"].get<double>(), 100 * (band[2] / band[1] - 1), 1e-6) << from;
    // The fit on the profile's own decode measurements of the band (the ladders reach 16 rows).
    const models::FittedCostModel model(fit);
    double measured = 0, fitted = 0;
    for (const models::StepMeasurement& m : profile.measurements) {
      if (!m.shape.prefill.empty() || m.shape.decode_tokens < from ||
          m.shape.decode_tokens >= 2 * from)
        continue;
      measured += m.Median();
      fitted += model.StepTime(m.shape);
    }
    ASSERT_GT(measured, 0) << "band " << from;
    EXPECT_NEAR(b["calibration"]["error_pct"].get<double>(), 100 * (fitted / measured - 1), 1e-6)
        << b;
  }
  for (const auto& [from, band] : decode_bands) bands->insert(from);
  // By quarter of the run, from the first step's start to the last's.
  ASSERT_FALSE(by_start.empty());
  const double first = by_start.front()[0], span = by_start.back()[0] - first;
  std::array<double, 4> forward{}, priced{};
  for (const auto& [start, f, p] : by_start) {
    const auto q = std::min<std::size_t>(3, static_cast<std::size_t>(4 * (start - first) / span));
    forward[q] += f;
    priced[q] += p;
  }
  ASSERT_EQ(s["priced_error_pct_by_quarter"].size(), 4u) << s;
  for (std::size_t q = 0; q < 4; ++q) {
    const json& e = s["priced_error_pct_by_quarter"][q];
    if (forward[q] == 0) {
      EXPECT_TRUE(e.is_null()) << q;
    } else {
      EXPECT_NEAR(e.get<double>(), 100 * (priced[q] / forward[q] - 1), 1e-6) << q;
    }
  }
  // The CPU the client and the server used: the server's includes every forward pass, run on
  // its engine thread (and the pool's), so it is at least their time less what preemption took;
  // the client's is its own, a share of the cores over the replay.
  const json& cpu = load["cpu"];
  EXPECT_GT(cpu["server_cpu_s"].get<double>(), 0.5 * forward_s) << cpu;
  EXPECT_GT(cpu["client_cpu_s"].get<double>(), 0) << cpu;
  EXPECT_NEAR(cpu["client_cores"].get<double>(),
              cpu["client_cpu_s"].get<double>() / cpu["replay_s"].get<double>(), 1e-9);
  EXPECT_LE(cpu["client_cores"].get<double>(), cpu["cores"].get<double>()) << cpu;
  // The whole machine over the servers' lives, which hold the replays: its busy time holds the
  // server's and the client's, to /proc/stat's tick (10 ms a core, each reading); the rest is
  // what other processes used, and the steal is a share of the cores' time.
  ASSERT_TRUE(cpu.contains("machine_busy_cpu_s")) << cpu;
  EXPECT_GE(cpu["serve_s"].get<double>(), cpu["replay_s"].get<double>()) << cpu;
  const double tick_slack = 2 * 0.01 * cpu["cores"].get<double>() * 3;  // up to 3 runs
  EXPECT_GE(cpu["machine_busy_cpu_s"].get<double>() + tick_slack,
            cpu["server_cpu_s"].get<double>() + cpu["client_cpu_s"].get<double>())
      << cpu;
  EXPECT_NEAR(
      cpu["other_cpu_s"].get<double>(),
      std::max(0.0, cpu["machine_busy_cpu_s"].get<double>() - cpu["server_cpu_s"].get<double>() -
                        cpu["client_cpu_s"].get<double>()),
      1e-9)
      << cpu;
  EXPECT_NEAR(cpu["steal_pct"].get<double>(),
              100 * cpu["steal_s"].get<double>() /
                  (cpu["serve_s"].get<double>() * cpu["cores"].get<double>()),
              1e-9);
  EXPECT_LE(cpu["steal_pct"].get<double>(), 100) << cpu;
}

// A load's timings of the machine against its calibration (validate_machine.h): before the first
// live run and after each, the profile's own one-chunk prefill and decode-only reference shapes,
// each beside the median calibration measured for it.
void ExpectMachineTimed(const json& load, const models::StepProfile& profile, int runs) {
  ASSERT_TRUE(load.contains("machine")) << load;
  const json& machine = load["machine"];
  ASSERT_EQ(machine["timings"].size(), static_cast<std::size_t>(runs + 1)) << machine;
  std::vector<double> values;
  std::map<std::string, std::vector<double>> each;  // each shape's readings
  for (const json& timing : machine["timings"]) {
    // A prefill pass, a batch of decode rows and one decode row (bound by memory bandwidth).
    ASSERT_EQ(timing["shapes"].size(), 3u) << timing;
    EXPECT_EQ(timing["shapes"][0]["name"].get<std::string>().rfind("prefill ", 0), 0u) << timing;
    EXPECT_EQ(timing["shapes"][1]["name"].get<std::string>().rfind("decode 8x", 0), 0u) << timing;
    EXPECT_EQ(timing["shapes"][2]["name"].get<std::string>().rfind("decode 1x", 0), 0u) << timing;
    double then = 0, now = 0;
    for (const json& shape : timing["shapes"]) {
      each[shape["name"].get<std::string>()].push_back(shape["slower_pct"].get<double>());
      auto parsed = models::ParseStepShape(shape["shape"], "shape");
      ASSERT_TRUE(parsed.ok()) << parsed.error();
      const auto m = std::find_if(
          profile.measurements.begin(), profile.measurements.end(), [&](const auto& x) {
            return models::StepShapeToJson(x.shape) == models::StepShapeToJson(*parsed);
          });
      ASSERT_NE(m, profile.measurements.end()) << shape;
      EXPECT_NEAR(shape["calibrated_ms"].get<double>(), 1e3 * m->Median(), 1e-9) << shape;
      then += shape["calibrated_ms"].get<double>();
      now += shape["now_ms"].get<double>();
    }
    EXPECT_NEAR(timing["slower_pct"].get<double>(), 100 * (now / then - 1), 1e-6) << timing;
    values.push_back(timing["slower_pct"].get<double>());
  }
  std::sort(values.begin(), values.end());
  EXPECT_EQ(machine["min_pct"].get<double>(), values.front());
  EXPECT_EQ(machine["max_pct"].get<double>(), values.back());
  ASSERT_EQ(machine["shapes"].size(), each.size()) << machine;
  for (const auto& [name, readings] : each)
    EXPECT_DOUBLE_EQ(machine["shapes"][name].get<double>(), policies::Summarize(readings).p50)
        << name;
}

// Instances side by side on a node: each live step's price split by whether the other
// instance's iterations ran beside it (the parts add up to the class), and the machine's
// reference shapes timed again each beside the other running on a second copy of the model.
void ExpectBesideOtherInstances(const json& load) {
  const json& steps = load["steps"];
  ASSERT_TRUE(steps.contains("beside_other_instances")) << steps;
  for (const auto& [name, c] : steps["beside_other_instances"].items()) {
    const json &alone = c["alone"], &beside = c["beside"], &all = steps["classes"][name];
    EXPECT_EQ(alone["steps"].get<std::int64_t>() + beside["steps"].get<std::int64_t>(),
              all["steps"].get<std::int64_t>())
        << name << c;
    EXPECT_NEAR(alone["forward_s"].get<double>() + beside["forward_s"].get<double>(),
                all["forward_s"].get<double>(), 1e-9)
        << name << c;
    if (beside["steps"].get<std::int64_t>() > 0) {
      EXPECT_GE(beside["overlap_share"].get<double>(), 0.5) << name << c;
      EXPECT_LE(beside["overlap_share"].get<double>(), 1 + 1e-9) << name << c;
    }
  }
  const json& machine = load["machine"];
  ASSERT_TRUE(machine.contains("beside")) << machine;
  std::vector<double> values;
  for (const json& timing : machine["timings"]) {
    const json& beside = timing["beside"];
    ASSERT_EQ(beside["shapes"].size(), 3u) << beside;
    double alone_ms = 0, beside_ms = 0;
    for (std::size_t i = 0; i < 3; ++i) {
      const json& shape = beside["shapes"][i];
      EXPECT_EQ(shape["name"], timing["shapes"][i]["name"]) << shape;
      // The prefill pass beside the batch of decode rows, each decode step beside the prefill.
      EXPECT_EQ(shape["neighbour"], timing["shapes"][i == 0 ? 1 : 0]["name"])
          << "one of the other kind" << shape;
      EXPECT_EQ(shape["alone_ms"], timing["shapes"][i]["now_ms"]) << shape;
      EXPECT_NEAR(shape["slower_pct"].get<double>(),
                  100 * (shape["beside_ms"].get<double>() / shape["alone_ms"].get<double>() - 1),
                  1e-9);
      alone_ms += shape["alone_ms"].get<double>();
      beside_ms += shape["beside_ms"].get<double>();
    }
    EXPECT_NEAR(beside["slower_pct"].get<double>(), 100 * (beside_ms / alone_ms - 1), 1e-9);
    values.push_back(beside["slower_pct"].get<double>());
  }
  EXPECT_EQ(machine["beside"]["min_pct"].get<double>(),
            *std::min_element(values.begin(), values.end()));
  EXPECT_EQ(machine["beside"]["shapes"].size(), 3u) << machine["beside"];
}

TEST_F(ValidateTest, ComparesALiveRunWithTheSimulationAtEachLoad) {
  const RunResult r = Validate({"--rate-scales", "0.5,2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(
      r.out, {"ttft_ms.p50", "tpot_ms.p99", "throughput.output_tokens_per_s", "rate x0.5",
              "rate x2", "steps at x0.5", "steps at x2", "outside its forward pass",
              "on a core at x0.5: the live forward passes' threads were on a core for ",
              "decode by batch rows 1 ", "(median step ", ", tail ", "cpu at x0.5", "cpu at x2",
              "as live at x0.5", "with the steps priced as they ran live", "wrote"}));
  EXPECT_TRUE(ContainsAll(r.out, {"own measurements of them at 1 ", "prefill by new tokens ",
                                  "by what ran before at x0.5: ", "at decode after decode "}));
  const json report = ReadJson(tmp_.File("out/validation.json"));
  EXPECT_EQ(report["profile"]["traffic"], "ladders");  // calibrated without a trace
  EXPECT_TRUE(ContainsAll(r.out, {"profile: the sweep's ladders, fitted to no trace; in "
                                  "stretches of its calibration the shapes took "}))
      << r;
  ASSERT_EQ(report["loads"].size(), 2u);
  for (const json& load : report["loads"]) {
    EXPECT_EQ(load["completed_live"], 12) << load;
    EXPECT_EQ(load["completed_simulated"], 12) << load;
    // Every request completes in both worlds, so each delivers the offered load: output
    // throughput agrees closely (both runs span the trace's arrivals plus the last reply) once
    // the steps are priced as they ran live: the plain error also holds the machine's speed
    // against its calibration's, which a sanitizer build beside other tests moves (26.9% once).
    const json& throughput = load["metrics"]["throughput.output_tokens_per_s"];
    EXPECT_LT(std::abs(throughput["error_as_live_pct"].get<double>()), 25) << throughput;
    const json& ttft = load["metrics"]["ttft_ms.p50"];
    EXPECT_GT(ttft["live"].get<double>(), 0) << ttft;
    EXPECT_GT(ttft["simulated"].get<double>(), 0) << ttft;
    EXPECT_DOUBLE_EQ(ttft["error_pct"].get<double>(),
                     100 * (ttft["simulated"].get<double>() / ttft["live"].get<double>() - 1));
    // TTFT's frontend part: measured by the server and reported through replay, priced by the
    // profile calibrate timed it into.
    const json& frontend = load["metrics"]["ttft_breakdown_ms.frontend.p50"];
    EXPECT_GT(frontend["live"].get<double>(), 0) << frontend;
    EXPECT_GT(frontend["simulated"].get<double>(), 0) << frontend;
    EXPECT_TRUE(load["metrics"]["ttft_breakdown_ms.queue.p50"]["live"].is_number()) << load;
    // Colocated: no KV transfer, so no TPOT after one in either world.
    EXPECT_TRUE(load["metrics"]["tpot_after_kv_transfer_ms.p50"]["live"].is_null()) << load;
    EXPECT_TRUE(load["metrics"]["tpot_after_kv_transfer_ms.p50"]["simulated"].is_null()) << load;
  }
  EXPECT_TRUE(
      ContainsAll(r.out, {"ttft_breakdown_ms.frontend.p50", "ttft_breakdown_ms.queue.p50"}));
  auto profile = models::LoadStepProfile(tmp_.File("profile.json"));
  ASSERT_TRUE(profile.ok()) << profile.error();
  for (const json& load : report["loads"]) {
    ExpectMachineTimed(load, *profile, 1);
    EXPECT_FALSE(load["machine"].contains("beside")) << "one instance: no neighbour to time";
    EXPECT_FALSE(load["steps"].contains("beside_other_instances")) << "one instance";
    EXPECT_FALSE(load.contains("at_live_send")) << "no request follows another";
  }
  EXPECT_TRUE(ContainsAll(r.out, {"machine at x0.5: the profile's own prefill ", "machine at x2"}));
  // Decode batches of two sizes at least, over both loads (how the bursts batch depends on the
  // machine's load: under CI's other tests the slower rate once ran them one size only).
  std::set<std::int64_t> bands;
  ExpectStepsAttributed(report["loads"][0], tmp_.File("out/rate-0.5"), *profile, &bands);
  ExpectStepsAttributed(report["loads"][1], tmp_.File("out/rate-2"), *profile, &bands);
  EXPECT_GE(bands.size(), 2u) << "batches of one size only: the bands go untested";
  ExpectSimulatedAsLive(report["loads"][0], tmp_.File("out/rate-0.5"), *profile);
  ExpectSimulatedAsLive(report["loads"][1], tmp_.File("out/rate-2"), *profile);
  for (const json& load : report["loads"]) ExpectSchedulesCompared(load);
  EXPECT_TRUE(ContainsAll(r.out, {"schedule at x0.5, ", "schedule at x2, "})) << r;
  ExpectHandedOverAsLive(report["loads"][0], tmp_.File("out/rate-0.5"));
  ExpectHandedOverAsLive(report["loads"][1], tmp_.File("out/rate-2"));
  EXPECT_TRUE(ContainsAll(r.out, {"as live, handing over as live at x0.5: besides, with an idle "
                                  "engine waking "}))
      << r;
  // The live and simulated runs' own files stay, with the server's logs.
  for (const char* file : {"out/rate-0.5/live/summary.json", "out/rate-0.5/sim/summary.json",
                           "out/rate-0.5/sim/steps.jsonl", "out/rate-2/serve.log",
                           "out/rate-2/replay.log", "out/rate-2/steps.jsonl"})
    EXPECT_TRUE(fs::exists(tmp_.File(file))) << file;
}

// engine.async_steps in both worlds: the live server plans ahead (its step log says so), the
// simulation prices the overlap, and the live host time per iteration is the phases' sum (the
// forward pass overlaps the iteration, whose time outside it says nothing of the host work).
TEST_F(ValidateTest, AsynchronousStepsAreValidatedInBothWorlds) {
  json cluster = ReadJson(tmp_.File("cluster.json"));
  cluster["engine"]["async_steps"] = true;
  tmp_.Write("cluster.json", cluster.dump());
  const RunResult r = Validate({"--rate-scales", "1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const json report = ReadJson(tmp_.File("out/validation.json"));
  const json& load = report["loads"][0];
  EXPECT_EQ(load["completed_live"], 12) << load;
  EXPECT_EQ(load["completed_simulated"], 12) << load;
  std::int64_t steps = 0;
  double phases_s = 0;
  std::ifstream in(tmp_.File("out/rate-1/steps.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json doc = json::parse(line);
    EXPECT_EQ(doc.value("async", false), true) << line;
    ++steps;
    for (const std::string_view phase : models::kHostPhaseNames)
      phases_s += doc["host"][std::string(phase) + "_s"].get<double>();
  }
  ASSERT_GT(steps, 0);
  const json& host = load["steps"]["host_per_step"];
  EXPECT_EQ(host["steps"], steps);
  EXPECT_NEAR(host["outside_forward_ms"].get<double>(), 1e3 * phases_s / static_cast<double>(steps),
              1e-9);
  EXPECT_NEAR(host["other_ms"].get<double>(), 0, 1e-9);
  EXPECT_TRUE(load["steps"]["outside_forward_ms_per_step"].is_null()) << load["steps"];
  EXPECT_TRUE(ContainsAll(r.out, {"the forward passes overlap their iterations"})) << r;
}

// PD: a prefill and a decode instance on one node's two devices, KV between them over the link
// `duet calibrate --transport loopback` fitted. The live KV transfers (from the replies' duet
// field) and the simulated ones move the same bytes, and their times are compared.
TEST_F(ValidateTest, ComparesKvTransfersOnAPdCluster) {
  const RunResult calibrated =
      RunDuet({"calibrate", "--model", tmp_.File("model"), "--out", tmp_.File("profile.json"),
               "--repeats", "2", "--transport", "loopback"});
  ASSERT_EQ(calibrated.exit_code, 0) << calibrated;
  // Decode split at 2 rows (the same pieces on both sides, as if a kernel changed there), so
  // that the simulation with the steps priced as they ran live scales the two sides apart.
  json doc = ReadJson(tmp_.File("profile.json"));
  doc["fits"][0]["split"] = {
      {"decode", {{"rows", 2}, {"pieces", doc["fits"][0]["pieces"]["decode"]}}}};
  // And a host fit of 2 ms a step (far more than the test model's steps take), so that the
  // simulation without it, which validate runs beside, differs by it.
  doc["host"] = {
      {"seconds_per", {{"step", 2e-3}, {"row", 0}, {"admitted", 0}, {"finished", 0}, {"token", 0}}},
      {"steps", 100}};
  // The link's latency, which carries the simulated KvReady message, at 10 us: the intercept
  // fitted to a memcpy's transfers can fall below the summary's 0.001 ms, and the message part
  // would read 0 there (a clean-clone CI run on 2026-12-01).
  ASSERT_EQ(doc["links"].size(), 1u) << doc["links"];
  doc["links"][0]["latency_us"] = 10;
  tmp_.Write("profile.json", doc.dump());
  json cluster = ReadJson(tmp_.File("cluster.json"));
  cluster["nodes"][0]["gpus"] = 2;
  cluster["nodes"][0]["nvlink"] = {{"fitted", "loopback"}};
  cluster["instances"] = {{{"role", "prefill"}, {"node", 0}}, {{"role", "decode"}, {"node", 0}}};
  tmp_.Write("cluster.json", cluster.dump());
  // Outputs from one token: one request's prefill makes its only token, so it has no KV transfer
  // (an empty kv_transfer_ms in both worlds' requests.csv); the other 11 have one.
  tmp_.Write("trace.json", R"({"num_requests": 12, "seed": 6, "block_tokens": 16,
      "arrival": {"process": "gamma", "rate_per_s": 20, "cv": 4},
      "input": {"dist": "uniform", "min": 16, "max": 96},
      "output": {"dist": "uniform", "min": 1, "max": 16}})");
  const RunResult r = Validate({"--rate-scales", "1", "--tolerance", "kv_transfer=1e6"},
                               "--workers thread --kv-transport loopback --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"kv_transfer_ms.mean", "kv_transfer_ms.p99",
                                  "beside other instances at x1: the cost model prices the live "
                                  "steps that ran alone",
                                  "machine beside another instance at x1: "}))
      << r;
  const json live = ReadJson(tmp_.File("out/rate-1/live/summary.json"));
  const json sim = ReadJson(tmp_.File("out/rate-1/sim/summary.json"));
  EXPECT_EQ(live["kv_transfer"]["transfers"], 11) << live["kv_transfer"];  // all but one decode
  EXPECT_EQ(live["kv_transfer"]["transfers"], sim["kv_transfer"]["transfers"]);
  EXPECT_EQ(live["kv_transfer"]["bytes"], sim["kv_transfer"]["bytes"]);
  const json report = ReadJson(tmp_.File("out/validation.json"));
  for (const char* stat : {"mean", "p50", "p99"}) {
    const json& m = report["loads"][0]["metrics"][std::string("kv_transfer_ms.") + stat];
    EXPECT_EQ(m["live"], live["kv_transfer"]["time_ms"][stat]) << m;
    EXPECT_GT(m["live"].get<double>(), 0) << m;
    EXPECT_GT(m["simulated"].get<double>(), 0) << m;
    EXPECT_TRUE(m["within"].get<bool>()) << m;  // --tolerance kv_transfer applies to all three
  }
  // TPOT after the KV transfer, each world's from its own requests.csv: every request's time per
  // token once its KV arrived, (E2E - TTFT - transfer) / (tokens - 1), below its TPOT.
  for (const auto& [world, key] : {std::pair{"live", "live"}, std::pair{"sim", "simulated"}}) {
    const Csv csv = Csv::Read(tmp_.File(std::string("out/rate-1/") + world + "/requests.csv"));
    std::vector<double> per_token;
    int one_token = 0;
    for (std::size_t i = 0; i < csv.size(); ++i) {
      const double tokens = std::stod(csv.Get(i, "output_tokens"));
      ASSERT_EQ(csv.Get(i, "status"), "completed") << world << " request " << i;
      if (tokens < 2) {
        EXPECT_EQ(csv.Get(i, "kv_transfer_ms"), "") << world << " request " << i;
        ++one_token;
        continue;
      }
      per_token.push_back((std::stod(csv.Get(i, "e2e_ms")) - std::stod(csv.Get(i, "ttft_ms")) -
                           std::stod(csv.Get(i, "kv_transfer_ms"))) /
                          (tokens - 1));
    }
    EXPECT_EQ(one_token, 1) << world;
    ASSERT_EQ(per_token.size(), 11u) << world;
    const policies::Distribution d = policies::Summarize(per_token);
    const json& metrics = report["loads"][0]["metrics"];
    EXPECT_NEAR(metrics["tpot_after_kv_transfer_ms.p50"][key].get<double>(), d.p50, 1e-9) << world;
    EXPECT_NEAR(metrics["tpot_after_kv_transfer_ms.p99"][key].get<double>(), d.p99, 1e-9) << world;
    EXPECT_LT(d.p50, metrics["tpot_ms.p50"][key].get<double>()) << world;
  }
  EXPECT_TRUE(ContainsAll(r.out, {"tpot_after_kv_transfer_ms.p50"})) << r;
  // The transfer's parts in both worlds (the KvReady message, the wait on the decode instance
  // for the pull to start, the pull): each request's add up to its transfer, to the columns'
  // rounding, and the report compares each world's.
  for (const auto& [world, key] : {std::pair{"live", "live"}, std::pair{"sim", "simulated"}}) {
    const Csv csv = Csv::Read(tmp_.File(std::string("out/rate-1/") + world + "/requests.csv"));
    for (std::size_t i = 0; i < csv.size(); ++i) {
      if (csv.Get(i, "kv_transfer_ms").empty()) {
        EXPECT_EQ(csv.Get(i, "kv_pull_ms"), "") << world << " request " << i;
        continue;
      }
      EXPECT_NEAR(csv.Number(i, "kv_message_ms") + csv.Number(i, "kv_wait_ms") +
                      csv.Number(i, "kv_pull_ms"),
                  csv.Number(i, "kv_transfer_ms"), 0.003)
          << world << " request " << i;
    }
    const json& metrics = report["loads"][0]["metrics"];
    for (const char* part : {"message", "pull"})
      EXPECT_GT(metrics[std::string("kv_transfer_parts_ms.") + part + ".p50"][key].get<double>(), 0)
          << world << " " << part;
    EXPECT_TRUE(metrics["kv_transfer_parts_ms.wait.p99"][key].is_number()) << world;
  }
  auto profile = models::LoadStepProfile(tmp_.File("profile.json"));
  ASSERT_TRUE(profile.ok()) << profile.error();
  ExpectSimulatedAsLive(report["loads"][0], tmp_.File("out/rate-1"), *profile);
  ExpectBesideOtherInstances(report["loads"][0]);
  EXPECT_TRUE(report["loads"][0]["as_live"]["scales"].contains("decode above split"))
      << "no decode batch of 2 rows or more: the split goes untested";
  // The host time priced: every live iteration at 2 ms, and the simulation without it, whose
  // requests end sooner by at least the 2 ms of their last step.
  const json& host = report["loads"][0]["steps"]["host_per_step"];
  EXPECT_NEAR(host["priced_ms"].get<double>(), 2.0, 1e-9) << host;
  ASSERT_TRUE(fs::exists(tmp_.File("out/rate-1/sim-no-host/summary.json")));
  auto no_host = models::LoadStepProfile(tmp_.File("out/rate-1/profile-no-host.json"));
  ASSERT_TRUE(no_host.ok()) << no_host.error();
  EXPECT_FALSE(no_host->host);
  EXPECT_TRUE(ContainsAll(r.out, {"without host time at x1: the simulation's errors are"}));
  for (const char* name : {"ttft_ms.p50", "e2e_ms.p50"}) {
    const json& m = report["loads"][0]["metrics"][name];
    EXPECT_GT(m["simulated"].get<double>(), m["simulated_without_host"].get<double>() + 2) << m;
    EXPECT_DOUBLE_EQ(
        m["error_without_host_pct"].get<double>(),
        100 * (m["simulated_without_host"].get<double>() / m["live"].get<double>() - 1));
  }
}

TEST_F(ValidateTest, AnErrorBeyondItsToleranceFailsTheRun) {
  // The tiny model's steps take microseconds and its live latency is the server's own: no
  // simulator comes within 0.01% of it.
  // The instance in a worker process of its own (duet serve's default with --cluster), which
  // appends its steps to the server's step log.
  const RunResult r =
      Validate({"--rate-scales", "1", "--tolerance", "p50=0.01,throughput=50"}, "--threads 1");
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_NE(r.err.find("an error exceeds its --tolerance"), std::string::npos) << r;
  const json report = ReadJson(tmp_.File("out/validation.json"));
  const json& m = report["loads"][0]["metrics"];
  EXPECT_FALSE(m["ttft_ms.p50"]["within"].get<bool>()) << m;
  EXPECT_EQ(m["ttft_ms.p50"]["tolerance_pct"], 0.01);
  EXPECT_TRUE(m["throughput.output_tokens_per_s"]["within"].get<bool>()) << m;
  EXPECT_FALSE(m["ttft_ms.mean"].contains("within")) << m;  // no tolerance given for it
  // The load against that goal: every held metric counted, every miss listed.
  const json& goal = report["loads"][0]["goal"];
  int held = 0, within = 0;
  std::set<std::string> missed, listed;
  for (const auto& [name, e] : m.items()) {
    if (!e.contains("within")) continue;
    ++held;
    if (e["within"].get<bool>())
      ++within;
    else
      missed.insert(name);
  }
  for (const json& miss : goal["missed"]) listed.insert(miss["metric"].get<std::string>());
  EXPECT_EQ(goal["held"], held);
  EXPECT_EQ(goal["within"], within);
  EXPECT_EQ(listed, missed);
  EXPECT_TRUE(ContainsAll(r.out, {"goal at x1: " + std::to_string(within) + " of " +
                                  std::to_string(held) + " held metrics within; missed "}))
      << r;
  auto profile = models::LoadStepProfile(tmp_.File("profile.json"));
  ASSERT_TRUE(profile.ok()) << profile.error();
  std::set<std::int64_t> bands;
  ExpectStepsAttributed(report["loads"][0], tmp_.File("out/rate-1"), *profile, &bands);
}

// A profile whose measurements say calibration found this machine 10 times slower than it is:
// the machine, timed beside each live run, reads about 90% faster than its calibration (the
// fits, and so the simulation, are the profile's as before).
TEST_F(ValidateTest, TimesTheMachineAgainstItsCalibrationBesideEveryRun) {
  json profile = ReadJson(tmp_.File("profile.json"));
  for (json& m : profile["measurements"])
    for (json& s : m["seconds"]) s = 10 * s.get<double>();
  tmp_.Write("profile.json", profile.dump());
  const RunResult r = Validate({"--rate-scales", "1", "--repeats", "2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const json report = ReadJson(tmp_.File("out/validation.json"));
  auto slow = models::LoadStepProfile(tmp_.File("profile.json"));
  ASSERT_TRUE(slow.ok()) << slow.error();
  ExpectMachineTimed(report["loads"][0], *slow, 2);
  const json& machine = report["loads"][0]["machine"];
  EXPECT_LT(machine["max_pct"].get<double>(), -50) << machine;
  EXPECT_TRUE(ContainsAll(r.out, {"machine at x1: ", "less time than at calibration"})) << r;
  // Simulated again at the machine's measured speed: each class's pieces (below and above a
  // split apart) scaled by what the reference shapes they price read (their time now over
  // calibration's, summed where two share pieces), the others by all of them together: about
  // ten times faster than the profile as it is.
  const json& at_speed = report["loads"][0]["at_machine_speed"];
  const double k = 1 + machine["slower_pct"].get<double>() / 100;
  EXPECT_NEAR(at_speed["scale"].get<double>(), k, 1e-12) << at_speed;
  const models::StepFit& fit = slow->fits.at(0);
  std::map<std::pair<std::size_t, bool>, std::pair<double, double>> read;  // then, now (ms)
  for (const json& shape : machine["timings"][0]["shapes"]) {
    auto parsed = models::ParseStepShape(shape["shape"], "shape");
    ASSERT_TRUE(parsed.ok()) << parsed.error();
    const models::StepFeatures f = models::FeaturesOf(*parsed);
    const auto c = static_cast<std::size_t>(models::ClassOf(f));
    const bool above =
        fit.split_rows[c] > 0 && f.tokens() >= static_cast<double>(fit.split_rows[c]);
    const double then = shape["calibrated_ms"].get<double>();
    read[{c, above}].first += then;
    read[{c, above}].second +=
        then * (1 + machine["shapes"][shape["name"].get<std::string>()].get<double>() / 100);
  }
  auto scaled = models::LoadStepProfile(tmp_.File("out/rate-1/profile-machine-speed.json"));
  ASSERT_TRUE(scaled.ok()) << scaled.error();
  const models::StepFit& fast = scaled->fits.at(0);
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    for (const bool above : {false, true}) {
      const auto it = read.find({c, above});
      const double want_k = it != read.end() ? it->second.second / it->second.first : k;
      const std::string name = std::string(models::ToString(static_cast<models::ShapeClass>(c))) +
                               (above ? " above split" : "");
      if (!above || fit.split_rows[c] > 0) {
        EXPECT_NEAR(at_speed["scales"][name].get<double>(), want_k, 1e-9) << name << at_speed;
      }
      const auto& pieces = above ? fast.pieces_above[c] : fast.pieces[c];
      const auto& original = above ? fit.pieces_above[c] : fit.pieces[c];
      ASSERT_EQ(pieces.size(), original.size()) << name;
      for (std::size_t p = 0; p < original.size(); ++p)
        for (std::size_t col = 0; col < models::kFitColumns; ++col) {
          const double want = want_k * original[p].seconds_per[col];
          EXPECT_NEAR(pieces[p].seconds_per[col], want, 1e-15 + 1e-9 * want) << name;
        }
    }
  }
  // The decode steps' pieces read by a decode reference shape, the prefill steps' by the prefill.
  EXPECT_NE(at_speed["by"].value("prefill", ""), "") << at_speed;
  EXPECT_GE(at_speed["by"].size(), 2u) << at_speed;
  const json& e2e = report["loads"][0]["metrics"]["e2e_ms.p50"];
  EXPECT_LT(e2e["simulated_at_machine_speed"].get<double>(), 0.5 * e2e["simulated"].get<double>())
      << e2e;
  EXPECT_DOUBLE_EQ(
      e2e["error_at_machine_speed_pct"].get<double>(),
      100 * (e2e["simulated_at_machine_speed"].get<double>() / e2e["live"].get<double>() - 1));
  EXPECT_TRUE(ContainsAll(r.out, {"at the machine's speed at x1: with the steps priced as the "
                                  "machine's reference steps read it (below), decode x0."}))
      << r;
}

// --tolerance-at live-speed: the tolerance holds the simulation with every step priced at the
// machine's speed during the live runs, timed by the live steps against calibration's own
// measurements (the live steps' time over the fits' price for them, times the fits' price for
// the measurements over what calibration measured; recomputed here from the step log and the
// profile), and not the plain simulation, whose errors the table shows unmarked. A profile whose
// measurements say calibration found this machine ten times slower reads the live runs about ten
// times faster.
TEST_F(ValidateTest, HoldsTheToleranceAtTheLiveRunsSpeedWhenAsked) {
  json doc = ReadJson(tmp_.File("profile.json"));
  for (json& m : doc["measurements"])
    for (json& s : m["seconds"]) s = 10 * s.get<double>();
  // The speed is the live steps' time less what the profile adds after idle spells and other
  // steps. The tiny model's steps take microseconds, and a two-repeat calibration's additions,
  // medians of differences, can be as large (one preemption), leaving no live time to time the
  // machine by (ValidateTest.RefusesTheLiveRunsSpeedWhereTheAdditionsLeaveNoTime): this test's
  // profile adds nothing.
  doc.erase("after_idle");
  doc.erase("after_step");
  tmp_.Write("profile.json", doc.dump());
  const RunResult r = Validate({"--rate-scales", "1", "--tolerance", "p50=0.01", "--tolerance-at",
                                "live-speed", "--report"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_NE(r.err.find("an error exceeds its --tolerance (marked !)"), std::string::npos) << r;
  const json report = ReadJson(tmp_.File("out/validation.json"));
  const json& load = report["loads"][0];
  auto profile = models::LoadStepProfile(tmp_.File("profile.json"));
  ASSERT_TRUE(profile.ok()) << profile.error();
  const models::FittedCostModel fit(profile->fits.at(0));
  double measured_s = 0, fits_s = 0, live_s = 0, priced_s = 0;
  for (const models::StepMeasurement& m : profile->measurements) {
    measured_s += m.Median();
    fits_s += fit.StepTime(m.shape);
  }
  // The live steps less what the profile adds for what ran before them, over the fits' price.
  AfterPrices after(*profile);
  std::ifstream in(tmp_.File("out/rate-1/steps.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json step = json::parse(line);
    auto shape = models::ParseStepShape(step, "steps.jsonl");
    ASSERT_TRUE(shape.ok()) << shape.error();
    live_s += step["seconds"].get<double>() - after.Of(step, *shape);
    priced_s += fit.StepTime(*shape);
  }
  const json& speed = load["at_live_speed"];
  EXPECT_NEAR(speed["live_over_priced"].get<double>(), live_s / priced_s, 1e-6 * live_s / priced_s);
  EXPECT_NEAR(speed["fits_over_measured"].get<double>(), fits_s / measured_s,
              1e-9 * fits_s / measured_s);
  const double k = speed["scale"].get<double>();
  EXPECT_NEAR(k, live_s / priced_s * fits_s / measured_s, 1e-6 * k) << speed;
  EXPECT_LT(speed["fits_over_measured"].get<double>(), 0.2) << "measurements 10 times slow";
  auto scaled = models::LoadStepProfile(tmp_.File("out/rate-1/profile-live-speed.json"));
  ASSERT_TRUE(scaled.ok()) << scaled.error();
  const models::FittedCostModel fast(scaled->fits.at(0));
  for (const models::StepMeasurement& m : profile->measurements)
    EXPECT_NEAR(fast.StepTime(m.shape), k * fit.StepTime(m.shape), 1e-9 * fit.StepTime(m.shape));
  // Every p50 is held at the live speed, none in the plain simulation; the plain table marks
  // nothing, the live-speed line marks each p50 beyond 0.01%.
  std::set<std::string> held;
  int missed = 0;
  for (const auto& [name, e] : load["metrics"].items()) {
    if (!e.contains("tolerance_at")) continue;
    held.insert(name);
    EXPECT_EQ(e["tolerance_at"], "error_at_live_speed_pct") << name << e;
    const double error = e["error_at_live_speed_pct"].get<double>();
    EXPECT_DOUBLE_EQ(
        error, 100 * (e["simulated_at_live_speed"].get<double>() / e["live"].get<double>() - 1))
        << name;
    EXPECT_EQ(e["within"].get<bool>(), std::abs(error) <= 0.01) << name << e;
    missed += !e["within"].get<bool>();
  }
  for (const char* name : {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50", "itl_ms.p50"})
    EXPECT_TRUE(held.count(name)) << name << load["metrics"];
  EXPECT_GE(missed, 1) << load["metrics"];
  // The machine's drift over the load (one run: the reference shapes' readings beside it, their
  // range over their median time) and the error it would make at the load's sensitivity: a
  // tolerance of 0.01% is below it wherever the metric moves with the steps.
  const json& machine = load["machine"];
  const json& sensitivity = load["sensitivity"];
  const double drift = 100 * (machine["max_pct"].get<double>() - machine["min_pct"].get<double>()) /
                       (100 + machine["slower_pct"].get<double>());
  EXPECT_NEAR(sensitivity["machine_spread_pct"].get<double>(), drift, 1e-9) << sensitivity;
  EXPECT_TRUE(sensitivity["step_speed_spread_pct"].is_null()) << "one run";
  EXPECT_NEAR(sensitivity["drift_pct"].get<double>(), drift, 1e-9) << sensitivity;
  int below = 0;
  for (const std::string& name : held) {
    const double from_drift = sensitivity["error_from_drift_pct"][name].get<double>();
    EXPECT_NEAR(from_drift,
                std::abs(sensitivity["change_pct"]["all"][name].get<double>()) / 5 * drift, 1e-9)
        << name;
    EXPECT_EQ(load["metrics"][name]["tolerance_below_drift"].get<bool>(), from_drift > 0.01)
        << name;
    below += from_drift > 0.01;
  }
  EXPECT_GE(below, 1) << sensitivity;
  EXPECT_FALSE(load["metrics"]["ttft_ms.p99"].contains("tolerance_below_drift")) << "not held";
  EXPECT_TRUE(ContainsAll(r.out, {"the tolerance is below that, so cannot tell a price error "
                                  "from the machine's drift, at "}))
      << r;
  EXPECT_TRUE(ContainsAll(r.out, {"at the live runs' speed at x1: with every step priced x",
                                  "the machine while it served against when it was calibrated"}))
      << r;
  const std::string table = r.out.substr(0, r.out.find("steps at x1"));
  EXPECT_EQ(table.find(" !"), std::string::npos) << "the plain errors are not held\n" << r;
  const std::string line = r.out.substr(r.out.find("at the live runs' speed at x1"));
  EXPECT_NE(line.substr(0, line.find('\n')).find(" !"), std::string::npos) << r;
  // The page marks them alike: not in the error table, in the live-speed column.
  const std::string page = ReadFile(tmp_.File("out/report.html"));
  EXPECT_EQ(page.find("class=\"miss\""), std::string::npos);
  EXPECT_NE(page.find("% !"), std::string::npos);
  EXPECT_NE(page.find("<p>Goal at x1: "), std::string::npos) << "the page states the goal";
}

// A profile that adds more after idle spells than the live steps took leaves no live time to
// time the machine by: --tolerance-at live-speed is refused, saying why, rather than holding the
// tolerance at a speed that is no measure.
TEST_F(ValidateTest, RefusesTheLiveRunsSpeedWhereTheAdditionsLeaveNoTime) {
  json doc = ReadJson(tmp_.File("profile.json"));
  ASSERT_TRUE(doc.contains("after_idle")) << "the fixture's calibration times idle spells";
  for (const char* key : {"prefill_s", "decode_s"})
    for (json& extra : doc["after_idle"][key]) extra = 10.0;  // far beyond the tiny model's steps
  doc.erase("after_step");
  tmp_.Write("profile.json", doc.dump());
  const RunResult r =
      Validate({"--rate-scales", "1", "--tolerance", "p50=50", "--tolerance-at", "live-speed"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(ContainsAll(
      r.err, {"--tolerance-at live-speed: rate scale 1: no live step time to "
              "time the machine by (the live forward passes took ",
              "of it what it adds after idle spells and other steps and beside other instances')"}))
      << r;
}

// --again: a changed profile simulated and reported against the live runs a previous validate
// left in OUT, with no server started: the live files and values stay as they were, what was
// measured beside the runs (the machine, CPU use) is kept, and the simulation is the new
// profile's. Live runs of another trace, selection, load or repeat count are refused.
TEST_F(ValidateTest, SimulatesAgainAgainstTheLiveRunsAlreadyInOut) {
  // A known price after idle spells: what the machine measured may be nothing (a busy machine's
  // steps are no slower after a spell), and the check below needs something to keep.
  {
    json doc = ReadJson(tmp_.File("profile.json"));
    ASSERT_TRUE(doc.contains("after_idle")) << "the fixture's calibration times idle spells";
    for (const char* key : {"prefill_s", "decode_s"})
      for (json& extra : doc["after_idle"][key]) extra = 1e-4;
    tmp_.Write("profile.json", doc.dump());
  }
  const RunResult first = Validate({"--rate-scales", "0.5,1", "--repeats", "2"});
  ASSERT_EQ(first.exit_code, 0) << first;
  const json before = ReadJson(tmp_.File("out/validation.json"));
  // The runs went round the loads (x0.5's first, x1's first, x0.5's second, x1's second), and
  // the machine's reference timed between two runs is the one after the first and the one before
  // the next: x1's first timing is x0.5's second.
  EXPECT_EQ(before["run_order"], "round the loads");
  std::vector<fs::file_time_type> ends;
  for (const char* run :
       {"out/rate-0.5/live", "out/rate-1/live", "out/rate-0.5/live-2", "out/rate-1/live-2"})
    ends.push_back(fs::last_write_time(tmp_.File(std::string(run) + "/summary.json")));
  for (std::size_t i = 1; i < ends.size(); ++i)
    EXPECT_LT(ends[i - 1], ends[i]) << "live run " << i + 1 << " of 4 ended before run " << i;
  ASSERT_EQ(before["loads"][0]["machine"]["timings"].size(), 3u) << before["loads"][0];
  EXPECT_EQ(before["loads"][1]["machine"]["timings"][0],
            before["loads"][0]["machine"]["timings"][1]);
  std::map<std::string, std::string> live_files;
  for (const char* file :
       {"out/rate-1/live/requests.csv", "out/rate-1/live-2/requests.csv", "out/rate-1/steps.jsonl",
        "out/rate-1/steps-2.jsonl", "out/rate-1/serve-2.log"})
    live_files[file] = ReadFile(tmp_.File(file));
  // The same calibration with every fitted coefficient doubled: every simulated step slower.
  json doc = ReadJson(tmp_.File("profile.json"));
  for (json& fit : doc["fits"]) {
    std::vector<json*> lists;
    for (auto& [name, pieces] : fit["pieces"].items()) lists.push_back(&pieces);
    if (fit.contains("split"))
      for (auto& [name, split] : fit["split"].items()) lists.push_back(&split["pieces"]);
    for (json* pieces : lists)
      for (json& piece : *pieces)
        for (auto& [key, value] : piece.items()) value = 2 * value.get<double>();
  }
  tmp_.Write("profile.json", doc.dump());

  const RunResult again = Validate({"--again", "--report"});
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_EQ(again.err.find("live run"), std::string::npos) << "no server started\n" << again;
  for (const auto& [file, text] : live_files)
    EXPECT_EQ(ReadFile(tmp_.File(file)), text) << file << " changed";
  const json after = ReadJson(tmp_.File("out/validation.json"));
  EXPECT_EQ(after["again"]["live_runs_from"], tmp_.File("out/validation.json")) << after["again"];
  EXPECT_EQ(after["run_order"], "round the loads") << "as the live runs went";
  ASSERT_EQ(after["loads"].size(), 2u) << "every recorded load";
  EXPECT_EQ(after["loads"][0]["rate_scale"], 0.5);
  const json &was = before["loads"][1], &is = after["loads"][1];
  EXPECT_EQ(is["rate_scale"], 1.0);
  EXPECT_EQ(is["repeats"], 2);
  EXPECT_EQ(is["cpu"], was["cpu"]);
  EXPECT_EQ(is["machine"], was["machine"]) << "read against the same calibration";
  EXPECT_EQ(is["steps"]["live_steps"], was["steps"]["live_steps"]);
  for (const char* name : {"ttft_ms.p50", "e2e_ms.p99", "tpot_ms.p50"}) {
    const json &a = was["metrics"][name], &b = is["metrics"][name];
    EXPECT_EQ(b["live"], a["live"]) << name;
    EXPECT_EQ(b["live_runs"], a["live_runs"]) << name;
    EXPECT_GT(b["simulated"].get<double>(), a["simulated"].get<double>()) << name << " x2 steps";
  }
  // The live steps priced by the doubled fits: twice the fits' price, the same live time and
  // the same after idle spells and other steps (the profile's after_idle and after_step as they
  // were).
  const double was_idle = was["steps"]["after_idle_s"].get<double>();
  const double was_added = was_idle + was["steps"].value("after_step_s", 0.0);
  EXPECT_GT(was_idle, 0);
  EXPECT_NEAR(is["steps"]["after_idle_s"].get<double>(), was_idle, 1e-12);
  EXPECT_NEAR(is["steps"].value("after_step_s", 0.0), was_added - was_idle, 1e-12);
  EXPECT_NEAR(is["steps"]["priced_s"].get<double>() - was_added,
              2 * (was["steps"]["priced_s"].get<double>() - was_added),
              1e-6 * was["steps"]["priced_s"].get<double>());
  EXPECT_EQ(is["steps"]["forward_s"], was["steps"]["forward_s"]);
  EXPECT_TRUE(fs::exists(tmp_.File("out/report.html")));
  EXPECT_EQ(after["again"]["machine"], "kept") << after["again"];

  // Another calibration of the machine (another source, as a sweep pooled with one after the
  // runs has) that timed every step twice as long: the same timings, read against its own
  // measurements of their shapes, read the machine twice as fast, and the load is simulated
  // again at that speed.
  json recalibrated = ReadJson(tmp_.File("profile.json"));
  recalibrated["source"]["date"] = "2026-12-03T00:00:00Z";
  for (json& m : recalibrated["measurements"]) {
    if (m["seconds"].is_number()) m["seconds"] = json::array({m["seconds"]});
    for (json& t : m["seconds"]) t = 2 * t.get<double>();
  }
  tmp_.Write("profile.json", recalibrated.dump());
  const RunResult reread = Validate({"--again"});
  ASSERT_EQ(reread.exit_code, 0) << reread;
  const json read = ReadJson(tmp_.File("out/validation.json"));
  EXPECT_EQ(read["again"]["machine"], "read against this profile's measurements of their shapes");
  EXPECT_FALSE(read.contains("machine_not_timed")) << read["machine_not_timed"];
  const json &timed = was["machine"], &now = read["loads"][1]["machine"];
  ASSERT_EQ(now["timings"].size(), timed["timings"].size()) << now;
  for (std::size_t t = 0; t < timed["timings"].size(); ++t)
    for (std::size_t i = 0; i < timed["timings"][t]["shapes"].size(); ++i) {
      const json &a = timed["timings"][t]["shapes"][i], &b = now["timings"][t]["shapes"][i];
      EXPECT_EQ(b["now_ms"], a["now_ms"]) << b;
      EXPECT_NEAR(b["calibrated_ms"].get<double>(), 2 * a["calibrated_ms"].get<double>(),
                  1e-9 * a["calibrated_ms"].get<double>())
          << b;
      EXPECT_NEAR(b["slower_pct"].get<double>(),
                  100 * (b["now_ms"].get<double>() / b["calibrated_ms"].get<double>() - 1), 1e-9)
          << b;
    }
  EXPECT_NEAR(now["slower_pct"].get<double>(),
              100 * ((1 + timed["slower_pct"].get<double>() / 100) / 2 - 1), 1.0)
      << "the median of the timings, each read twice as fast";
  EXPECT_TRUE(read["loads"][1]["metrics"]["ttft_ms.p50"].contains("simulated_at_machine_speed"))
      << read["loads"][1]["metrics"]["ttft_ms.p50"];
  // One measured on other threads, or without one of the timed shapes, cannot read them.
  json threads = recalibrated;
  threads["source"]["threads"] = 7;
  tmp_.Write("profile.json", threads.dump());
  const RunResult on_threads = Validate({"--again"});
  ASSERT_EQ(on_threads.exit_code, 0) << on_threads;
  json unread = ReadJson(tmp_.File("out/validation.json"));
  EXPECT_EQ(unread.value("machine_not_timed", ""),
            "the live runs' machine timings cannot be read against this profile: they were timed "
            "with the threads " +
                before["profile"]["source"]["threads"].dump() +
                " of their profile, this one was measured with 7");
  EXPECT_FALSE(unread["loads"][1].contains("machine")) << unread["loads"][1]["machine"];
  tmp_.Write("out/validation.json", read.dump());
  json fewer = recalibrated;
  fewer["source"]["date"] = "2026-12-04T00:00:00Z";  // not the calibration they were read against
  json& kept = fewer["measurements"];
  const json& first_timed = timed["timings"][0]["shapes"][0]["shape"];
  const std::size_t measured = kept.size();
  kept.erase(std::remove_if(kept.begin(), kept.end(),
                            [&](const json& m) {
                              return m["prefill"] == first_timed["prefill"] &&
                                     m["decode_tokens"] == first_timed["decode_tokens"] &&
                                     m["decode_context_tokens"] ==
                                         first_timed["decode_context_tokens"];
                            }),
             kept.end());
  ASSERT_LT(kept.size(), measured) << "the profile measured the shape the machine was timed on";
  tmp_.Write("profile.json", fewer.dump());
  const RunResult shapes_missing = Validate({"--again"});
  ASSERT_EQ(shapes_missing.exit_code, 0) << shapes_missing;
  unread = ReadJson(tmp_.File("out/validation.json"));
  EXPECT_NE(
      unread.value("machine_not_timed", "").find("has no measurement of their reference shape"),
      std::string::npos)
      << unread.value("machine_not_timed", "");
  tmp_.Write("out/validation.json", read.dump());

  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--repeats", "3"}, "the load at x0.5 has 2 live runs, not 3"},
      {{"--limit", "6"}, "its live runs replayed the selection []"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.push_back("--again");
    const RunResult r = Validate(args);
    EXPECT_EQ(r.exit_code, 2) << r;
    EXPECT_NE(r.err.find("--again: " + tmp_.File("out/validation.json") + ": "), std::string::npos)
        << r;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.message << "\n" << r;
  }
  const RunResult scales = Validate({"--again", "--rate-scales", "1"});
  EXPECT_EQ(scales.exit_code, 2) << scales;
  EXPECT_NE(scales.err.find("--again simulates every load recorded in OUT: give no --rate-scales"),
            std::string::npos)
      << scales;
  // What the runs measured beside them, kept and printed, is checked as it is read.
  const std::string report = ReadFile(tmp_.File("out/validation.json"));
  json broken = json::parse(report);
  broken["loads"][0]["cpu"]["cores"] = "two";
  tmp_.Write("out/validation.json", broken.dump());
  const RunResult cpu = Validate({"--again"});
  EXPECT_EQ(cpu.exit_code, 2) << cpu;
  EXPECT_NE(cpu.err.find("the load at x0.5: cpu: field 'cores'"), std::string::npos) << cpu;
  broken = json::parse(report);
  broken["loads"][0]["machine"]["timings"] = json::array();
  tmp_.Write("out/validation.json", broken.dump());
  const RunResult machine = Validate({"--again"});
  EXPECT_EQ(machine.exit_code, 2) << machine;
  EXPECT_NE(machine.err.find("machine: field 'timings'"), std::string::npos) << machine;
  broken = json::parse(report);
  broken["loads"][0]["machine"].erase("max_pct");
  tmp_.Write("out/validation.json", broken.dump());
  const RunResult range = Validate({"--again"});
  EXPECT_EQ(range.exit_code, 2) << range;
  EXPECT_NE(range.err.find("machine: field 'max_pct'"), std::string::npos) << range;
  // The readings each kind of step is priced at the machine's speed by.
  broken = json::parse(report);
  json& shapes = broken["loads"][0]["machine"]["shapes"];
  shapes[shapes.items().begin().key()] = "slow";
  tmp_.Write("out/validation.json", broken.dump());
  const RunResult shape = Validate({"--again"});
  EXPECT_EQ(shape.exit_code, 2) << shape;
  EXPECT_NE(shape.err.find("machine: shapes: field '"), std::string::npos) << shape;
  broken = json::parse(report);
  broken["loads"][0]["machine"]["timings"][0]["shapes"][0].erase("calibrated_ms");
  tmp_.Write("out/validation.json", broken.dump());
  const RunResult calibrated = Validate({"--again"});
  EXPECT_EQ(calibrated.exit_code, 2) << calibrated;
  EXPECT_NE(calibrated.err.find("timings[0].shapes[]: field 'calibrated_ms'"), std::string::npos)
      << calibrated;
  tmp_.Write("out/validation.json", report);
  // Another trace, and an OUT with no report.
  tmp_.Write("other.json", ReadFile(trace_));
  const RunResult other =
      RunDuet({"validate", "--cluster", tmp_.File("cluster.json"), "--model", tmp_.File("model"),
               "--trace", tmp_.File("other.json"), "--out", tmp_.File("out"), "--again"});
  EXPECT_EQ(other.exit_code, 2) << other;
  EXPECT_NE(other.err.find("its live runs replayed " + trace_), std::string::npos) << other;
  // A cluster file that plans the same KV blocks for another engine or other instances.
  struct Layout {
    std::string change;
    std::function<void(json&)> apply;
    std::string message;
  };
  const std::vector<Layout> layouts = {
      {"max_num_seqs", [](json& c) { c["engine"]["max_num_seqs"] = 4; },
       "its live servers ran the engine setting max_num_seqs = 8; the cluster file gives 4"},
      {"instances",
       [](json& c) {
         c["nodes"][0]["gpus"] = 2;
         c["instances"][0]["count"] = 2;
       },
       "its live servers ran the instances [{\"dp\":1,\"name\":\"c0\",\"node\":0,\"role\":"
       "\"colocated\",\"tp\":1}]; the cluster file plans [{"}};
  for (const Layout& l : layouts) {
    json cluster = ReadJson(tmp_.File("cluster.json"));
    l.apply(cluster);
    tmp_.Write("cluster-other.json", cluster.dump());
    const RunResult r =
        RunDuet({"validate", "--cluster", tmp_.File("cluster-other.json"), "--model",
                 tmp_.File("model"), "--trace", trace_, "--out", tmp_.File("out"), "--again"});
    EXPECT_EQ(r.exit_code, 2) << l.change << "\n" << r;
    EXPECT_NE(r.err.find(l.message), std::string::npos) << l.message << "\n" << r;
  }
  const RunResult none =
      RunDuet({"validate", "--cluster", tmp_.File("cluster.json"), "--model", tmp_.File("model"),
               "--trace", trace_, "--out", tmp_.File("nothing"), "--again"});
  EXPECT_EQ(none.exit_code, 2) << none;
  EXPECT_NE(none.err.find("--again: " + tmp_.File("nothing/validation.json")), std::string::npos)
      << none;
}

// Conversations (turns sent 20 ms after the reply before them): each world sends a later turn
// when its own reply ends, so the load is simulated again with every request sent when the first
// live run sent it, written as a Mooncake trace beside the run; a trace without dependencies
// (the other tests) is not. Length-scaled, the first turns' block ids (shared by no one) are
// dropped; shared ones at that scale cannot be written, and the report says so.
TEST_F(ValidateTest, ATraceOfSessionsIsSimulatedAgainAtTheLiveSendTimes) {
  json spec = {{"num_requests", 10},
               {"seed", 3},
               {"arrival", {{"process", "poisson"}, {"rate_per_s", 10.0}}},
               {"input", {{"dist", "uniform"}, {"min", 16}, {"max", 64}}},
               {"output", {{"dist", "uniform"}, {"min", 4}, {"max", 8}}},
               {"sessions",
                {{"turns", {{"dist", "uniform"}, {"min", 2}, {"max", 3}}},
                 {"new_tokens", {{"dist", "uniform"}, {"min", 8}, {"max", 16}}},
                 {"think_time_ms", {{"dist", "fixed"}, {"value", 20}}}}}};
  trace_ = tmp_.Write("sessions.json", spec.dump());
  RunResult r = Validate({"--rate-scales", "1", "--length-scale", "0.5", "--report"});
  ASSERT_EQ(r.exit_code, 0) << r;
  json report = ReadJson(tmp_.File("out/validation.json"));
  const json& load = report["loads"][0];
  ASSERT_TRUE(load.contains("at_live_send")) << load;
  // Both errors per metric, and on the page as "TTFT / TPOT / E2E" cells.
  const std::string page = ReadFile(tmp_.File("out/report.html"));
  for (const char* key : {"error_at_live_send_pct", "error_as_live_at_live_send_pct"}) {
    std::string cell;
    for (const char* name : {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"}) {
      const json& e = load["metrics"][name][key];
      ASSERT_TRUE(e.is_number()) << key << load["metrics"];
      char text[32];
      std::snprintf(text, sizeof text, "%+.1f%%", e.get<double>());
      cell += (cell.empty() ? "" : " / ") + std::string(text);
    }
    EXPECT_NE(page.find("<td>" + cell + "</td>"), std::string::npos) << key << " " << cell;
  }
  EXPECT_TRUE(ContainsAll(r.out, {"at live send times at x1: ", "as live at live send times"}));
  // The trace simulated: the live run's send times (to the millisecond), in their order; the
  // later turns still continue their parents.
  std::vector<double> sent;
  {
    std::ifstream csv(tmp_.File("out/rate-1/live/requests.csv"));
    std::string line;
    std::getline(csv, line);
    while (std::getline(csv, line))
      sent.push_back(1e3 * std::stod(line.substr(line.find(',') + 1)));
  }
  std::sort(sent.begin(), sent.end());
  std::ifstream written(tmp_.File("out/rate-1/trace-live-send.jsonl"));
  std::size_t lines = 0, continuations = 0;
  for (std::string line; std::getline(written, line); ++lines) {
    const json doc = json::parse(line);
    ASSERT_LT(lines, sent.size());
    EXPECT_NEAR(doc["timestamp"].get<double>(), sent[lines], 0.5) << line;
    EXPECT_FALSE(doc.contains("delay")) << line;
    EXPECT_TRUE(!doc.contains("hash_ids") || doc["hash_ids"].empty()) << line;
    continuations += doc.contains("parent");
  }
  EXPECT_EQ(lines, 10u);
  EXPECT_GE(continuations, 5u);  // 2 or 3 turns a conversation: at least half continue one

  spec["prefix"] = {{"groups", 1}, {"tokens", 128}};
  spec["block_tokens"] = 128;
  trace_ = tmp_.Write("shared.json", spec.dump());
  r = Validate({"--rate-scales", "1", "--length-scale", "0.5"});
  ASSERT_EQ(r.exit_code, 0) << r;
  report = ReadJson(tmp_.File("out/validation.json"));
  EXPECT_NE(report["loads"][0]["at_live_send"]["not_simulated"].get<std::string>().find(
                "share prefix blocks of 64 tokens"),
            std::string::npos)
      << report["loads"][0];
  EXPECT_TRUE(ContainsAll(r.out, {"at live send times at x1: not simulated"})) << r;
}

// Lines in a step log: one per live step.
std::int64_t StepLines(const std::string& path) {
  std::ifstream in(path);
  std::int64_t n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

// The first ten requests of the Mooncake trace (a burst at t = 0, prompts of 2k to 27k tokens)
// at 1/128 of their lengths, served twice: the live value is the runs' median, reported with
// their range, and each run's files stay.
TEST_F(ValidateTest, RepeatsTheLiveRunsOfAScaledRealTraceAndStatesTheirSpread) {
  trace_ = duet::testing::SharedTrace("mooncake_conversation.jsonl");
  // The profile says it was fitted to this very traffic (as `duet calibrate --trace` with the
  // same selection writes it): the report says so.
  json fitted_here = ReadJson(tmp_.File("profile.json"));
  fitted_here["source"]["trace"] = {
      {"path", trace_}, {"selection", {"--limit", "10", "--length-scale", "0.0078125"}}};
  tmp_.Write("profile.json", fitted_here.dump());
  const RunResult r = Validate({"--rate-scales", "1", "--repeats", "2", "--limit", "10",
                                "--length-scale", "0.0078125", "--report"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"rate x1: live [range], sim, error",
                                  "spread at x1: 2 live runs "
                                  "differ by ttft_ms.p50 "}))
      << r;
  const json report = ReadJson(tmp_.File("out/validation.json"));
  EXPECT_EQ(report["length_scale"], 0.0078125);
  EXPECT_EQ(report["profile"]["traffic"], "this");
  EXPECT_TRUE(ContainsAll(r.out, {"profile: fitted to this trace and selection"})) << r;
  EXPECT_EQ(report["trace_selection"], json({"--limit", "10", "--length-scale", "0.0078125"}));
  const json& load = report["loads"][0];
  EXPECT_EQ(load["repeats"], 2);
  EXPECT_EQ(load["completed_live"], 10);
  EXPECT_EQ(load["completed_simulated"], 10);
  int compared = 0;
  for (const auto& [name, m] : load["metrics"].items()) {
    if (!m["live"].is_number()) continue;
    ++compared;
    ASSERT_EQ(m["live_runs"].size(), 2u) << name << m;
    const double a = m["live_runs"][0].get<double>(), b = m["live_runs"][1].get<double>();
    EXPECT_NEAR(m["live"].get<double>(), (a + b) / 2, 1e-9) << name;  // the median of two
    EXPECT_EQ(m["live_min"].get<double>(), std::min(a, b)) << name;
    EXPECT_EQ(m["live_max"].get<double>(), std::max(a, b)) << name;
    const double sim = m["simulated"].get<double>();
    EXPECT_EQ(m["within_live_range"].get<bool>(), sim >= std::min(a, b) && sim <= std::max(a, b))
        << name;
    if (m["live"].get<double>() != 0) {
      EXPECT_NEAR(m["live_spread_pct"].get<double>(),
                  100 * std::abs(a - b) / m["live"].get<double>(), 1e-6)
          << name;
    }
  }
  EXPECT_GE(compared, 16);
  // The percentiles of TTFT, TPOT and E2E placed among both runs' requests, in the values' order.
  for (const char* name : {"ttft_ms.p50", "e2e_ms.p50", "ttft_ms.p99", "e2e_ms.p99"}) {
    const json& m = load["metrics"][name];
    const json& place = m["place_in_live"];
    EXPECT_EQ(place["requests"], 20) << name << m;
    ASSERT_EQ(place["live_runs"].size(), 2u) << name << m;
    const double sim = m["simulated"].get<double>();
    for (int k = 0; k < 2; ++k) {
      const double run = m["live_runs"][k].get<double>();
      const double at = place["live_runs"][k].get<double>(), sim_at = place["simulated"];
      if (sim < run) {
        EXPECT_LE(sim_at, at) << name << m;
      } else if (sim > run) {
        EXPECT_GE(sim_at, at) << name << m;
      }
    }
  }
  EXPECT_TRUE(
      ContainsAll(r.out, {"places at x1: each value's percentile", "tpot_ms.p50 simulated p"}))
      << r;
  EXPECT_NE(ReadFile(tmp_.File("out/report.html")).find("<p>Places at x1: "), std::string::npos);
  // Both worlds and both runs sent the same scaled prompts: 113,177 tokens at 1/128, rounded
  // request by request.
  const std::int64_t sent = PromptTokens(tmp_.File("out/rate-1/live/requests.csv"));
  EXPECT_EQ(PromptTokens(tmp_.File("out/rate-1/live-2/requests.csv")), sent);
  EXPECT_EQ(PromptTokens(tmp_.File("out/rate-1/sim/requests.csv")), sent);
  EXPECT_NEAR(static_cast<double>(sent), 113177.0 / 128, 5);
  // The steps of both runs are attributed, and those the profile prices beyond the shapes it
  // measured (here the burst's batched prefills) are counted per class.
  EXPECT_EQ(load["steps"]["live_steps"], StepLines(tmp_.File("out/rate-1/steps.jsonl")) +
                                             StepLines(tmp_.File("out/rate-1/steps-2.jsonl")));
  auto profile = models::LoadStepProfile(tmp_.File("profile.json"));
  ASSERT_TRUE(profile.ok()) << profile.error();
  std::array<std::array<double, models::kFitColumns>, models::kShapeClasses> measured{};
  for (const models::StepMeasurement& m : profile->measurements) {
    const auto f = models::FeaturesOf(m.shape);
    auto& max = measured[static_cast<std::size_t>(models::ClassOf(f))];
    const auto columns = models::FitColumns(f);
    for (std::size_t c = 0; c < columns.size(); ++c) max[c] = std::max(max[c], columns[c]);
  }
  std::array<std::int64_t, models::kShapeClasses> beyond{};
  for (const char* log : {"out/rate-1/steps.jsonl", "out/rate-1/steps-2.jsonl"}) {
    std::ifstream in(tmp_.File(log));
    for (std::string line; std::getline(in, line);) {
      auto shape = models::ParseStepShape(json::parse(line), log);
      ASSERT_TRUE(shape.ok()) << shape.error();
      const auto f = models::FeaturesOf(*shape);
      const auto k = static_cast<std::size_t>(models::ClassOf(f));
      const auto columns = models::FitColumns(f);
      bool out = false;
      for (std::size_t c = 0; c < columns.size(); ++c) out |= columns[c] > measured[k][c];
      beyond[k] += out;
    }
  }
  EXPECT_GT(beyond[0] + beyond[1] + beyond[2], 0) << "no step beyond the sweep: untested";
  for (std::size_t k = 0; k < models::kShapeClasses; ++k) {
    const json& c = load["steps"]["classes"][models::ToString(static_cast<models::ShapeClass>(k))];
    EXPECT_EQ(c.contains("beyond_sweep") ? c["beyond_sweep"]["steps"].get<std::int64_t>() : 0,
              beyond[k])
        << c;
  }
  for (const char* file : {"out/rate-1/serve-2.log", "out/rate-1/replay-2.log"})
    EXPECT_TRUE(fs::exists(tmp_.File(file))) << file;
  // Each run's steps priced apart: the runs' passes, each at its own error, make the load's.
  const json& by_run = load["steps"]["priced_error_pct_by_run"];
  ASSERT_EQ(by_run.size(), 2u) << load["steps"];
  double forward_s = 0, priced_s = 0;
  std::vector<double> speeds;  // each run's passes over their price
  for (int k = 0; k < 2; ++k) {
    double run_s = 0;
    std::ifstream in(tmp_.File(k == 0 ? "out/rate-1/steps.jsonl" : "out/rate-1/steps-2.jsonl"));
    for (std::string line; std::getline(in, line);)
      run_s += json::parse(line)["seconds"].get<double>();
    forward_s += run_s;
    priced_s += run_s * (1 + by_run[k].get<double>() / 100);
    speeds.push_back(100 / (100 + by_run[k].get<double>()));
  }
  EXPECT_NEAR(100 * (priced_s / forward_s - 1), load["steps"]["priced_error_pct"].get<double>(),
              1e-6);
  // The load's sensitivity to the step costs: every step 5% slower, and each class's that
  // priced live steps apart, simulated; each metric's change against the plain simulation.
  const json& sensitivity = load["sensitivity"];
  EXPECT_EQ(sensitivity["scale"], 1.05) << sensitivity;
  const json plain = ReadJson(tmp_.File("out/rate-1/sim/summary.json"));
  for (const char* steps : {"all", "prefill", "decode", "mixed"}) {
    const bool priced = std::string(steps) == "all" ||
                        load["steps"]["classes"][steps]["steps"].get<std::int64_t>() > 0;
    ASSERT_EQ(sensitivity["change_pct"].contains(steps), priced) << steps << sensitivity;
    if (!priced) continue;
    const json slower =
        ReadJson(tmp_.File("out/rate-1/sim-slower-" + std::string(steps) + "/summary.json"));
    for (const auto& [name, pointer] :
         {std::pair{"ttft_ms.p50", "/ttft_ms/p50"}, std::pair{"tpot_ms.p99", "/tpot_ms/p99"},
          std::pair{"e2e_ms.p50", "/e2e_ms/p50"}}) {
      const json::json_pointer at(pointer);
      EXPECT_NEAR(sensitivity["change_pct"][steps][name].get<double>(),
                  100 * (slower[at].get<double>() / plain[at].get<double>() - 1), 1e-9)
          << steps << " " << name;
    }
  }
  // One request at a time (x1, 10 requests), every step 5% slower makes each request's time up
  // to 5% longer: its steps' part of it.
  for (const char* name : {"ttft_ms.p50", "e2e_ms.p50"}) {
    const double change = sensitivity["change_pct"]["all"][name].get<double>();
    EXPECT_GT(change, 2) << name << sensitivity;
    EXPECT_LE(change, 5 + 1e-9) << name << sensitivity;
  }
  // What the runs' differences of speed would spread each metric over them, were they their
  // machine's, every step's alike.
  const double speed_spread = 100 * std::abs(speeds[0] - speeds[1]) / ((speeds[0] + speeds[1]) / 2);
  EXPECT_NEAR(sensitivity["step_speed_spread_pct"].get<double>(), speed_spread, 1e-9);
  EXPECT_NEAR(
      sensitivity["spread_from_step_speed_pct"]["e2e_ms.p50"].get<double>(),
      std::abs(sensitivity["change_pct"]["all"]["e2e_ms.p50"].get<double>()) / 5 * speed_spread,
      1e-9);
  // The machine's drift over the load: the larger of the runs' speed spread and the reference
  // shapes' beside them.
  const double machine_spread = sensitivity["machine_spread_pct"].is_number()
                                    ? sensitivity["machine_spread_pct"].get<double>()
                                    : 0;
  EXPECT_NEAR(sensitivity["drift_pct"].get<double>(), std::max(speed_spread, machine_spread), 1e-9);
  // Each class's steps of each run priced apart too: the runs' passes of the class, each at its
  // own error, make the class's.
  for (const char* name : {"prefill", "decode"}) {
    const json& c = load["steps"]["classes"][name];
    ASSERT_EQ(c["priced_error_pct_by_run"].size(), 2u) << name << c;
    for (const json& e : c["priced_error_pct_by_run"]) EXPECT_TRUE(e.is_number()) << name << c;
  }
  EXPECT_TRUE(ContainsAll(r.out, {"sensitivity at x1: with the steps priced x1.05, "})) << r;
  // The HTML report: per plot (TTFT, TPOT, E2E) a CDF of each live run and of the simulation,
  // from every completed request; the error table; nothing fetched from elsewhere.
  const std::string html = ReadFile(tmp_.File("out/report.html"));
  auto count = [&](const std::string& what) {
    std::size_t n = 0;
    for (auto at = html.find(what); at != std::string::npos; at = html.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<svg"), 3u);
  EXPECT_EQ(count("<polyline class=\"cdf\""), 9u);
  EXPECT_EQ(count("data-series=\"live run 2\" data-n=\"10\""), 2u);  // TTFT and E2E
  EXPECT_EQ(count("data-series=\"simulated\" data-n=\"10\""), 2u);
  EXPECT_EQ(count("<td class=\"m\">ttft_ms.p50</td>"), 1u);
  EXPECT_EQ(count("The cost model's profile: fitted to this trace and selection"), 1u);
  // Which steps ran: the one instance's live, simulated and as-live schedules at the one load.
  EXPECT_EQ(count("<h2>Which steps ran</h2>"), 1u);
  EXPECT_EQ(count("<p>Sensitivity at x1: with the steps priced x1.05, "), 1u);
  // The machine against its calibration, each reference shape's reading apart: the one-row
  // decode step's (bound by memory bandwidth) first.
  EXPECT_NE(html.find("% (decode 1x"), std::string::npos);
  // The steps by what ran before them, as stdout gives them.
  const std::string before = r.out.substr(r.out.find("by what ran before at x1: "));
  const std::string after = before.substr(0, before.find('\n'));
  ASSERT_NE(after.find(" at decode after "), std::string::npos) << r;
  EXPECT_EQ(count("<p>By what ran before at x1: "), 1u);
  EXPECT_EQ(count(after.substr(after.find(" at decode after ")) + ".</p>"), 1u) << after;
  for (const char* world : {"<td>live</td>", "<td>simulated</td>", "<td>simulated_as_live</td>"})
    EXPECT_EQ(count(world), 1u) << world;
  for (const char* external : {"<script", "src=", "href=", "@import"})
    EXPECT_EQ(count(external), 0u) << external;
  EXPECT_TRUE(ContainsAll(r.out, {"wrote " + tmp_.File("out/report.html")})) << r;
}

TEST_F(ValidateTest, BadFlagsAreUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--rate-scales", "0"}, 2, "--rate-scales: '0' is not a rate scale"},
      {{"--rate-scales", "1,x"}, 2, "--rate-scales: 'x'"},
      {{"--rate-scales", "1,1,1,1,1,1,1,1,1"}, 2, "give 1 to 8 rate scales"},
      {{"--tolerance", "p42=5"}, 2, "--tolerance: 'p42=5' is not METRIC=PERCENT"},
      {{"--tolerance", "p50=-1"}, 2, "a percentage >= 0"},
      {{"--rate-scale", "2"}, 2, "--rate-scale: validate sets it"},
      {{"--repeats", "0"}, 2, "--repeats: give 1 to 10 live runs per load, got 0"},
      {{"--length-scale", "0.3"}, 2, "--length-scale: length scale factor 0.3"},
      {{"--tolerance-at", "sim"}, 2, "--tolerance-at: plain or live-speed, got 'sim'"},
  };
  for (const Case& c : cases) {
    const RunResult r = Validate(c.args);
    EXPECT_EQ(r.exit_code, c.code) << r;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.message << "\n" << r;
    EXPECT_FALSE(fs::exists(tmp_.File("out/validation.json"))) << r;
  }
  const RunResult port = Validate({}, "--threads 1 --port 9");
  EXPECT_EQ(port.exit_code, 2) << port;
  EXPECT_NE(port.err.find("--serve-args: validate sets --port itself"), std::string::npos) << port;
  const RunResult log = Validate({}, "--step-log steps.jsonl");
  EXPECT_EQ(log.exit_code, 2) << log;
  EXPECT_NE(log.err.find("validate sets --step-log itself"), std::string::npos) << log;
  // The live speed is timed against a profile's measurements: a roofline has none.
  tmp_.Write("roofline.json", R"({
      "model": "./model",
      "nodes": [{"gpus": 1, "gpu": "tiny-gpu", "nic": {"bandwidth_GBps": 10, "latency_us": 1}}],
      "instances": [{"role": "colocated"}], "engine": {"max_num_seqs": 8, "reserved_gib": 0.25}})");
  const RunResult roofline =
      RunDuet({"validate", "--cluster", tmp_.File("roofline.json"), "--model", tmp_.File("model"),
               "--trace", trace_, "--out", tmp_.File("out"), "--tolerance-at", "live-speed"});
  EXPECT_EQ(roofline.exit_code, 2) << roofline;
  EXPECT_NE(roofline.err.find("--tolerance-at live-speed: the cluster file's cost model must be"),
            std::string::npos)
      << roofline;
  EXPECT_FALSE(fs::exists(tmp_.File("out/validation.json"))) << roofline;
  const RunResult missing = RunDuet({"validate", "--cluster", tmp_.File("none.json"), "--model",
                                     tmp_.File("model"), "--trace", tmp_.File("trace.json")});
  EXPECT_EQ(missing.exit_code, 1) << missing;
  EXPECT_NE(missing.err.find("none.json"), std::string::npos) << missing;
}

}  // namespace
}  // namespace duet::e2e
