// Workloads in the simulator (docs/workloads.md): session turns sent a think time after their
// predecessor finished, whose prefix is a cache hit only as far as the predecessor's blocks
// survived; dependents of a request that was never served; a closed loop of N users that keeps
// exactly N requests in flight; and the per-session and GPU-hour outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/sim/e2e_util.h"
#include "tests/sim/model_util.h"

namespace duet::e2e {
namespace {

// One colocated tiny-test instance (tests/data/1p1d-tiny's node, links and engine) with
// `reserved_gib` held back from its KV cache.
nlohmann::json OneColocated(double reserved_gib) {
  nlohmann::json c = ReadJson(Src("tests/data/1p1d-tiny.json"));
  c["name"] = "1colo-tiny";
  c["instances"] = nlohmann::json::array({{{"role", "colocated"}, {"count", 1}, {"tp", 1}}});
  c["engine"]["reserved_gib"] = reserved_gib;
  return c;
}

// tiny-test KV is 256 bytes a token, 4 KiB a 16-token block: 262144 blocks a GiB; reserving
// 0.25 GiB leaves 170325. This reservation leaves `blocks`.
double ReservedFor(int blocks) { return 0.25 + (170325.0 - blocks) / 262144; }
const double kReservedFor40Blocks = ReservedFor(40);

std::string Lines(const std::vector<nlohmann::json>& lines) {
  std::string text;
  for (const auto& l : lines) text += l.dump() + "\n";
  return text;
}

double Finished(const Csv& csv, std::size_t row) {
  return std::stod(csv.Get(row, "arrival_s")) + std::stod(csv.Get(row, "e2e_ms")) / 1e3;
}

// A (session s): 256 prompt tokens, 17 output tokens. Its next turn (row 2) continues A's 273
// tokens of context with 32 new ones (305 in all), `delay` ms after A finished. B (row 1), an
// unrelated 576-token prompt, arrives at 200 ms.
// - Sent before B: A's blocks are all cached. A computed 272 tokens' KV (the last output token
//   has none): 17 full blocks, its 16 prompt blocks and the output's first, cached at
//   completion. Hit: 17 x 16 = 272 tokens.
// - Sent after B: of the 40 blocks, 23 were free when B came; B holds 37 (580 tokens with its
//   output) and evicted 14 of A's, tail first. A's blocks 0-2 survive: 48 tokens.
TEST(Sessions, AFollowUpHitsWhatSurvivedOfItsPredecessor) {
  TempDir tmp;
  const std::string cluster = tmp.File("colo.json");
  WriteJson(cluster, OneColocated(kReservedFor40Blocks));
  struct Case {
    int delay_ms;
    const char* cached;
  };
  for (const Case& c : {Case{50, "272"}, Case{300, "48"}}) {
    const std::string name = std::to_string(c.delay_ms);
    const std::string trace = tmp.Write(name + ".jsonl", Lines({{{"timestamp", 0},
                                                                 {"input_length", 256},
                                                                 {"output_length", 17},
                                                                 {"hash_ids", {1}},
                                                                 {"session_id", "s"}},
                                                                {{"timestamp", 200},
                                                                 {"input_length", 576},
                                                                 {"output_length", 4},
                                                                 {"hash_ids", {2, 3}}},
                                                                {{"input_length", 32},
                                                                 {"output_length", 4},
                                                                 {"session_id", "s"},
                                                                 {"delay", c.delay_ms}}}));
    const std::string out = tmp.File(name);
    Simulate(out, {"--cluster", cluster, "--trace", trace, "--router", "round-robin"});
    const nlohmann::json s = ReadJson(out + "/summary.json");
    ASSERT_EQ(s["prefix_cache"]["pooled_reference"]["capacity_blocks"].get<int>(), 40);
    const Csv csv = Csv::Read(out + "/requests.csv");
    ASSERT_EQ(csv.size(), 3u);
    EXPECT_EQ(csv.Get(2, "input_tokens"), "305");
    EXPECT_DOUBLE_EQ(std::stod(csv.Get(2, "arrival_s")),
                     std::round((Finished(csv, 0) + c.delay_ms / 1e3) * 1e6) / 1e6);
    EXPECT_EQ(csv.Get(2, "cached_tokens"), c.cached) << "delay " << c.delay_ms;
    EXPECT_EQ(csv.Get(0, "session"), "0");
    EXPECT_EQ(csv.Get(1, "session"), "");
    EXPECT_EQ(csv.Get(2, "session"), "0");
    EXPECT_EQ(s["sessions"]["count"].get<int>(), 1);
  }
}

// PD: the follow-up prefills on the prefill instance, which never held A's output: only A's
// 256 prompt tokens hit. The decode instance delivers the first token once the KV arrived and
// the second a decode step later: TTST is about one step, and TTFT and the gaps make up E2E.
TEST(Sessions, InPdOnlyThePromptOfThePredecessorIsCached) {
  TempDir tmp;
  const std::string trace = tmp.Write(
      "t.jsonl", Lines({{{"timestamp", 0},
                         {"input_length", 256},
                         {"output_length", 17},
                         {"hash_ids", {1}},
                         {"session_id", "s"}},
                        {{"input_length", 32}, {"output_length", 4}, {"session_id", "s"}}}));
  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", Src("tests/data/1p1d-tiny.json"), "--trace", trace});
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 2u);
  EXPECT_EQ(csv.Get(1, "cached_tokens"), "256");
  EXPECT_DOUBLE_EQ(std::stod(csv.Get(1, "arrival_s")), std::round(Finished(csv, 0) * 1e6) / 1e6);
  for (std::size_t i = 0; i < 2; ++i) {
    const double ttst = std::stod(csv.Get(i, "ttst_ms")), tpot = std::stod(csv.Get(i, "tpot_ms"));
    const double e2e = std::stod(csv.Get(i, "e2e_ms")), ttft = std::stod(csv.Get(i, "ttft_ms"));
    const int output = std::stoi(csv.Get(i, "output_tokens"));
    EXPECT_NEAR(ttft + (output - 1) * tpot, e2e, 0.01);
    EXPECT_LE(ttft + ttst, e2e + 0.001);
    EXPECT_NEAR(ttst, tpot, 0.5 * tpot);  // one decode step, like the others
  }
}

// A turn whose predecessor was rejected is never sent; nor is the one after it.
TEST(Sessions, TurnsAfterARejectedRequestAreRejectedWithTheCause) {
  TempDir tmp;
  const std::string cluster = tmp.File("colo.json");
  WriteJson(cluster, OneColocated(kReservedFor40Blocks));
  const std::string trace =
      tmp.Write("t.jsonl", Lines({{{"timestamp", 0},
                                   {"input_length", 4000},
                                   {"output_length", 4},
                                   {"hash_ids", nlohmann::json::array()},
                                   {"session_id", "s"}},
                                  {{"input_length", 10}, {"output_length", 4}, {"session_id", "s"}},
                                  {{"input_length", 10}, {"output_length", 4}, {"session_id", "s"}},
                                  {{"timestamp", 5},
                                   {"input_length", 10},
                                   {"output_length", 4},
                                   {"hash_ids", nlohmann::json::array()}}}));
  const std::string out = tmp.File("out");
  Simulate(out, {"--cluster", cluster, "--trace", trace});
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 4u);
  EXPECT_EQ(csv.Get(0, "status"), "rejected");
  EXPECT_EQ(csv.Get(1, "reason"), "dependency not completed: request 0 was rejected");
  EXPECT_EQ(csv.Get(2, "reason"), "dependency not completed: request 1 was rejected");
  EXPECT_EQ(csv.Get(3, "status"), "completed");
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["requests"]["total"].get<int>(), 4);
  EXPECT_EQ(s["requests"]["rejected_reasons"]["dependency not completed"].get<int>(), 2);
}

// Multi-turn sessions from the synthetic generator on one instance with more and more KV
// blocks: a later turn finds more of its conversation still cached, so the hit rate rises with
// the cache. The largest cache holds everything the pooled reference does.
TEST(Sessions, MultiTurnHitRateRisesWithCacheSize) {
  TempDir tmp;
  const std::string spec = tmp.Write("mt.json", R"({
    "num_requests": 400, "seed": 3, "block_tokens": 16,
    "arrival": {"process": "poisson", "rate_per_s": 4},
    "input": {"dist": "uniform", "min": 200, "max": 600},
    "output": {"dist": "uniform", "min": 20, "max": 80},
    "prefix": {"groups": 4, "tokens": 128},
    "sessions": {"turns": {"dist": "uniform", "min": 2, "max": 6},
                 "new_tokens": {"dist": "uniform", "min": 20, "max": 120},
                 "think_time_ms": {"dist": "uniform", "min": 1000, "max": 8000}}})");
  double previous = 0;
  for (int blocks : {100, 400, 1600, 6400}) {
    const std::string name = std::to_string(blocks);
    const std::string cluster = tmp.File(name + ".json");
    WriteJson(cluster, OneColocated(ReservedFor(blocks)));
    const std::string out = tmp.File(name);
    Simulate(out, {"--cluster", cluster, "--trace", spec, "--router", "round-robin"});
    const nlohmann::json s = ReadJson(out + "/summary.json");
    ASSERT_EQ(s["prefix_cache"]["pooled_reference"]["capacity_blocks"].get<int>(), blocks);
    EXPECT_EQ(s["requests"]["completed"].get<int>(), 400);
    const double hit_rate = s["prefix_cache"]["hit_rate"].get<double>();
    std::printf("multi-turn on one instance, %d KV blocks: hit rate %.1f%%\n", blocks,
                100 * hit_rate);  // the figures docs/workloads.md quotes
    EXPECT_GT(hit_rate, previous * 1.5) << blocks << " blocks";
    previous = hit_rate;
    if (blocks == 6400) {
      EXPECT_DOUBLE_EQ(hit_rate, s["prefix_cache"]["pooled_reference"]["hit_rate"].get<double>());
      EXPECT_GT(hit_rate, 0.7);
    }
  }
}

// In flight at time t: sent at or before t, finished after t (the CSV's rounding aside).
int InFlight(const Csv& csv, double t) {
  int n = 0;
  for (std::size_t i = 0; i < csv.size(); ++i)
    n += std::stod(csv.Get(i, "arrival_s")) <= t && Finished(csv, i) > t + 2e-6;
  return n;
}

TEST(ClosedLoop, HoldsExactlyNRequestsInFlightUntilTheTraceRunsOut) {
  TempDir tmp;
  const std::string out = tmp.File("out");
  const RunResult r = Simulate(out, {"--cluster", Src("tests/data/1p1d-tiny.json"), "--trace",
                                     "traces/bundled/tiny.json", "--concurrency", "4"});
  EXPECT_NE(r.out.find("closed loop    4 users"), std::string::npos) << r;
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 40u);
  // Every request after the first four is sent the instant an earlier one finished, and just
  // after each send four are in flight, up to the last send.
  std::vector<double> finishes;
  for (std::size_t i = 0; i < csv.size(); ++i) finishes.push_back(Finished(csv, i));
  for (std::size_t i = 0; i < csv.size(); ++i) {
    const double sent = std::stod(csv.Get(i, "arrival_s"));
    if (i < 4) {
      EXPECT_EQ(sent, 0.0);
      continue;
    }
    EXPECT_TRUE(std::any_of(finishes.begin(), finishes.end(),
                            [&](double f) { return std::abs(f - sent) < 2e-6; }))
        << "request " << i << " sent at " << sent << " when nothing finished";
  }
  for (std::size_t i = 0; i < csv.size(); ++i) {
    const double sent = std::stod(csv.Get(i, "arrival_s"));
    EXPECT_EQ(InFlight(csv, sent), 4) << "just after request " << i << " was sent";
  }
}

TEST(ClosedLoop, ThinkTimeAndDurationBoundTheRun) {
  TempDir tmp;
  const std::string out = tmp.File("out");
  Simulate(out,
           {"--cluster", Src("tests/data/1p1d-tiny.json"), "--trace", "traces/bundled/tiny.json",
            "--concurrency", "2", "--think-time-ms", "100", "--duration", "0.5"});
  const Csv csv = Csv::Read(out + "/requests.csv");
  const nlohmann::json s = ReadJson(out + "/summary.json");
  ASSERT_LT(csv.size(), 40u);
  EXPECT_EQ(s["requests"]["total"].get<std::size_t>(), csv.size());
  EXPECT_EQ(s["sessions"]["count"].get<int>(), 2);  // per user
  for (std::size_t i = 0; i < csv.size(); ++i) {
    const double sent = std::stod(csv.Get(i, "arrival_s"));
    EXPECT_LT(sent, 0.5);
    if (i < 2) continue;
    // Sent 100 ms after one of the user's earlier requests finished.
    bool follows = false;
    for (std::size_t j = 0; j < i; ++j) {
      follows |= csv.Get(j, "session") == csv.Get(i, "session") &&
                 std::abs(Finished(csv, j) + 0.1 - sent) < 2e-6;
    }
    EXPECT_TRUE(follows) << "request " << i;
  }
  const double simulated_s = s["sim"]["simulated_s"].get<double>();
  EXPECT_NEAR(s["gpu_hours"].get<double>(), 2 * simulated_s / 3600, 1e-6);
}

TEST(ClosedLoop, BadFlagsAreUsageErrors) {
  TempDir tmp;
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"--think-time-ms", "5"}, "--think-time-ms and --duration need a closed loop"},
      {{"--duration", "5"}, "--think-time-ms and --duration need a closed loop"},
      {{"--concurrency", "2", "--rate-scale", "2"}, "--rate-scale has no effect in a closed loop"},
      {{"--concurrency", "2", "--think-time-ms", "-1"}, "--think-time-ms must be in"},
      {{"--concurrency", "2", "--duration", "0"}, "--duration must be in"},
      {{"--concurrency", "2", "--duration", "1e300"}, "--duration must be in"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"simulate", "--trace", "traces/bundled/tiny.json", "--out",
                                     tmp.File("out")};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = RunDuet(args);
    EXPECT_EQ(r.exit_code, 2) << r;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r;
  }
}

}  // namespace
}  // namespace duet::e2e
