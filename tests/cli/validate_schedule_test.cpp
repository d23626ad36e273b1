// `duet validate`'s schedules (cli/validate_schedule.h), from step logs written here by hand:
// which steps began after an idle spell and how many requests each took, what a decode token's
// step held and took, the live runs' medians, and bad logs named.
#include "cli/validate_schedule.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "policies/step_log.h"
#include "tests/sim/e2e_util.h"

namespace duet::cli {
namespace {

using nlohmann::json;

// A step of instance `instance` from `start_s` for `iteration_s`: `chunks` prefill chunks of 100
// tokens beside `rows` decode rows; `woke_s`: a message woke the engine that long before.
std::string Line(int instance, Seconds start_s, Seconds iteration_s, int chunks, int rows,
                 std::optional<Seconds> woke_s = std::nullopt) {
  policies::StepLogLine line;
  line.instance = instance;
  line.start_s = start_s;
  line.iteration_s = iteration_s;
  line.woke_s = woke_s;
  for (int c = 0; c < chunks; ++c) line.step.shape.prefill.push_back({100, 0});
  line.step.shape.decode_tokens = rows;
  line.step.shape.decode_context_tokens = 200 * rows;
  line.step.seconds = iteration_s / 2;
  return policies::FormatStepLogLine(line);
}

class ScheduleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = sim::LoadClusterSpec("tests/data/1p1d-tiny.json", DUET_SOURCE_DIR);
    ASSERT_TRUE(cluster.ok()) << cluster.error();
    cluster_ = std::move(*cluster);
  }
  std::string Log(const std::string& name, const std::string& text) {
    const std::string path = tmp_.File(name);
    e2e::WriteFile(path, text);
    return path;
  }
  // Each live run's schedules, from its step log.
  std::vector<std::vector<Schedule>> Runs(const std::vector<std::string>& logs) {
    std::vector<std::vector<Schedule>> runs;
    for (const std::string& log : logs) {
      auto s = ReadSchedules(log, cluster_);
      EXPECT_TRUE(s.ok()) << s.error();
      if (s.ok()) runs.push_back(std::move(*s));
    }
    return runs;
  }
  e2e::TempDir tmp_;
  sim::ClusterSpec cluster_;
};

TEST_F(ScheduleTest, StepsAfterAnIdleSpellAndWhatADecodeTokensStepHeld) {
  // Instance 0: a step of three chunks at 0, one of a chunk and 2 rows right after it (50 us
  // later: not idle), then one of a chunk 2 ms after that ended (idle). Instance 1 waits 0.5 ms
  // between its two decode steps: not an idle spell.
  const std::string log =
      Log("steps.jsonl", Line(0, 0.000, 0.010, 3, 0) + Line(0, 0.01005, 0.020, 1, 2) +
                             Line(1, 0.005, 0.004, 0, 4) + Line(1, 0.0095, 0.002, 0, 1) +
                             Line(0, 0.03205, 0.010, 1, 0));
  auto schedules = ReadSchedules(log, cluster_);
  ASSERT_TRUE(schedules.ok()) << schedules.error();
  ASSERT_EQ(schedules->size(), 2u);
  const Schedule& p = (*schedules)[0];
  EXPECT_EQ(p.steps, 3);
  EXPECT_NEAR(p.busy_s, 0.040, 1e-12);
  EXPECT_EQ(p.after_idle_steps, 2);
  EXPECT_EQ(p.after_idle_rows, 3 + 1);
  EXPECT_EQ(p.decode_tokens, 2);
  EXPECT_EQ(p.decode_tokens_in_mixed, 2);
  const Schedule& d = (*schedules)[1];
  EXPECT_EQ(d.after_idle_steps, 1);
  EXPECT_EQ(d.after_idle_rows, 4);
  const json j = d.ToJson();
  // Four tokens in a step of 4 rows and 4 ms, one in a step of 1 row and 2 ms.
  EXPECT_DOUBLE_EQ(j["decode_rows_per_token"].get<double>(), (4 * 4 + 1 * 1) / 5.0);
  EXPECT_DOUBLE_EQ(j["decode_ms_per_token"].get<double>(), (4 * 4.0 + 1 * 2.0) / 5.0);
  EXPECT_DOUBLE_EQ(j["decode_tokens_in_mixed_pct"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(j["rows_per_step_after_idle"].get<double>(), 4);
  // An instance with no decode steps has no figures for them, not zeros.
  EXPECT_TRUE(Schedule{}.ToJson()["decode_ms_per_token"].is_null());
}

TEST_F(ScheduleTest, LiveRunsGiveTheirMedianBesideTheSimulation) {
  // Three live runs whose first steps took 1, 3 and 2 requests; the simulation's took 1.
  std::vector<std::string> live;
  for (int k : {1, 3, 2})
    live.push_back(Log("live-" + std::to_string(k) + ".jsonl", Line(0, 0, 0.01, k, 0)));
  const std::string sim = Log("sim.jsonl", Line(0, 0, 0.01, 1, 0) + Line(1, 0.02, 0.01, 0, 1));
  auto compared = CompareSchedules(Runs(live), sim, {}, cluster_);
  ASSERT_TRUE(compared.ok()) << compared.error();
  const json& instances = (*compared)["instances"];
  ASSERT_EQ(instances.size(), 2u) << instances;
  const json& p = instances[cluster_.instances[0].name];
  EXPECT_DOUBLE_EQ(p["live"]["rows_per_step_after_idle"].get<double>(), 2);
  ASSERT_EQ(p["live_runs"].size(), 3u);
  EXPECT_DOUBLE_EQ(p["live_runs"][1]["rows_per_step_after_idle"].get<double>(), 3);
  EXPECT_DOUBLE_EQ(p["simulated"]["rows_per_step_after_idle"].get<double>(), 1);
  EXPECT_FALSE(p.contains("simulated_as_live"));
  // The decode instance ran only in the simulation: its live figures are zeros and nulls.
  const json& d = instances[cluster_.instances[1].name];
  EXPECT_EQ(d["live"]["steps"].get<double>(), 0);
  EXPECT_TRUE(d["live"]["decode_ms_per_token"].is_null());
  const std::string text = ScheduleText(*compared, "0.5");
  EXPECT_NE(text.find("schedule at x0.5, " + cluster_.instances[0].name +
                      ": steps after an idle spell 1 live [1-1], 1 simulated; requests per such "
                      "step 2.00 live [1.00-3.00], 1.00 simulated;"),
            std::string::npos)
      << text;
}

TEST_F(ScheduleTest, WakeUpsAreTheMedianOfTheStepsAMessageWoke) {
  // Three wake-ups of 0.1, 0.4 and 0.2 ms; the step between them followed another at once.
  const std::string log = Log(
      "steps.jsonl", Line(0, 0.000, 0.010, 1, 0, 0.0001) + Line(0, 0.0101, 0.010, 0, 1) +
                         Line(0, 0.100, 0.010, 1, 0, 0.0004) + Line(0, 0.200, 0.010, 2, 0, 0.0002));
  auto schedules = ReadSchedules(log, cluster_);
  ASSERT_TRUE(schedules.ok()) << schedules.error();
  const json j = (*schedules)[0].ToJson();
  EXPECT_EQ(j["wakes"].get<int>(), 3);
  EXPECT_NEAR(j["wake_ms"].get<double>(), 0.2, 1e-12);
  // A log that measured none (the simulator's without a wake-up priced, an older server's).
  EXPECT_TRUE((*schedules)[1].ToJson()["wake_ms"].is_null());
}

TEST_F(ScheduleTest, VariantsAreComparedUnderTheirKeysAndLabels) {
  const std::string live = Log("live.jsonl", Line(0, 0, 0.01, 2, 0, 0.0003));
  const std::string sim = Log("sim.jsonl", Line(0, 0, 0.01, 1, 0));
  const std::string as_live = Log("as-live.jsonl", Line(0, 0, 0.012, 1, 0));
  const std::string hand_over = Log("hand-over.jsonl", Line(0, 0, 0.012, 2, 0, 0.0003));
  auto compared = CompareSchedules(
      Runs({live}), sim,
      {{"as_live", "as live", as_live}, {"as_live_hand_over", "handing over as live", hand_over}},
      cluster_);
  ASSERT_TRUE(compared.ok()) << compared.error();
  const json& p = (*compared)["instances"][cluster_.instances[0].name];
  EXPECT_DOUBLE_EQ(p["simulated_as_live"]["rows_per_step_after_idle"].get<double>(), 1);
  EXPECT_DOUBLE_EQ(p["simulated_as_live_hand_over"]["rows_per_step_after_idle"].get<double>(), 2);
  const std::string text = ScheduleText(*compared, "1");
  EXPECT_NE(text.find("requests per such step 2.00 live, 1.00 simulated (1.00 as live, 2.00 "
                      "handing over as live);"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ms from the message that woke the engine to its step (median) 0.300 live, "
                      "n/a simulated (n/a as live, 0.300 handing over as live)"),
            std::string::npos)
      << text;
}

TEST_F(ScheduleTest, TheLiveHandOverIsMeasuredFromTheLiveRunsFiles) {
  // New requests woke the prefill instance three times; the decode instance's shorter wake-ups
  // (KV arriving) are not the hand-over's.
  const std::string steps =
      Log("steps.jsonl", Line(0, 0, 0.01, 1, 0, 0.0001) + Line(1, 0.02, 0.01, 0, 1, 0.00001) +
                             Line(0, 0.1, 0.01, 1, 0, 0.0005) + Line(1, 0.12, 0.01, 0, 1, 0.00002) +
                             Line(0, 0.2, 0.01, 1, 0, 0.0003));
  // The frontend takes 0.1 ms + 1 us per prompt token of each request, one at a time: a burst
  // of three at 0 s is handed over at 0.2, 0.6 and 0.75 ms (each waited for those before it), a
  // lone request at 1 s after 0.3 ms; the failed request is not counted. Their own frontend
  // times less their tokens' price have a median of 0.2 ms; their service times, 0.1 ms each.
  const std::string header =
      "request_id,arrival_s,input_tokens,output_tokens,status,ttft_frontend_ms\n";
  const std::string csv =
      Log("requests.csv", header + "1,0,300,4,completed,0.6\n" + "0,0,100,4,completed,0.2\n" +
                              "2,0,50,4,completed,0.75\n" + "3,1,200,4,completed,0.3\n" +
                              "4,1.5,10,4,failed,9\n");
  models::StepProfile profile;
  profile.frontend.emplace();
  profile.frontend->request_s = 1e-6;
  profile.frontend->prompt_token_s = 1e-6;
  auto h = MeasureLiveHandOver(Runs({steps}), {csv}, profile);
  ASSERT_TRUE(h.ok()) << h.error();
  EXPECT_EQ(h->wakes, 3);
  EXPECT_NEAR(h->wake_s, 0.0003, 1e-12);
  EXPECT_EQ(h->requests, 4);
  EXPECT_NEAR(h->frontend_request_s, 0.0001, 1e-9);
  // The profile hands over so: a host fit that prices nothing else, the frontend's per-token
  // time kept.
  const models::StepProfile with = ProfileWithHandOver(profile, *h);
  ASSERT_TRUE(with.host.has_value());
  EXPECT_NEAR(with.host->wake_s, 0.0003, 1e-12);
  EXPECT_EQ(with.host->Predict({.rows = 8, .admitted = 2, .finished = 1, .tokens = 8}), 0.0);
  EXPECT_NEAR(with.frontend->Predict(100), 0.0001 + 100e-6, 1e-12);
  // A requests.csv without the frontend's times (written before they were) is named.
  const std::string old = Log("old.csv", "request_id,arrival_s,input_tokens,status\n");
  auto bad = MeasureLiveHandOver(Runs({steps}), {old}, profile);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("old.csv"), std::string::npos) << bad.error();
}

TEST_F(ScheduleTest, BadLogsAreNamed) {
  const std::string other = Log("other.jsonl", Line(2, 0, 0.01, 1, 0));
  auto r = ReadSchedules(other, cluster_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find(other + ": instance 2 is not in the cluster file"), std::string::npos)
      << r.error();
  const std::string bad = Log("bad.jsonl", Line(0, 0, 0.01, 1, 0) + "{\"instance\": 0}\n");
  r = ReadSchedules(bad, cluster_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find(bad + ":2"), std::string::npos) << r.error();
}

}  // namespace
}  // namespace duet::cli
