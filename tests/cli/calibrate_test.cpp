// `duet calibrate` as a user runs it: the CPU backend's steps measured and fitted into a profile
// that `duet simulate` then prices steps with; measurements from elsewhere fitted the same way;
// and bad flags, files and profiles giving one clear error and a non-zero exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "backend/calibrate/step_sweep.h"
#include "models/step_profile.h"
#include "policies/step_log.h"
#include "tests/common/shared_traces.h"
#include "tests/sim/e2e_util.h"
#include "tests/sim/model_util.h"

namespace duet::e2e {
namespace {

namespace fs = std::filesystem;
using duet::testing::SharedTrace;
using nlohmann::json;

class CalibrateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = tmp_.File("model");
    const RunResult made = RunDuet({"make-test-model", "--out", model_});
    ASSERT_EQ(made.exit_code, 0) << made;
  }
  // tests/data/1p1d-tiny.json serving the test model, priced by `cost_model`; `colocated`: one
  // colocated instance instead.
  std::string Cluster(const json& cost_model, bool colocated = false) {
    json cluster = ReadJson(SourceDir() + "/tests/data/1p1d-tiny.json");
    cluster["model"] = model_;
    cluster["cost_model"] = cost_model;
    if (colocated) cluster["instances"] = {{{"role", "colocated"}, {"tp", 1}, {"node", 0}}};
    return tmp_.Write("cluster.json", cluster.dump());
  }

  TempDir tmp_;
  std::string model_;
};

TEST_F(CalibrateTest, MeasuresTheCpuBackendAndTheSimulatorRunsFromTheProfile) {
  const std::string profile_path = tmp_.File("profile.json");
  const RunResult r =
      RunDuet({"calibrate", "--model", model_, "--out", profile_path, "--repeats", "3"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"step shapes x 3 repeats on cpu", "held out of the fit",
                                  "prefill", "decode", "mixed", "wrote " + profile_path}));
  Result<models::StepProfile> profile = models::LoadStepProfile(profile_path);
  ASSERT_TRUE(profile.ok()) << profile.error();
  EXPECT_EQ(profile->device, "cpu");
  EXPECT_EQ(profile->model.hidden_size, 64);
  EXPECT_EQ(profile->source["tool"], "duet calibrate");
  EXPECT_EQ(profile->source["repeats"], 3);
  // The machine's drift over the sweep: each pass's quarters against the medians, kept and
  // their range printed.
  const auto passes = models::PassDeviationsPct(profile->measurements, 4);
  ASSERT_EQ(passes.size(), 3u);
  ASSERT_EQ(profile->source["passes_pct"].size(), 3u) << profile->source;
  for (std::size_t k = 0; k < passes.size(); ++k)
    for (std::size_t q = 0; q < 4; ++q)
      EXPECT_NEAR(profile->source["passes_pct"][k][q].get<double>(), passes[k][q], 0.05) << k;
  EXPECT_TRUE(ContainsAll(
      r.out, {"passes: in quarters of each pass, the shapes took ", "of their medians"}))
      << r;
  ASSERT_EQ(profile->fits.size(), 1u);
  // Every class measured, every 4th shape of each held out and its error reported.
  int held_out = 0;
  for (const models::StepMeasurement& m : profile->measurements) {
    EXPECT_EQ(m.seconds.size(), 3u);
    held_out += m.held_out;
  }
  EXPECT_GE(profile->measurements.size(), 24u);
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    EXPECT_GT(profile->fits[0].held_out[c].shapes, 0) << c;
    EXPECT_GT(profile->fits[0].training[c].shapes, 0) << c;
  }
  EXPECT_EQ(held_out, profile->fits[0].held_out[0].shapes + profile->fits[0].held_out[1].shapes +
                          profile->fits[0].held_out[2].shapes);
  // A step after each idle spell, timed and printed.
  ASSERT_TRUE(profile->after_idle);
  const models::AfterIdleFit& idle = *profile->after_idle;
  EXPECT_EQ(idle.idle_s,
            std::vector<Seconds>(backend::kIdleSpells.begin(), backend::kIdleSpells.end()));
  EXPECT_EQ(idle.prefill_s.size(), idle.idle_s.size());
  EXPECT_EQ(idle.repeats, 3);
  EXPECT_TRUE(ContainsAll(r.out, {"after idle: a prefill of ", " tokens took +",
                                  " ms after 1000 ms; a one-row decode step at "}))
      << r;
  // A step right after each other reference shape, timed and printed: decode steps of 1 and 8
  // rows, prefills of 64, 256 and 1,024 tokens up to --max-tokens.
  ASSERT_TRUE(profile->after_step);
  const models::ShapePairFit& after = *profile->after_step;
  EXPECT_EQ(after.decode_rows, (std::vector<Tokens>{1, 8}));
  EXPECT_FALSE(after.prefill_tokens.empty());
  EXPECT_EQ(after.extra_s.size(), after.decode_rows.size() + after.prefill_tokens.size());
  EXPECT_EQ(after.repeats, 3);
  EXPECT_TRUE(ContainsAll(r.out, {"after another step: ms beyond each in a run of itself",
                                  "\n  d1          -", "\n  d8 ", "\n  p64 "}))
      << r;

  // The simulator prices steps with it: a run whose times follow the profile, not the roofline.
  const std::string fitted = tmp_.File("fitted"), roofline = tmp_.File("roofline");
  const std::string trace = tmp_.Write(
      "trace.jsonl",
      "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 8, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 5000, \"input_length\": 60, \"output_length\": 8, \"hash_ids\": [2]}\n");
  Simulate(fitted, {"--cluster", Cluster({{"kind", "fitted"}, {"profile", profile_path}}),
                    "--trace", trace});
  Simulate(roofline, {"--cluster", Cluster({{"kind", "roofline"}}), "--trace", trace});
  const json a = ReadJson(fitted + "/summary.json"), b = ReadJson(roofline + "/summary.json");
  EXPECT_EQ(a["requests"]["completed"], 2);
  EXPECT_NE(a["ttft_ms"]["mean"], b["ttft_ms"]["mean"]);
  // A step after an idle spell of its instance (since its last step, or the start) is priced
  // with what the profile's after_idle says: the second request's prefill, nearly 5 s after the
  // first request ended, with what the longest spell took added; a step right after another with
  // what its after_step says after that one's shape: the first decode step after each prefill
  // (on one colocated instance).
  json doc = ReadJson(profile_path);
  doc["after_idle"] = {{"idle_s", {0.01, 1}},
                       {"prefill_s", {0.002, 0.02}},
                       {"decode_s", {0.001, 0.01}},
                       {"repeats", 1}};
  doc["after_step"] = {{"decode_rows", {1}},
                       {"prefill_tokens", {64}},
                       {"extra_s", {{0, 0.003}, {0.004, 0}}},
                       {"repeats", 1}};
  const std::string idle_profile = tmp_.Write("profile-idle.json", doc.dump());
  const std::string step_log = tmp_.File("steps.jsonl");
  Simulate(tmp_.File("after-idle"),
           {"--cluster", Cluster({{"kind", "fitted"}, {"profile", idle_profile}}, true), "--trace",
            trace, "--step-log", step_log});
  const models::FittedCostModel cost(
      profile->fits[0], std::nullopt,
      models::AfterIdleFit{{0.01, 1}, {0.002, 0.02}, {0.001, 0.01}, 1},
      models::ShapePairFit{{1}, {64}, {{0, 0.003}, {0.004, 0}}, 1, {}});
  std::map<int, std::pair<Seconds, models::StepShape>> last;  // by instance: its end, its shape
  int after_idle = 0, saturated = 0, after_prefill = 0;
  const Status read =
      policies::ReadStepLog(ReadFile(step_log), step_log, [&](const policies::StepLogLine& line) {
        const auto before = last.find(line.instance);
        const Seconds spell = line.start_s - (before == last.end() ? 0 : before->second.first);
        const bool idle = spell >= models::kIdleGap || before == last.end();
        const Seconds extra = idle ? cost.AfterIdle(line.step.shape, spell)
                                   : cost.AfterStep(line.step.shape, before->second.second);
        last[line.instance] = {line.start_s + line.iteration_s, line.step.shape};
        EXPECT_NEAR(line.step.seconds, cost.StepTime(line.step.shape) + extra, 1e-9) << spell;
        after_idle += idle;
        saturated += spell > 1 && !line.step.shape.prefill.empty() && extra == 0.02;
        after_prefill += !idle && line.step.shape.prefill.empty() && extra == 0.003;
      });
  ASSERT_TRUE(read.ok()) << read.message();
  EXPECT_GE(after_idle, 1);
  EXPECT_EQ(saturated, 1);
  EXPECT_EQ(after_prefill, 2);
}

// `--beside` times the reference shapes beside a second copy of the model running each of them
// on its own thread (one core each); the simulator adds what the profile's beside says to a step
// in proportion to its overlap with a step of another instance on its node, and nothing to
// instances on two nodes.
TEST_F(CalibrateTest, TimesStepsBesideAnotherInstanceAndTheSimulatorPricesThemOnOneNode) {
  const std::string profile_path = tmp_.File("profile.json");
  RunResult r = RunDuet({"calibrate", "--model", model_, "--out", profile_path, "--repeats", "2",
                         "--threads", "1", "--beside"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(
      ContainsAll(r.out, {"beside another instance: ms beyond each alone", "\n  p64 ", "(alone "}))
      << r;
  Result<models::StepProfile> profile = models::LoadStepProfile(profile_path);
  ASSERT_TRUE(profile.ok()) << profile.error();
  ASSERT_TRUE(profile->beside && profile->after_step);
  EXPECT_EQ(profile->beside->decode_rows, profile->after_step->decode_rows);
  EXPECT_EQ(profile->beside->prefill_tokens, profile->after_step->prefill_tokens);
  EXPECT_EQ(profile->beside->repeats, 2);
  const std::string all_cores = std::to_string(std::thread::hardware_concurrency());
  for (const RunResult& bad :
       {RunDuet({"calibrate", "--model", model_, "--out", profile_path, "--beside"}),
        RunDuet({"calibrate", "--model", model_, "--out", profile_path, "--beside", "--threads",
                 all_cores})}) {
    EXPECT_EQ(bad.exit_code, 2) << bad;
    EXPECT_TRUE(ContainsAll(bad.err, {"--beside: give --device cpu and --threads N"})) << bad;
  }

  // Known step times (whatever this build and machine measured), known extras, and nothing for
  // what ran before: a decode step 0.02 ms and half of it slower for all its length beside a
  // 64-token prefill (the decode instance's run for the first request), a prefill 0.02 ms and 7
  // us a token and half of it slower beside a one-row decode step (the second request's, and the
  // third's of 200 tokens, arriving while the first decodes: the 64-token one's share of their
  // own time).
  models::StepProfile known = *profile;
  models::StepFit& fit = known.fits[0];
  fit.split_rows = {};
  fit.pieces_above = {};
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
    models::AffinePiece piece;
    piece.seconds_per[0] = 2e-5;  // a step
    piece.seconds_per[2] = 7e-6;  // a prefill token
    fit.pieces[c] = {piece};
  }
  known.after_idle.reset();
  known.after_step.reset();
  known.beside = models::ShapePairFit{{1}, {64}, {{1e-6, 1e-5}, {3e-4, 2e-6}}, 1, {2e-5, 6e-4}};
  const std::string beside_profile =
      tmp_.Write("profile-beside.json", models::FormatStepProfile(known));
  const std::string trace = tmp_.Write(
      "trace.jsonl",
      "{\"timestamp\": 0, \"input_length\": 20, \"output_length\": 200, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 1, \"input_length\": 20, \"output_length\": 2, \"hash_ids\": [3]}\n"
      "{\"timestamp\": 1.1, \"input_length\": 200, \"output_length\": 2, \"hash_ids\": [2]}\n");
  json cluster = ReadJson(SourceDir() + "/tests/data/1p1d-tiny.json");
  cluster["model"] = model_;
  cluster["cost_model"] = {{"kind", "fitted"}, {"profile", beside_profile}};
  const std::string apart = tmp_.Write("apart.json", cluster.dump());
  cluster["nodes"][0]["count"] = 1;
  cluster["nodes"][0]["gpus"] = 2;
  cluster["instances"][1]["node"] = 0;
  const std::string together = tmp_.Write("together.json", cluster.dump());
  const models::FittedCostModel cost(fit);
  struct Priced {
    Seconds start_s, iteration_s, alone_s, extra_s;  // extra: beyond its price alone
    bool prefill;
  };
  auto steps = [&](const std::string& cluster_path, const std::string& name) {
    const std::string step_log = tmp_.File(name + ".jsonl");
    Simulate(tmp_.File(name),
             {"--cluster", cluster_path, "--trace", trace, "--step-log", step_log});
    std::map<int, std::vector<Priced>> out;  // by instance
    const Status read =
        policies::ReadStepLog(ReadFile(step_log), step_log, [&](const policies::StepLogLine& l) {
          const Seconds alone = cost.StepTime(l.step.shape);
          out[l.instance].push_back({l.start_s, l.iteration_s, alone, l.step.seconds - alone,
                                     !l.step.shape.prefill.empty()});
        });
    EXPECT_TRUE(read.ok()) << read.message();
    return out;
  };
  for (const auto& [instance, priced] : steps(apart, "apart"))
    for (const Priced& p : priced) EXPECT_NEAR(p.extra_s, 0, 1e-12) << instance;
  const auto beside = steps(together, "together");
  ASSERT_EQ(beside.size(), 2u);
  // The prefill instance's three prefills: the first alone (the decode instance idle), the
  // others beside the decode run all their length, each its full extra once: the third's although
  // the second's KV cut the run short while it ran, and another began.
  const std::vector<Priced>& prefills = beside.at(0);
  ASSERT_EQ(prefills.size(), 3u);
  EXPECT_NEAR(prefills[0].extra_s, 0, 1e-12);
  EXPECT_NEAR(prefills[1].extra_s, 0.5 * prefills[1].alone_s, 1e-12);
  EXPECT_NEAR(prefills[2].extra_s, 0.5 * prefills[2].alone_s, 1e-12);
  EXPECT_NEAR(prefills[2].alone_s, 2e-5 + 200 * 7e-6, 1e-12);
  // The decode steps beside them run at alone / (alone + 0.01 ms) of their pace while they run:
  // each takes 0.01 ms more for each alone + 0.01 ms of it a prefill overlapped (those inside
  // one the full 0.01 ms, those cut in part less), the rest nothing.
  int whole = 0;
  for (const Priced& p : beside.at(1)) {
    ASSERT_FALSE(p.prefill);
    Seconds overlap = 0;
    for (const Priced& w : prefills)
      overlap += std::max(0.0, std::min(w.start_s + w.iteration_s, p.start_s + p.iteration_s) -
                                   std::max(w.start_s, p.start_s));
    const Seconds alone = p.iteration_s - p.extra_s;
    EXPECT_NEAR(p.extra_s, overlap * 1e-5 / (alone + 1e-5), 1e-12) << p.start_s;
    whole += std::abs(p.extra_s - 1e-5) < 1e-12;
  }
  EXPECT_GE(whole, 10);
}

// `--transport loopback` times KV transfers between two instances and fits a link; a cluster
// whose node names it ("nvlink": {"fitted": "loopback"}) moves a PD request's KV in the time
// the fitted latency and bandwidth give; naming it where it cannot apply is an error.
TEST_F(CalibrateTest, TimesKvTransfersAndTheSimulatorMovesKvOverTheFittedLink) {
  const std::string profile_path = tmp_.File("profile.json");
  RunResult r = RunDuet({"calibrate", "--model", model_, "--out", profile_path, "--repeats", "2",
                         "--transport", "loopback"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(
      ContainsAll(r.out, {"transport loopback (loopback): latency", "held out of the fit"}));
  Result<models::StepProfile> profile = models::LoadStepProfile(profile_path);
  ASSERT_TRUE(profile.ok()) << profile.error();
  ASSERT_EQ(profile->links.size(), 1u);
  const models::LinkFit& link = profile->links[0];
  EXPECT_EQ(link.transport, "loopback");
  EXPECT_EQ(link.path, "loopback");
  // Whole blocks, 1 to the blocks of the longest context, smallest first, each timed at least 9
  // times (microseconds each: a median of 2 tips over); the errors reported are the fit's on
  // these very measurements.
  ASSERT_GE(link.measurements.size(), 5u);
  const Bytes block = link.measurements[0].bytes;
  std::vector<double> held, training;
  for (std::size_t i = 0; i < link.measurements.size(); ++i) {
    const models::TransferMeasurement& m = link.measurements[i];
    EXPECT_EQ(m.bytes % block, 0) << i;
    if (i > 0) {
      EXPECT_GT(m.bytes, link.measurements[i - 1].bytes) << i;
    }
    EXPECT_EQ(m.seconds.size(), 9u) << i;
    (m.held_out ? held : training).push_back(std::abs(link.Time(m.bytes) / m.Median() - 1) * 100);
  }
  ASSERT_FALSE(held.empty());
  EXPECT_EQ(link.held_out.shapes, static_cast<int>(held.size()));
  EXPECT_NEAR(link.held_out.max_pct, *std::max_element(held.begin(), held.end()), 1e-6);
  EXPECT_NEAR(link.training.max_pct, *std::max_element(training.begin(), training.end()), 1e-6);

  // A slow link in its place, so that the KV transfer's time stands out; one node, the two
  // instances on its two devices, whose path the fit describes.
  json doc = ReadJson(profile_path);
  doc["links"][0]["latency_us"] = 3000;
  doc["links"][0]["bandwidth_GBps"] = 0.02;
  const std::string slow = tmp_.Write("slow.json", doc.dump());
  json cluster = ReadJson(SourceDir() + "/tests/data/1p1d-tiny.json");
  cluster["model"] = model_;
  cluster["cost_model"] = {{"kind", "fitted"}, {"profile", slow}};
  cluster["nodes"][0]["count"] = 1;
  cluster["nodes"][0]["gpus"] = 2;
  cluster["nodes"][0]["nvlink"] = {{"fitted", "loopback"}};
  cluster["instances"][1]["node"] = 0;
  const Tokens input = 200;
  const std::string trace = tmp_.Write(
      "one.jsonl",
      json{{"timestamp", 0}, {"input_length", input}, {"output_length", 4}, {"hash_ids", {1}}}
          .dump());
  const std::string out = tmp_.File("out");
  Simulate(out, {"--cluster", tmp_.Write("fitted-link.json", cluster.dump()), "--trace", trace});
  // The prefill instance's KvReady message, then the KV, each over the two NVLink hops of half
  // the fitted latency each.
  Result<models::ModelSpec> model = models::LoadModelSpec(model_);
  ASSERT_TRUE(model.ok()) << model.error();
  const double kv_bytes = static_cast<double>(input * model->KvBytesPerToken());
  const Link hop{0.02e9, 1.5e-3};
  const double kv_s =
      MessageSeconds(kControlMessageBytes, {hop, hop}) + MessageSeconds(kv_bytes, {hop, hop});
  ASSERT_GT(kv_bytes / 0.02e9, 0.005) << "the bytes' share must stand out too";
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 1u);
  EXPECT_NEAR(csv.Number(0, "kv_transfer_ms"), kv_s * 1e3, kCsvTolMs);

  // Errors name the node's link and what is wrong.
  struct Case {
    std::function<void(json&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](json& c) {
         c["cost_model"] = {{"kind", "roofline"}};
       },
       "nodes[0].nvlink: field 'fitted' needs cost_model kind 'fitted'"},
      {[](json& c) { c["nodes"][0]["nvlink"]["fitted"] = "ucx"; },
       "has no link for transport 'ucx' (it has loopback)"},
      {[](json& c) { c["nodes"][0]["nvlink"]["latency_us"] = 1; },
       "nodes[0].nvlink: field 'fitted' excludes bandwidth_GBps and latency_us"},
      {[](json& c) {
         c["nodes"][0]["nic"] = {{"fitted", "loopback"}};
       },
       "nodes[0].nic: field 'fitted' only a node's nvlink may be fitted"},
  };
  for (const Case& c : cases) {
    json bad = cluster;
    c.change(bad);
    r = RunDuet({"simulate", "--cluster", tmp_.Write("bad.json", bad.dump()), "--trace", trace,
                 "--out", tmp_.File("bad-out")});
    EXPECT_EQ(r.exit_code, 1) << r;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.message << "\n" << r;
  }
}

// `--tiers FILE` times the KV tiers a cluster file configures on this host through the live
// server's tier storage and fits each tier's reads and writes; it leaves nothing behind in the
// tier's directory. A cluster file's tier that says "fitted": true is priced by those fits:
// the simulation equals the one with the fit's numbers written out, and differs from one with
// other numbers.
TEST_F(CalibrateTest, TimesTheKvTiersAndAFittedTierIsPricedByTheFit) {
  const std::string ssd_dir = tmp_.File("ssd");
  const std::string tiers = tmp_.Write("tiers.json", json({{"tiers",
                                                            {{"dram", {{"capacity_gib", 0.01}}},
                                                             {"ssd",
                                                              {{"capacity_gib", 0.01},
                                                               {"read_GBps", 1},
                                                               {"write_GBps", 1},
                                                               {"directory", ssd_dir}}}}}})
                                                         .dump());
  const std::string profile_path = tmp_.File("profile.json");
  const RunResult r = RunDuet({"calibrate", "--model", model_, "--out", profile_path, "--repeats",
                               "3", "--max-context", "128", "--tiers", tiers});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"tier dram-read (host DRAM pool): latency",
                                  "tier ssd-write (block files under " + ssd_dir}))
      << r;
  EXPECT_TRUE(fs::is_empty(ssd_dir)) << "the timing's block files are gone";
  Result<models::StepProfile> profile = models::LoadStepProfile(profile_path);
  ASSERT_TRUE(profile.ok()) << profile.error();
  std::vector<std::string> names;
  for (const models::LinkFit& link : profile->links) {
    names.push_back(link.transport);
    EXPECT_GT(link.held_out.shapes, 0) << link.transport;
    // 1 block to 4 MiB of them (more than the 128 tokens of --max-context), each size timed
    // three times.
    EXPECT_EQ(link.measurements.back().bytes, 4 << 20);
    EXPECT_EQ(link.measurements.front().seconds.size(), 3u);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"dram-read", "dram-write", "ssd-read", "ssd-write"}));
  const models::LinkFit& read = *profile->LinkFor("dram-read");

  // The repeated prompt of tests/data/one-request.jsonl on two instances sharing DRAM: the
  // second one loads the prefix from DRAM.
  json cluster = ReadJson(SourceDir() + "/tests/data/2colo-tiny-dram.json");
  cluster["model"] = model_;
  cluster["cost_model"] = {{"kind", "fitted"}, {"profile", profile_path}};
  // The fit covers the whole copy into the KV region: no narrower link on its path (a CPU
  // backend has no PCIe), so that the DRAM tier's numbers are what a load takes.
  cluster["nodes"][0]["pcie"]["bandwidth_GBps"] = 1e5;
  // A load before the prefill that needs it, not hidden under it: its time is in the TTFT.
  cluster["engine"]["overlap_tier_loads"] = false;
  std::string trace;
  for (int t : {0, 100})
    trace += "{\"timestamp\": " + std::to_string(t) +
             ", \"input_length\": 200, \"output_length\": 4, \"hash_ids\": [1]}\n";
  const std::string trace_path = tmp_.Write("repeat.jsonl", trace);
  auto simulate = [&](const json& dram, const std::string& name) {
    cluster["tiers"]["dram"] = dram;
    const std::string path = tmp_.Write(name + ".json", cluster.dump());
    Simulate(tmp_.File(name),
             {"--cluster", path, "--trace", trace_path, "--router", "round-robin"});
    return ReadFile(tmp_.File(name) + "/requests.csv");
  };
  const std::string fitted = simulate({{"capacity_gib", 1}, {"fitted", true}}, "fitted");
  EXPECT_NE(fitted.find(",c1,"), std::string::npos);
  const Csv rows = Csv::Read(tmp_.File("fitted") + "/requests.csv");
  EXPECT_GT(rows.Number(1, "dram_hit_tokens"), 0) << fitted;
  EXPECT_EQ(fitted, simulate({{"capacity_gib", 1},
                              {"bandwidth_GBps", read.bandwidth / 1e9},
                              {"latency_us", read.latency * 1e6}},
                             "spelled-out"));
  EXPECT_NE(fitted, simulate({{"capacity_gib", 1},
                              {"bandwidth_GBps", read.bandwidth / 1e9 / 50},
                              {"latency_us", read.latency * 1e6}},
                             "slower"));

  // Fitted where no profile holds the fits: an error naming the tier and what to run.
  cluster["tiers"]["dram"] = {{"capacity_gib", 1}, {"fitted", true}};
  cluster["cost_model"] = {{"kind", "roofline"}};
  RunResult refused = RunDuet({"simulate", "--cluster", tmp_.Write("roofline.json", cluster.dump()),
                               "--trace", trace_path});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(
      ContainsAll(refused.err, {"tiers.dram: field 'fitted'", "needs cost_model kind 'fitted'"}))
      << refused;
  cluster["tiers"] = {{"remote", {{"capacity_gib", 1}, {"fitted", true}}}};
  cluster["cost_model"] = {{"kind", "fitted"}, {"profile", profile_path}};
  refused = RunDuet(
      {"simulate", "--cluster", tmp_.Write("no-fit.json", cluster.dump()), "--trace", trace_path});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(ContainsAll(refused.err, {"has no fit of remote-read", "duet calibrate --tiers"}))
      << refused;
}

TEST_F(CalibrateTest, FitsMeasurementsFromElsewhereAndKeepsTheirSource) {
  // Steps priced by a known affine cost: the fit finds it and the held-out error is ~0.
  std::string lines;
  for (int n : {16, 32, 64, 128, 256, 512, 1024, 2048})
    for (int c : {0, 1000, 4000}) {
      const double s = 0.002 + 1e-5 * n + 2e-9 * (n * c + n * (n + 1) / 2.0);
      lines += json{{"prefill", {{n, c}}}, {"seconds", s}}.dump() + "\n";
    }
  for (int rows : {1, 4, 16, 64})
    for (int c : {100, 1000, 10000}) {
      const double s = 0.002 + 3e-5 * rows + 1e-8 * rows * c;
      lines += json{{"decode_tokens", rows}, {"decode_context_tokens", rows * c}, {"seconds", s}}
                   .dump() +
               "\n";
    }
  for (int n : {32, 128, 512})
    for (int rows : {2, 8, 32, 64}) {
      const double s =
          0.002 + 1e-5 * n + 2e-9 * n * (n + 1) / 2.0 + 3e-5 * rows + 1e-8 * rows * 500;
      lines += json{{"prefill", {{n, 0}}},
                    {"decode_tokens", rows},
                    {"decode_context_tokens", rows * 500},
                    {"seconds", s}}
                   .dump() +
               "\n";
    }
  const std::string measurements = tmp_.Write("m.jsonl", lines);
  const std::string source = tmp_.Write("source.json", R"({"package": "someone's data"})");
  const std::string profile_path = tmp_.File("p.json");
  const RunResult r =
      RunDuet({"calibrate", "--measurements", measurements, "--model", "llama-3.1-8b", "--device",
               "h100-sxm", "--source", source, "--roofline", "h100-sxm", "--out", profile_path});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"the roofline on the same held-out shapes"}));
  Result<models::StepProfile> profile = models::LoadStepProfile(profile_path);
  ASSERT_TRUE(profile.ok()) << profile.error();
  EXPECT_EQ(profile->device, "h100-sxm");
  EXPECT_EQ(profile->source["measured_by"]["package"], "someone's data");
  EXPECT_EQ(profile->model.num_hidden_layers, 32);
  const models::StepFit& fit = profile->fits.at(0);
  for (std::size_t c = 0; c < models::kShapeClasses; ++c) EXPECT_LT(fit.held_out[c].max_pct, 0.01);
  EXPECT_GT(fit.roofline_held_out[1].shapes, 0);
}

// Synthetic step times of a known affine cost, every class (as FitsMeasurementsFromElsewhere).
std::string AffineStepLines() {
  std::string lines;
  for (int n : {16, 32, 64, 128, 256, 512, 1024, 2048})
    for (int c : {0, 1000, 4000})
      lines +=
          json{{"prefill", {{n, c}}}, {"seconds", 0.002 + 1e-5 * n + 1e-9 * n * c}}.dump() + "\n";
  for (int rows : {1, 4, 16, 64})
    for (int c : {100, 1000, 10000})
      lines += json{{"decode_tokens", rows},
                    {"decode_context_tokens", rows * c},
                    {"seconds", 0.002 + 3e-5 * rows + 1e-8 * rows * c}}
                   .dump() +
               "\n";
  for (int n : {32, 128, 512})
    for (int rows : {2, 8, 32, 64})
      lines += json{{"prefill", {{n, 0}}},
                    {"decode_tokens", rows},
                    {"decode_context_tokens", rows * 500},
                    {"seconds", 0.002 + 1e-5 * n + 3e-5 * rows + 5e-6 * rows}}
                   .dump() +
               "\n";
  return lines;
}

// A model with a tokenizer has the server's frontend timed (a body of token ids to the engines'
// request): longer prompts cost more. The simulator delays each request's hand-over to the
// engines by the profile's frontend price, one request at a time in arrival order (as the
// server's one network thread): of two requests that arrive together, the second waits for the
// first's, and the parts of each TTFT still add up.
TEST_F(CalibrateTest, TimesTheFrontendAndTheSimulatorPassesRequestsThroughItInTurn) {
  const std::string measured = tmp_.File("measured.json");
  RunResult r = RunDuet({"calibrate", "--model", model_, "--out", measured, "--repeats", "1"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"frontend (body to engine request):", "a prompt token"}));
  Result<models::StepProfile> timed = models::LoadStepProfile(measured);
  ASSERT_TRUE(timed.ok()) << timed.error();
  ASSERT_TRUE(timed->frontend);
  EXPECT_GE(timed->frontend->requests, 5 * 200);  // 1, 4, 16, 64 tokens and more, 200 each
  EXPECT_GT(timed->frontend->prompt_token_s, 0);
  EXPECT_GT(timed->frontend->Predict(1000), timed->frontend->Predict(1));

  // A price of 1 ms a request and 1 ms a prompt token: 101 ms for 100 tokens, 11 ms for 10.
  const std::string profile_path = tmp_.File("p.json");
  r = RunDuet({"calibrate", "--measurements", tmp_.Write("m.jsonl", AffineStepLines()), "--model",
               model_, "--device", "cpu", "--out", profile_path});
  ASSERT_EQ(r.exit_code, 0) << r;
  json doc = ReadJson(profile_path);
  EXPECT_FALSE(doc.contains("frontend")) << "measurements from elsewhere time no frontend";
  doc["frontend"] = {{"request_s", 1e-3}, {"prompt_token_s", 1e-3}, {"requests", 2}};
  const std::string priced = tmp_.Write("priced.json", doc.dump());
  const std::string trace = tmp_.Write(
      "together.jsonl",
      "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 4, \"hash_ids\": [1]}\n"
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 4, \"hash_ids\": [2]}\n");
  const std::string with = tmp_.File("with"), without = tmp_.File("without");
  Simulate(with,
           {"--cluster", Cluster({{"kind", "fitted"}, {"profile", priced}}), "--trace", trace});
  Simulate(without, {"--cluster", Cluster({{"kind", "fitted"}, {"profile", profile_path}}),
                     "--trace", trace});
  const Csv a = Csv::Read(with + "/requests.csv"), b = Csv::Read(without + "/requests.csv");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NEAR(a.Number(0, "ttft_frontend_ms"), 101, kCsvTolMs);
  EXPECT_NEAR(a.Number(1, "ttft_frontend_ms"), 101 + 11, kCsvTolMs);
  // Handed over together without the price (one step prefills both); with it, the first at
  // 101 ms, admitted before the second is out of the frontend.
  EXPECT_NEAR(b.Number(0, "queue_ms"), b.Number(1, "queue_ms"), kCsvTolMs);
  EXPECT_GT(a.Number(0, "queue_ms"), 101);
  EXPECT_LT(a.Number(0, "queue_ms"), 112);
  EXPECT_GT(a.Number(1, "queue_ms"), 112);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b.Number(i, "ttft_frontend_ms"), 0) << i;
    // The frontend's time is before the queue, in the TTFT and the E2E.
    EXPECT_NEAR(a.Number(i, "queue_ms") - a.Number(i, "ttft_queue_ms"),
                a.Number(i, "ttft_frontend_ms"), kCsvTolMs)
        << i;
    const double parts = a.Number(i, "ttft_frontend_ms") + a.Number(i, "ttft_queue_ms") +
                         a.Number(i, "ttft_load_ms") + a.Number(i, "ttft_prefill_ms") +
                         a.Number(i, "ttft_transfer_ms");
    EXPECT_NEAR(parts, a.Number(i, "ttft_ms"), 5 * kCsvTolMs) << i;
  }
  const json summary = ReadJson(with + "/summary.json");
  EXPECT_NEAR(summary["ttft_breakdown_ms"]["frontend"]["max"].get<double>(), 112, kCsvTolMs);
}

// `--pool` fits two sweeps of the same shapes timed at two times (here the second 20% faster)
// as one: each shape's times pooled, so that the fit prices the middle, whichever profile is
// fitted anew (--profile: its other parts kept) and whichever is pooled into it; the drift
// between them is printed per class and the pooled profile says what it was pooled with.
TEST_F(CalibrateTest, PoolsTwoSweepsOfTheSameShapes) {
  std::string faster;
  std::istringstream lines(AffineStepLines());
  for (std::string text; std::getline(lines, text);) {
    json line = json::parse(text);
    line["seconds"] = 0.8 * line["seconds"].get<double>();
    faster += line.dump() + "\n";
  }
  const std::string a = tmp_.File("a.json"), b = tmp_.File("b.json");
  for (const auto& [path, text] : {std::pair{a, AffineStepLines()}, std::pair{b, faster}}) {
    const RunResult r = RunDuet({"calibrate", "--measurements", tmp_.Write("m.jsonl", text),
                                 "--model", model_, "--device", "cpu", "--out", path});
    ASSERT_EQ(r.exit_code, 0) << r;
  }
  const std::string refit = tmp_.File("refit.json"), fitted = tmp_.File("fitted.json");
  RunResult r = RunDuet({"calibrate", "--profile", a, "--pool", b, "--out", refit});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"pooled with " + b + " (timed 20",
                                  "its shapes took prefill -20.0%, decode -20.0%, mixed -20.0% "
                                  "against these",
                                  "tp 1: error on shapes held out"}))
      << r;
  r = RunDuet({"calibrate", "--measurements", tmp_.Write("m.jsonl", faster), "--model", model_,
               "--device", "cpu", "--pool", a, "--out", fitted});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("its shapes took prefill +25.0%"), std::string::npos) << r;
  auto slow = models::LoadStepProfile(a), pooled = models::LoadStepProfile(refit),
       other_way = models::LoadStepProfile(fitted);
  ASSERT_TRUE(slow.ok() && pooled.ok() && other_way.ok());
  EXPECT_EQ(pooled->source["pooled_with"]["path"], b) << pooled->source;
  EXPECT_EQ(pooled->source["command"], slow->source["command"]) << "--profile keeps its source";
  ASSERT_EQ(pooled->measurements.size(), slow->measurements.size());
  for (std::size_t i = 0; i < pooled->measurements.size(); ++i) {
    const std::vector<Seconds>& t = pooled->measurements[i].seconds;
    ASSERT_EQ(t.size(), 2u);
    EXPECT_DOUBLE_EQ(t[0], slow->measurements[i].seconds[0]);
    EXPECT_NEAR(t[1], 0.8 * t[0], 1e-12);
  }
  // Each shape's median is 0.9 of the slower sweep's time, so the fit is 0.9 of its fit at every
  // shape; pooled either way, the same fit.
  const models::FittedCostModel was(slow->fits.at(0)), now(pooled->fits.at(0)),
      also(other_way->fits.at(0));
  for (const models::StepMeasurement& m : slow->measurements) {
    const Seconds want = 0.9 * was.StepTime(m.shape);
    EXPECT_NEAR(now.StepTime(m.shape), want, 1e-6 * want) << models::StepShapeToJson(m.shape);
    EXPECT_NEAR(also.StepTime(m.shape), want, 1e-6 * want) << models::StepShapeToJson(m.shape);
  }
  // A profile that says nothing, or something odd, of where it comes from pools alike.
  for (const json& source : {json(), json{{"date", 5}, {"threads", "one"}}}) {
    json doc = ReadJson(b);
    if (source.is_null())
      doc.erase("source");
    else
      doc["source"] = source;
    const std::string odd = tmp_.Write("odd.json", doc.dump());
    r = RunDuet({"calibrate", "--profile", a, "--pool", odd, "--out", tmp_.File("odd-out.json")});
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_NE(r.out.find("pooled with " + odd + " (timed at an unknown time)"), std::string::npos)
        << r;
  }
}

// `--host-steps` fits the engine's host time to a live server's step log (here one written
// with a known host cost), `--profile` adds it to a profile whose step fits it keeps, and the
// simulator then adds each step's host time to the step: a request's timeline moves by exactly
// the host time of its steps. A host fit of zero moves nothing.
TEST_F(CalibrateTest, FitsHostTimeToAStepLogAndTheSimulatorPricesIt) {
  const std::string profile_path = tmp_.File("p.json");
  RunResult r = RunDuet({"calibrate", "--measurements", tmp_.Write("m.jsonl", AffineStepLines()),
                         "--model", model_, "--device", "cpu", "--out", profile_path});
  ASSERT_EQ(r.exit_code, 0) << r;
  // step 1 ms, row 0.2 ms, admitted 3 ms, finished 5 ms, token 0.1 ms
  const std::array<double, models::kHostColumns> truth = {1e-3, 2e-4, 3e-3, 5e-3, 1e-4};
  std::string log;
  for (int i = 0; i < 80; ++i) {
    const int rows = 1 + i % 9, admitted = i % 5 == 0 ? 2 : 0, finished = i % 3 == 1 ? 1 : 0;
    const int tokens = rows - (i % 4 == 0 ? 1 : 0);
    const double host =
        truth[0] + truth[1] * rows + truth[2] * admitted + truth[3] * finished + truth[4] * tokens;
    json line = {{"decode_tokens", rows}, {"decode_context_tokens", 100 * rows},
                 {"seconds", 0.01},       {"instance", 0},
                 {"start_s", 0.1 * i},    {"iteration_s", 0.01 + host}};
    line["host"] = {{"schedule_s", host / 4}, {"allocate_s", 0},      {"prepare_s", host / 4},
                    {"sample_s", 0},          {"apply_s", host / 4},  {"stream_s", host / 8},
                    {"rows", rows},           {"admitted", admitted}, {"finished", finished},
                    {"tokens", tokens}};
    log += line.dump() + "\n";
  }
  const std::string steps = tmp_.Write("steps.jsonl", log);
  const std::string with_host = tmp_.File("with-host.json");
  r = RunDuet({"calibrate", "--profile", profile_path, "--host-steps", steps, "--out", with_host});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"host time: 80 iterations of", "error on iterations held out"}));
  Result<models::StepProfile> before = models::LoadStepProfile(profile_path);
  Result<models::StepProfile> after = models::LoadStepProfile(with_host);
  ASSERT_TRUE(before.ok() && after.ok());
  ASSERT_TRUE(after->host);
  for (std::size_t c = 0; c < models::kHostColumns; ++c)
    EXPECT_NEAR(after->host->seconds_per[c], truth[c], 1e-9) << models::kHostColumnNames[c];
  EXPECT_EQ(after->host->steps, 80);
  EXPECT_EQ(after->host->held_out.shapes, 20);
  EXPECT_EQ(models::StepProfileToJson(*after)["fits"], models::StepProfileToJson(*before)["fits"]);
  // An asynchronous server's log: the forward pass overlaps the iteration, so the host time
  // fitted is the phases' sum (7/8 of it here), not the iteration less the pass.
  std::string async_log;
  std::istringstream lines(log);
  for (std::string text; std::getline(lines, text);) {
    json line = json::parse(text);
    line["async"] = true;
    line["iteration_s"] = 0.005;  // shorter than its 10 ms pass
    async_log += line.dump() + "\n";
  }
  const std::string async_host = tmp_.File("async-host.json");
  r = RunDuet({"calibrate", "--profile", profile_path, "--host-steps",
               tmp_.Write("async-steps.jsonl", async_log), "--out", async_host});
  ASSERT_EQ(r.exit_code, 0) << r;
  Result<models::StepProfile> from_async = models::LoadStepProfile(async_host);
  ASSERT_TRUE(from_async.ok() && from_async->host);
  for (std::size_t c = 0; c < models::kHostColumns; ++c)
    EXPECT_NEAR(from_async->host->seconds_per[c], 0.875 * truth[c], 1e-9)
        << models::kHostColumnNames[c];

  // One colocated request of N output tokens: N steps of one row and one token, the first
  // admitting it and the last finishing it.
  json cluster = ReadJson(SourceDir() + "/tests/data/1p1d-tiny.json");
  cluster["model"] = model_;
  cluster["instances"] = {{{"role", "colocated"}, {"count", 1}, {"tp", 1}, {"node", 0}}};
  const Tokens output = 12;
  const std::string trace = tmp_.Write(
      "one.jsonl",
      json{{"timestamp", 0}, {"input_length", 100}, {"output_length", output}, {"hash_ids", {1}}}
          .dump());
  auto simulate = [&](const std::string& profile, const std::string& name) {
    cluster["cost_model"] = {{"kind", "fitted"}, {"profile", profile}};
    const std::string out = tmp_.File(name);
    Simulate(out, {"--cluster", tmp_.Write(name + ".json", cluster.dump()), "--trace", trace});
    return Csv::Read(out + "/requests.csv");
  };
  const Csv plain = simulate(profile_path, "plain");
  const Csv host = simulate(with_host, "host");
  const double per_step = truth[0] + truth[1] + truth[4];
  EXPECT_NEAR(host.Number(0, "ttft_ms") - plain.Number(0, "ttft_ms"), 1e3 * (per_step + truth[2]),
              kCsvTolMs);
  EXPECT_NEAR(host.Number(0, "e2e_ms") - plain.Number(0, "e2e_ms"),
              1e3 * (static_cast<double>(output) * per_step + truth[2] + truth[3]), kCsvTolMs);

  json zero = ReadJson(with_host);
  for (auto& [column, value] : zero["host"]["seconds_per"].items()) value = 0.0;
  const std::string zero_host = tmp_.Write("zero-host.json", zero.dump());
  simulate(zero_host, "zero");
  EXPECT_EQ(ReadFile(tmp_.File("zero") + "/requests.csv"),
            ReadFile(tmp_.File("plain") + "/requests.csv"));

  // Asynchronous steps: with no host time (none fitted, or zero) the synchronous timeline
  // exactly; with host time, a step that follows another lasts the longer of its forward pass
  // and its host time. Here the first step (after idle) pays its host time as before, the
  // decode steps hide theirs (1.3 ms under a ~2 ms pass) but the last one's (6.3 ms, finishing
  // the request) outlasts its pass.
  cluster["engine"]["async_steps"] = true;
  simulate(profile_path, "async-plain");
  simulate(zero_host, "async-zero");
  for (const char* run : {"async-plain", "async-zero"}) {
    EXPECT_EQ(ReadFile(tmp_.File(run) + "/requests.csv"),
              ReadFile(tmp_.File("plain") + "/requests.csv"))
        << run;
  }
  const Csv overlapped = simulate(with_host, "async-host");
  EXPECT_NEAR(overlapped.Number(0, "ttft_ms"), host.Number(0, "ttft_ms"), kCsvTolMs);
  const double decode_plain = plain.Number(0, "e2e_ms") - plain.Number(0, "ttft_ms");
  EXPECT_NEAR(overlapped.Number(0, "e2e_ms") - overlapped.Number(0, "ttft_ms"),
              decode_plain - plain.Number(0, "tpot_ms") + 1e3 * (per_step + truth[3]),
              kCsvTolMs + 1e-3);
  // Step by step (no decode runs), the same.
  cluster["engine"]["coalesce_decode_steps"] = false;
  const Csv single = simulate(with_host, "async-host-single");
  for (const char* column : {"ttft_ms", "e2e_ms"})
    EXPECT_NEAR(single.Number(0, column), overlapped.Number(0, column), kCsvTolMs) << column;
}

// `--host-steps` also takes the idle engine's wake-up from the step log (the median of the
// "woke_s" of the steps that a new request woke), and the simulator wakes an idle engine that late
// after the message that woke it: a request handed over meanwhile joins the step, which the
// simulator's own step log shows with the wake-up it priced.
TEST_F(CalibrateTest, FitsTheIdleEnginesWakeUpAndTheSimulatorWakesAsLate) {
  const std::string profile_path = tmp_.File("p.json");
  RunResult r = RunDuet({"calibrate", "--measurements", tmp_.Write("m.jsonl", AffineStepLines()),
                         "--model", model_, "--device", "cpu", "--out", profile_path});
  ASSERT_EQ(r.exit_code, 0) << r;
  std::string log;
  const std::vector<double> wakes = {2e-3, 6e-3, 3e-3, 5e-3, 4e-3};
  for (int i = 0; i < 30; ++i) {
    const int rows = 1 + i % 4;
    const double host = 1e-4 * (1 + rows);
    json line = {{"decode_tokens", rows}, {"decode_context_tokens", 100 * rows},
                 {"seconds", 0.01},       {"instance", 0},
                 {"start_s", 0.1 * i},    {"iteration_s", 0.01 + host}};
    line["host"] = {{"schedule_s", host / 2}, {"allocate_s", 0}, {"prepare_s", 0},
                    {"sample_s", 0},          {"apply_s", 0},    {"stream_s", host / 2},
                    {"rows", rows},           {"admitted", 0},   {"finished", 0},
                    {"tokens", rows}};
    // A new request woke the engine (the step prefills it); a decode-only step that KV
    // arriving woke (a PD decode engine's, sooner) is not the hand-over's wake-up.
    if (i % 6 == 0) {
      line["woke_s"] = wakes[static_cast<std::size_t>(i / 6)];
      line["prefill"] = {{100, 0}};
    } else if (i % 6 == 3) {
      line["woke_s"] = 1e-5;
    }
    log += line.dump() + "\n";
  }
  const std::string with_wake = tmp_.File("with-wake.json");
  r = RunDuet({"calibrate", "--profile", profile_path, "--host-steps",
               tmp_.Write("steps.jsonl", log), "--out", with_wake});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"wake-up of the idle engine: 4000.0 us (median of 5)"})) << r;
  json doc = ReadJson(with_wake);
  EXPECT_DOUBLE_EQ(doc["host"]["wake_s"].get<double>(), 4e-3);
  EXPECT_EQ(doc["host"]["wakes"].get<int>(), 5);
  // The wake-up alone: no host time per step.
  for (auto& [column, value] : doc["host"]["seconds_per"].items()) value = 0.0;
  const std::string wake_only = tmp_.Write("wake-only.json", doc.dump());

  // Two requests 1 ms apart on an idle colocated instance.
  json cluster = ReadJson(SourceDir() + "/tests/data/1p1d-tiny.json");
  cluster["model"] = model_;
  cluster["instances"] = {{{"role", "colocated"}, {"count", 1}, {"tp", 1}, {"node", 0}}};
  const std::string trace = tmp_.Write(
      "two.jsonl",
      json{{"timestamp", 0}, {"input_length", 100}, {"output_length", 3}, {"hash_ids", {1}}}
              .dump() +
          "\n" +
          json{{"timestamp", 1}, {"input_length", 100}, {"output_length", 3}, {"hash_ids", {2}}}
              .dump());
  auto first_step = [&](const std::string& profile, const std::string& name) {
    cluster["cost_model"] = {{"kind", "fitted"}, {"profile", profile}};
    const std::string out = tmp_.File(name), steps = tmp_.File(name + "-steps.jsonl");
    Simulate(out, {"--cluster", tmp_.Write(name + ".json", cluster.dump()), "--trace", trace,
                   "--step-log", steps});
    std::vector<policies::StepLogLine> lines;
    const Status read = policies::ReadStepLog(
        ReadFile(steps), steps, [&](const policies::StepLogLine& l) { lines.push_back(l); });
    EXPECT_TRUE(read.ok()) << read.message();
    EXPECT_FALSE(lines.empty());
    return lines.empty() ? policies::StepLogLine{} : lines.front();
  };
  // Woken at once, the engine prefills the first request alone; woken 4 ms later, both.
  const policies::StepLogLine plain = first_step(profile_path, "plain");
  EXPECT_EQ(plain.step.shape.prefill.size(), 1u);
  EXPECT_EQ(plain.woke_s, 0.0);
  const policies::StepLogLine late = first_step(wake_only, "late");
  EXPECT_EQ(late.step.shape.prefill.size(), 2u);
  EXPECT_EQ(late.woke_s, 4e-3);
  EXPECT_NEAR(late.start_s - plain.start_s, 4e-3, 1e-9);
}

// --trace: the sweep also times the shapes of a trace's prompt lengths and contexts (here the
// Mooncake trace's first 40 requests at 1/128 of their lengths), and the profile names the trace
// and its selection.
TEST_F(CalibrateTest, ATraceAddsItsOwnShapesAndTheProfileNamesIt) {
  const std::string trace = SharedTrace("mooncake_conversation.jsonl");
  const std::string plain = tmp_.File("plain.json"), traced = tmp_.File("traced.json");
  const RunResult a = RunDuet({"calibrate", "--model", model_, "--out", plain, "--repeats", "1"});
  ASSERT_EQ(a.exit_code, 0) << a;
  const RunResult b = RunDuet({"calibrate", "--model", model_, "--out", traced, "--repeats", "1",
                               "--trace", trace, "--limit", "40", "--length-scale", "0.0078125"});
  ASSERT_EQ(b.exit_code, 0) << b;
  auto without = models::LoadStepProfile(plain), with = models::LoadStepProfile(traced);
  ASSERT_TRUE(without.ok() && with.ok());
  EXPECT_FALSE(without->source.contains("trace"));
  const json& t = with->source["trace"];
  EXPECT_EQ(t["path"], trace);
  EXPECT_EQ(t["selection"], json({"--limit", "40", "--length-scale", "0.0078125"}));
  EXPECT_EQ(t["requests"], 40);
  // The median, p90, p99 and longest prompt (deduplicated), ascending.
  const auto prompts = t["prompt_tokens"].get<std::vector<std::int64_t>>();
  ASSERT_FALSE(prompts.empty());
  EXPECT_TRUE(std::is_sorted(prompts.begin(), prompts.end()));
  EXPECT_LT(prompts.back(), 1000);
  // --max-context defaults to the longest request, within the positions a 64-token chunk leaves
  // of the tiny model's 256: the decode ladder reaches 192 tokens of context, against 128
  // without a trace.
  auto contexts = [](const models::StepProfile& p) {
    std::set<Tokens> out;
    for (const models::StepMeasurement& m : p.measurements)
      if (m.shape.decode_tokens > 0 && m.shape.prefill.empty())
        out.insert(m.shape.decode_context_tokens / m.shape.decode_tokens);
    return out;
  };
  EXPECT_EQ(*contexts(*without).rbegin(), 128);
  EXPECT_EQ(contexts(*with).count(192), 1u);
  // The trace's own shapes: one-chunk prefills of its prompt lengths (those within the
  // positions) among them.
  std::size_t found = 0;
  for (const models::StepMeasurement& m : with->measurements)
    for (std::int64_t p : prompts)
      found += m.shape.prefill.size() == 1 && m.shape.prefill[0].tokens == p &&
               m.shape.prefill[0].context == 0;
  EXPECT_GE(found, 1u);
}

// A synthetic spec's seed draws its lengths: calibrated on another seed, the profile names that
// seed as part of its selection (so `duet validate` on the spec's own draw reads it as other
// traffic); the spec's own seed given again is the same draw, not another selection.
TEST_F(CalibrateTest, AnotherSeedOfASyntheticSpecIsAnotherSelection) {
  const std::string spec =
      tmp_.Write("spec.json", json({{"num_requests", 6},
                                    {"seed", 5},
                                    {"arrival", {{"process", "poisson"}, {"rate_per_s", 2.0}}},
                                    {"input", {{"dist", "uniform"}, {"min", 8}, {"max", 120}}},
                                    {"output", {{"dist", "fixed"}, {"value", 4}}}})
                                  .dump());
  auto selection = [&](const std::string& seed) {
    const std::string out = tmp_.File("seed" + seed + ".json");
    const RunResult r = RunDuet({"calibrate", "--model", model_, "--out", out, "--repeats", "1",
                                 "--trace", spec, "--seed", seed});
    EXPECT_EQ(r.exit_code, 0) << r;
    auto profile = models::LoadStepProfile(out);
    return profile.ok() ? profile->source["trace"]["selection"] : json();
  };
  EXPECT_EQ(selection("7"), json({"--seed", "7"}));
  EXPECT_EQ(selection("5"), json::array());
}

TEST_F(CalibrateTest, BadFlagsAndFilesAreClearErrors) {
  const std::string out = tmp_.File("p.json");
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  const std::string bad_line = tmp_.Write("bad.jsonl",
                                          "{\"decode_tokens\": 1, \"seconds\": 1}\n"
                                          "{\"decode_tokens\": -1, \"seconds\": 1}\n");
  const std::string few = tmp_.Write("few.jsonl", "{\"decode_tokens\": 1, \"seconds\": 1}\n");
  const std::string one_request = tmp_.Write(
      "one.jsonl",
      "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 8, \"hash_ids\": [1]}\n");
  const std::string bundled = SourceDir() + "/sim/profiles/h100-sxm-llama-3.1-8b.json";
  // The bundled profile measured on another device, and with a shape fewer: not to be pooled.
  json doc = ReadJson(bundled);
  doc["device"] = "h200";
  const std::string elsewhere = tmp_.Write("elsewhere.json", doc.dump());
  doc["device"] = ReadJson(bundled)["device"];
  doc["measurements"].erase(doc["measurements"].begin());
  const std::string fewer_shapes = tmp_.Write("fewer.json", doc.dump());
  const std::vector<Case> cases = {
      {{"--model", model_, "--repeats", "0"}, 2, "--repeats must be in [1, 1000]"},
      {{"--model", model_, "--max-batch", "2"}, 2, "--max-batch must be in [8, 1024]"},
      {{"--model", model_, "--device", "tpu"}, 2, "--device must be cpu or cuda"},
      {{"--model", model_, "--max-tokens", "4096"}, 2, "exceeds"},
      {{"--model", model_, "--progress", "maybe"}, 2, "--progress must be auto, always or never"},
      {{"--model", model_, "--source", "x.json"}, 2, "--source goes with --measurements"},
      {{"--model", tmp_.File("nowhere")}, 1, "nowhere"},
      {{"--model", model_, "--roofline", "no-such-gpu"}, 1, "--roofline:"},
      {{"--measurements", tmp_.File("none.jsonl"), "--model", "tiny-test"}, 1, "cannot open"},
      {{"--measurements", bad_line, "--model", "tiny-test"},
       1,
       "bad.jsonl:2: field 'decode_tokens'"},
      {{"--measurements", few, "--model", "tiny-test"}, 1, "tp 1: 0 prefill measurements to fit"},
      {{"--measurements", few, "--model", "no-such-model"}, 1, "--model:"},
      {{"--model", model_, "--transport", "pigeon"},
       2,
       "--transport: unknown KV transport 'pigeon'"},
      {{"--model", model_, "--transport", "loopback,loopback"}, 2, "loopback named twice"},
      {{"--model", model_, "--transport", "loopback", "--device", "cuda"},
       2,
       "--transport: only KV in host memory"},
      {{"--model", model_, "--ucx-tls", "tcp"}, 2, "--ucx-tls goes with --transport ucx"},
      {{"--measurements", few, "--model", "tiny-test", "--transport", "loopback"},
       2,
       "not with --measurements"},
      {{"--measurements", few, "--model", "tiny-test", "--beside"},
       2,
       "--beside times this machine's steps: not with --measurements"},
      {{"--profile", few}, 2, "--profile goes with --host-steps or --pool"},
      {{"--profile", bundled, "--pool", elsewhere}, 1, "was measured on h200, not on h100-sxm"},
      {{"--profile", bundled, "--pool", fewer_shapes},
       1,
       "fewer.json: 354 step shapes where these are 355: not the same sweep"},
      {{"--profile", bundled, "--pool", tmp_.File("none.json")}, 1, "--pool: "},
      {{"--profile", few, "--host-steps", few, "--beside"}, 2, "not with --beside"},
      {{"--model", model_, "--limit", "10"}, 2, "--limit goes with --trace"},
      {{"--model", model_, "--trace", one_request, "--rate-scale", "2"},
       2,
       "--rate-scale: calibrate reads a trace's lengths"},
      {{"--model", model_, "--trace", one_request, "--seed", "2"},
       2,
       "--seed: calibrate reads a trace's lengths"},
      {{"--model", model_, "--trace", tmp_.File("none.jsonl")}, 1, "--trace: "},
      {{"--measurements", few, "--model", "tiny-test", "--trace", few},
       2,
       "not with --measurements"},
      {{"--profile", few, "--host-steps", few, "--model", model_}, 2, "not with --model"},
      {{"--profile", tmp_.File("none.json"), "--host-steps", few}, 1, "--profile:"},
      {{}, 2, "the option '--model' is required"},
      // A step log of a server before host phases were measured has none to fit.
      {{"--profile", bundled, "--host-steps",
        tmp_.Write("old.jsonl",
                   "{\"decode_tokens\": 1, \"seconds\": 0.1, \"instance\": 0, \"start_s\": 0, "
                   "\"iteration_s\": 0.2}\n")},
       1,
       "old.jsonl: no line has host phases"},
      {{"--profile", bundled, "--host-steps", tmp_.File("none.jsonl")},
       1,
       "--host-steps: cannot open"},
      {{"--profile", bundled, "--host-steps", bad_line}, 1, "bad.jsonl:1: field 'instance'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"calibrate", "--out", out};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = RunDuet(args);
    EXPECT_EQ(r.exit_code, c.code) << r;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.message << "\n" << r;
    EXPECT_FALSE(fs::exists(out)) << r;
  }
}

TEST_F(CalibrateTest, ClusterFilesCheckTheirProfile) {
  // A profile measured on another model, or without the TP degree an instance runs at, and a
  // broken profile file, are errors naming the cluster file and what is wrong.
  const std::string bundled = SourceDir() + "/sim/profiles/h100-sxm-llama-3.1-8b.json";
  RunResult r =
      RunDuet({"simulate", "--cluster", Cluster({{"kind", "fitted"}, {"profile", bundled}}),
               "--out", tmp_.File("o1")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"cluster.json: cost_model: profile", "measured on another model",
                                  "num_hidden_layers: 32 vs 2"}));

  const std::string broken = tmp_.Write("broken.json", R"({"format": "duet-step-profile"})");
  r = RunDuet({"simulate", "--cluster", Cluster({{"kind", "fitted"}, {"profile", broken}}), "--out",
               tmp_.File("o2")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"cost_model: field 'profile'", "broken.json: field 'version'"}));

  r = RunDuet({"simulate", "--cluster",
               Cluster({{"kind", "fitted"}, {"profile", broken}, {"step_overhead_ms", 1}}), "--out",
               tmp_.File("o3")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_NE(r.err.find("'step_overhead_ms' applies to kind 'roofline' only"), std::string::npos)
      << r;

  json cluster = ReadJson(SourceDir() + "/sim/clusters/h100-8p8d-llama8b.json");
  cluster["cost_model"] = {{"kind", "fitted"}, {"profile", bundled}};
  cluster["instances"] = {{{"role", "prefill"}, {"count", 1}, {"tp", 8}, {"node", 0}},
                          {{"role", "decode"}, {"count", 1}, {"tp", 1}, {"node", 1}}};
  r = RunDuet(
      {"simulate", "--cluster", tmp_.Write("tp8.json", cluster.dump()), "--out", tmp_.File("o4")});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_NE(r.err.find("has no fit for tp 8 (instance p0; it has tp 1, 2, 4)"), std::string::npos)
      << r;
}

}  // namespace
}  // namespace duet::e2e
