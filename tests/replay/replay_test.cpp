// End-to-end tests of `duet replay`: the duet binary (run as e2e_util.h runs it) replays small
// traces against FakeServer, a real HTTP server on 127.0.0.1 inside the test that streams
// chunks at known times. The tests check measured TTFT, TPOT, ITL and E2E against those times,
// the token and cache counts the server reported, the request bodies it received, rejected and
// failed requests with their reasons, the METRICS.md schema of both files, and the errors that
// stop a run before it writes anything.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/metrics_schema.h"
#include "tests/replay/fake_server.h"
#include "tests/sim/e2e_util.h"

namespace duet::e2e {
namespace {

using replay_test::FakeServer;
using replay_test::FakeServerOptions;

// Scheduling noise on a busy two-core machine: measured latencies may exceed the server's
// delays by this much, never fall short of them (the server starts its clock after the send).
constexpr double kLateMs = 60;
constexpr double kFirstChunkMs = 100;
constexpr double kGapMs = 20;

// Seven requests, one per behaviour of FakeServer (picked by output_length):
//   0: normal, 10 tokens, blocks [1, 2] (1024 tokens)
//   1: normal, 9 tokens, blocks [1, 2, 3]: shares 1024 prompt tokens with request 0
//   2: 20 tokens two per chunk; no block ids, as long as request 0: shares nothing with it
//   3: HTTP 429;  4: disconnect after 3 chunks;  5: a chunk that is not JSON;  6: HTTP 500
constexpr const char* kMixedTrace =
    R"({"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]}
{"timestamp": 300, "input_length": 1100, "output_length": 9, "hash_ids": [1, 2, 3]}
{"timestamp": 300, "input_length": 1024, "output_length": 20, "hash_ids": []}
{"timestamp": 350, "input_length": 600, "output_length": 7, "hash_ids": [9, 10]}
{"timestamp": 400, "input_length": 600, "output_length": 13, "hash_ids": [11, 12]}
{"timestamp": 450, "input_length": 600, "output_length": 11, "hash_ids": [13, 14]}
{"timestamp": 450, "input_length": 600, "output_length": 17, "hash_ids": [15, 16]}
)";
constexpr std::size_t kMixedRequests = 7;

RunResult Replay(std::vector<std::string> args) {
  args.insert(args.begin(), "replay");
  return RunDuet(args);
}

// Within [low, low + kLateMs].
::testing::AssertionResult Late(double value, double low, const std::string& what) {
  if (value >= low && value <= low + kLateMs) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << " = " << value << " ms, expected " << low << " to " << low + kLateMs;
}

class ReplayTest : public ::testing::Test {
 protected:
  TempDir tmp_;
  std::string trace_ = tmp_.Write("mixed.jsonl", kMixedTrace);
};

TEST_F(ReplayTest, MeasuresTheServersTimingAndCounts) {
  FakeServer server;
  const std::string out = tmp_.File("out");
  const RunResult r = Replay({"--endpoint", server.url() + "/v1/", "--trace", trace_, "--out", out,
                              "--api-key", "sk-test", "--slo", "ttft=10000"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(ContainsAll(r.out, {"duet replay: " + server.url() + " (model fake-model)",
                                  "7 total, 3 completed, 1 rejected, 3 failed"}))
      << r;
  ExpectMetricsSchema(out, RunKind::kLive);

  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), kMixedRequests);
  const std::vector<std::string> arrivals = {"0.000000", "0.300000", "0.300000", "0.350000",
                                             "0.400000", "0.450000", "0.450000"};
  for (std::size_t i = 0; i < kMixedRequests; ++i) {
    EXPECT_EQ(csv.Get(i, "request_id"), std::to_string(i));
    EXPECT_EQ(csv.Get(i, "arrival_s"), arrivals[i]) << "request " << i;
    // No "duet" fields from this server: no queue time, no instance.
    EXPECT_EQ(csv.Get(i, "queue_ms"), "") << "request " << i;
    EXPECT_EQ(csv.Get(i, "prefill_instance"), "") << "request " << i;
    EXPECT_EQ(csv.Get(i, "kv_transfer_ms"), "") << "request " << i;
  }
  // Completed requests: output tokens from usage, TTFT from the first chunk, E2E at the last.
  struct Expected {
    std::size_t row;
    int output_tokens, chunks, cached_tokens;
  };
  for (const Expected& e :
       {Expected{0, 10, 10, 0}, Expected{1, 9, 9, 1024}, Expected{2, 20, 10, 0}}) {
    const std::string id = "request " + std::to_string(e.row);
    EXPECT_EQ(csv.Get(e.row, "status"), "completed") << id << ": " << csv.Get(e.row, "reason");
    EXPECT_EQ(csv.Number(e.row, "output_tokens"), e.output_tokens) << id;
    EXPECT_EQ(csv.Number(e.row, "cached_tokens"), e.cached_tokens) << id;
    const double ttft = csv.Number(e.row, "ttft_ms"), e2e = csv.Number(e.row, "e2e_ms");
    EXPECT_TRUE(Late(ttft, kFirstChunkMs, id + " TTFT"));
    EXPECT_TRUE(Late(e2e, kFirstChunkMs + kGapMs * (e.chunks - 1), id + " E2E"));
    const double tpot = csv.Number(e.row, "tpot_ms");
    EXPECT_NEAR(tpot, (e2e - ttft) / (e.output_tokens - 1), 0.002) << id;
    // TTST: first token chunk to second, one gap (less when the two arrive in one read).
    const double ttst = csv.Number(e.row, "ttst_ms");
    EXPECT_GE(ttst, 0) << id;
    EXPECT_LE(ttst, kGapMs + kLateMs) << id;
    EXPECT_NEAR(tpot, kGapMs * (e.chunks - 1) / (e.output_tokens - 1), 3.0) << id;
  }
  EXPECT_EQ(csv.Get(3, "status"), "rejected");
  EXPECT_TRUE(ContainsAll(csv.Get(3, "reason"), {"HTTP 429", "queue full"}));
  EXPECT_EQ(csv.Get(3, "ttft_ms"), "");
  EXPECT_EQ(csv.Get(4, "status"), "failed");
  EXPECT_TRUE(ContainsAll(csv.Get(4, "reason"), {"closed mid-stream", "3 token chunks"}));
  EXPECT_EQ(csv.Get(5, "status"), "failed");
  EXPECT_TRUE(ContainsAll(csv.Get(5, "reason"), {"malformed stream", "not JSON"}));
  EXPECT_EQ(csv.Get(6, "status"), "failed");
  EXPECT_TRUE(ContainsAll(csv.Get(6, "reason"), {"HTTP 500", "boom"}));
  for (std::size_t i = 3; i < kMixedRequests; ++i) EXPECT_EQ(csv.Get(i, "e2e_ms"), "");

  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["requests"]["completed"], 3);
  EXPECT_EQ(s["requests"]["rejected"], 1);
  EXPECT_EQ(s["requests"]["failed"], 3);
  // ITL pools the gaps between token chunks: 9 + 8 + 9, each about kGapMs.
  const auto& itl = s["itl_ms"];
  EXPECT_NEAR(itl["mean"].get<double>(), kGapMs, 4.0) << itl;
  EXPECT_NEAR(itl["p50"].get<double>(), kGapMs, 4.0) << itl;
  EXPECT_TRUE(Late(s["ttft_ms"]["p50"].get<double>(), kFirstChunkMs, "TTFT p50"));
  // No queue time from this server: the distribution is empty (zeros).
  EXPECT_EQ(s["queue_ms"]["max"], 0);
  // Prefix cache: the prompts of completed requests, and the tokens the server said it had.
  EXPECT_EQ(s["prefix_cache"]["lookup_tokens"], 1024 + 1100 + 1024);
  EXPECT_EQ(s["prefix_cache"]["hit_tokens"], 1024);
  // Duration: first arrival to the last token (request 2, at 0.3 s + 100 ms + 9 gaps).
  EXPECT_TRUE(
      Late(s["duration_s"].get<double>() * 1000, 300 + kFirstChunkMs + 9 * kGapMs, "duration"));
  EXPECT_NEAR(s["goodput"]["attainment"].get<double>(), 3.0 / 7.0, 1e-6);
  const auto& replay = s["replay"];
  EXPECT_EQ(replay["endpoint"], server.url());
  EXPECT_EQ(replay["model"], "fake-model");
  EXPECT_EQ(replay["sent"], kMixedRequests);
  EXPECT_EQ(
      replay["errors"],
      nlohmann::json(
          {{"http_429", 1}, {"http_500", 1}, {"closed_mid_stream", 1}, {"malformed_stream", 1}}));
  EXPECT_EQ(replay["cached_tokens_reported"], 3);
  EXPECT_EQ(replay["duet_fields_reported"], 0);
  EXPECT_EQ(replay["prompt_tokens_mismatched"], 0);
  EXPECT_EQ(replay["interrupted"], false);
  EXPECT_LT(replay["send_lag_ms"]["max"].get<double>(), kLateMs);
  EXPECT_EQ(s["run"]["trace"], trace_);
  EXPECT_EQ(s["run"]["rate_scale"], 1.0);

  // What the server received: the OpenAI request `duet replay` promises, prompts of exactly
  // the trace's lengths, and the key on every request (the model query included).
  const std::vector<nlohmann::json> bodies = server.Completions();
  ASSERT_EQ(bodies.size(), kMixedRequests);
  const std::vector<int> outputs = {10, 9, 20, 7, 13, 11, 17};
  const std::vector<std::size_t> inputs = {1024, 1100, 1024, 600, 600, 600, 600};
  std::vector<int> seen_outputs;
  for (const nlohmann::json& b : bodies) {
    EXPECT_EQ(b["model"], "fake-model");
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["temperature"], 0);
    const int max_tokens = b["max_tokens"].get<int>();
    seen_outputs.push_back(max_tokens);
    const std::size_t k = static_cast<std::size_t>(
        std::find(outputs.begin(), outputs.end(), max_tokens) - outputs.begin());
    ASSERT_LT(k, outputs.size()) << b.dump();
    EXPECT_EQ(b["prompt"].size(), inputs[k]) << "request " << k;
    for (const auto& t : b["prompt"]) {
      ASSERT_GE(t.get<int>(), 16);
      ASSERT_LT(t.get<int>(), 32000);
    }
  }
  std::sort(seen_outputs.begin(), seen_outputs.end());
  EXPECT_EQ(seen_outputs, (std::vector<int>{7, 9, 10, 11, 13, 17, 20}));
  const std::vector<std::string> auth = server.Authorizations();
  EXPECT_EQ(auth.size(), kMixedRequests + 1);  // + GET /v1/models
  for (const std::string& a : auth) EXPECT_EQ(a, "Bearer sk-test");
}

TEST_F(ReplayTest, ReadsDuetsQueueTimeAndInstance) {
  FakeServerOptions options;
  options.duet_fields = true;
  options.report_cached = false;
  FakeServer server(options);
  const std::string out = tmp_.File("out");
  const RunResult r =
      Replay({"--endpoint", server.url(), "--model", "served-name", "--trace", trace_, "--out", out,
              "--limit", "3", "--rate-scale", "2", "--vocab-size", "100", "--seed", "7"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ExpectMetricsSchema(out, RunKind::kLive);
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv.Get(1, "arrival_s"), "0.150000");  // 300 ms at twice the rate
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(csv.Get(i, "status"), "completed") << csv.Get(i, "reason");
    EXPECT_EQ(csv.Get(i, "queue_ms"), "5.500") << "request " << i;
    // The server has no prefix-cache report here: cached tokens read as 0.
    EXPECT_EQ(csv.Get(i, "cached_tokens"), "0") << "request " << i;
    EXPECT_TRUE(Late(csv.Number(i, "ttft_ms"), kFirstChunkMs, "TTFT"));
  }
  // FakeServer's instance is max_tokens % 2: 10 -> c0, 9 -> c1, 20 -> c0.
  EXPECT_EQ(csv.Get(0, "prefill_instance"), "c0");
  EXPECT_EQ(csv.Get(1, "prefill_instance"), "c1");
  EXPECT_EQ(csv.Get(1, "decode_instance"), "c1");
  EXPECT_EQ(csv.Get(2, "prefill_instance"), "c0");
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["queue_ms"]["mean"], 5.5);
  EXPECT_EQ(s["queue_ms"]["max"], 5.5);
  EXPECT_EQ(s["replay"]["model"], "served-name");
  EXPECT_EQ(s["replay"]["duet_fields_reported"], 3);
  EXPECT_EQ(s["replay"]["cached_tokens_reported"], 0);
  EXPECT_EQ(s["run"]["seed"], 7);
  EXPECT_EQ(s["run"]["vocab_size"], 100);
  ASSERT_EQ(server.Completions().size(), 3u);
  ASSERT_EQ(server.Authorizations().size(), 3u);
  for (const nlohmann::json& b : server.Completions()) {
    EXPECT_EQ(b["model"], "served-name");
    for (const auto& t : b["prompt"]) {
      ASSERT_GE(t.get<int>(), 16);
      ASSERT_LT(t.get<int>(), 100);
    }
  }
  for (const std::string& a : server.Authorizations()) EXPECT_EQ(a, "") << "no key was given";
}

// A server that says it loaded more tokens from its KV tiers than it reports cached: the reply
// is malformed, and the request fails saying why instead of counting negative GPU hits.
TEST_F(ReplayTest, TierHitsBeyondTheCachedTokensAreAMalformedReply) {
  FakeServerOptions options;
  options.duet_fields = true;
  options.dram_hit_tokens = 1 << 20;
  FakeServer server(options);
  const std::string out = tmp_.File("out");
  const RunResult r = Replay({"--endpoint", server.url(), "--trace", trace_, "--out", out,
                              "--limit", "2", "--vocab-size", "100"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 2u);
  EXPECT_EQ(csv.Get(1, "status"), "failed");
  EXPECT_TRUE(ContainsAll(csv.Get(1, "reason"),
                          {"malformed reply", "duet.tier_hit_tokens add up to 1048576",
                           "more than the 1024 cached tokens"}))
      << csv.Get(1, "reason");
}

// The KV transfer's parts split the transfer a reply reports: parts without it, or beyond it
// with a message part (only a message read as 0, its two workers' clocks apart, lets them
// exceed it), are a malformed reply, and the request fails saying why. Parts beyond the whole
// with a message of 0 keep the wait and the pull the server measured.
TEST_F(ReplayTest, KvTransferPartsBeyondTheTransferAreAMalformedReply) {
  // requests.csv of one request to a server whose reply's "duet" object also has `extra`.
  const auto replay_one = [&](const nlohmann::json& extra, const std::string& name) {
    FakeServerOptions options;
    options.duet_fields = true;
    options.duet_extra = extra;
    FakeServer server(options);
    const std::string out = tmp_.File(name);
    const RunResult r = Replay({"--endpoint", server.url(), "--trace", trace_, "--out", out,
                                "--limit", "1", "--vocab-size", "100"});
    EXPECT_EQ(r.exit_code, 0) << r;
    return Csv::Read(out + "/requests.csv");
  };
  const nlohmann::json parts = {{"message", 1}, {"wait", 2}, {"pull", 3}};
  for (const auto& [extra, reason] :
       {std::pair{
            nlohmann::json{
                {"prefill_done_ms", 30}, {"kv_transfer_ms", 5.5}, {"kv_transfer_parts_ms", parts}},
            "duet.kv_transfer_parts_ms add up to 6 ms, more than the kv_transfer_ms 5.5, with a "
            "message part that is not 0"},
        std::pair{nlohmann::json{{"prefill_done_ms", 30}, {"kv_transfer_parts_ms", parts}},
                  "duet.kv_transfer_parts_ms without the prefill_done_ms and kv_transfer_ms"}}) {
    const Csv csv = replay_one(extra, "out-" + std::to_string(extra.size()));
    ASSERT_EQ(csv.size(), 1u);
    EXPECT_EQ(csv.Get(0, "status"), "failed") << extra;
    EXPECT_TRUE(ContainsAll(csv.Get(0, "reason"), {"malformed reply", reason}))
        << csv.Get(0, "reason");
  }
  // Parts that add up to the transfer, and parts beyond it with a message of 0, are kept.
  for (const auto& [transfer_ms, message_ms] : {std::pair{6.0, 1}, std::pair{4.0, 0}}) {
    nlohmann::json kept = parts;
    kept["message"] = message_ms;
    const Csv csv = replay_one(
        {{"prefill_done_ms", 30}, {"kv_transfer_ms", transfer_ms}, {"kv_transfer_parts_ms", kept}},
        "kept-" + std::to_string(message_ms));
    ASSERT_EQ(csv.size(), 1u);
    EXPECT_EQ(csv.Get(0, "status"), "completed") << csv.Get(0, "reason");
    EXPECT_EQ(csv.Get(0, "kv_transfer_ms"), transfer_ms == 6 ? "6.000" : "4.000");
    EXPECT_EQ(csv.Get(0, "kv_message_ms"), message_ms == 1 ? "1.000" : "0.000");
    EXPECT_EQ(csv.Get(0, "kv_wait_ms"), "2.000");
    EXPECT_EQ(csv.Get(0, "kv_pull_ms"), "3.000");
  }
}

// llama.cpp's server streams a chunk per token with empty text where a token ends inside a
// UTF-8 character (with random weights, nearly every token), and finishes in a chunk of its own.
// Tokens are timed by their chunks, not by their text, and a reply ends with its stream.
TEST_F(ReplayTest, TimesTokensWhoseTextIsEmpty) {
  FakeServerOptions options;
  options.llama_cpp_chunks = true;
  FakeServer server(options);
  const std::string out = tmp_.File("out");
  const RunResult r =
      Replay({"--endpoint", server.url(), "--trace", trace_, "--out", out, "--limit", "2"});
  ASSERT_EQ(r.exit_code, 0) << r;
  ExpectMetricsSchema(out, RunKind::kLive);
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 2u);
  const double finish_ms = options.finish_delay_s * 1000;
  for (const auto& [row, tokens] : {std::pair<std::size_t, int>{0, 10}, {1, 9}}) {
    const std::string id = "request " + std::to_string(row);
    ASSERT_EQ(csv.Get(row, "status"), "completed") << id << ": " << csv.Get(row, "reason");
    EXPECT_EQ(csv.Number(row, "output_tokens"), tokens) << id;
    const double ttft = csv.Number(row, "ttft_ms"), e2e = csv.Number(row, "e2e_ms");
    EXPECT_TRUE(Late(ttft, kFirstChunkMs, id + " TTFT"));
    EXPECT_TRUE(Late(e2e, kFirstChunkMs + kGapMs * (tokens - 1) + finish_ms, id + " E2E"));
    EXPECT_NEAR(csv.Number(row, "tpot_ms"), (kGapMs * (tokens - 1) + finish_ms) / (tokens - 1), 3.0)
        << id;
  }
  // The gaps between token chunks: 9 + 8, each about kGapMs (the finish is not a token).
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_NEAR(s["itl_ms"]["p50"].get<double>(), kGapMs, 4.0) << s["itl_ms"];
  EXPECT_LT(s["itl_ms"]["max"].get<double>(), kGapMs + kLateMs) << s["itl_ms"];
}

// A closed loop of 3 users over 9 normal 4-token requests (about 160 ms each): 3 in flight at
// most, the first 3 sent at 0 and every later one when an earlier one's reply ended.
TEST_F(ReplayTest, ClosedLoopSendsWhenAUserIsFree) {
  FakeServer server;
  std::string text;
  for (int i = 0; i < 9; ++i)
    text += R"({"timestamp": )" + std::to_string(i * 1000) +
            R"(, "input_length": 64, "output_length": 4, "hash_ids": []})" + "\n";
  const std::string trace = tmp_.Write("nine.jsonl", text);
  const std::string out = tmp_.File("out");
  const RunResult r =
      Replay({"--endpoint", server.url(), "--trace", trace, "--out", out, "--concurrency", "3"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["replay"]["max_in_flight"], 3);
  EXPECT_EQ(s["requests"]["completed"], 9);
  EXPECT_EQ(s["sessions"]["count"], 3);  // one per user
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 9u);
  auto finished = [&](std::size_t i) {
    return csv.Number(i, "arrival_s") * 1e3 + csv.Number(i, "e2e_ms");
  };
  for (std::size_t i = 0; i < 9; ++i) {
    const double sent_ms = csv.Number(i, "arrival_s") * 1e3;
    if (i < 3) {
      EXPECT_EQ(sent_ms, 0.0) << "request " << i;
      continue;
    }
    bool after_a_reply = false;
    for (std::size_t j = 0; j < i; ++j)
      after_a_reply |= sent_ms >= finished(j) && sent_ms <= finished(j) + kLateMs;
    EXPECT_TRUE(after_a_reply) << "request " << i << " sent at " << sent_ms << " ms";
  }

  // With a think time past the duration, the first three are all that is sent.
  const std::string out2 = tmp_.File("out2");
  const RunResult r2 =
      Replay({"--endpoint", server.url(), "--trace", trace, "--out", out2, "--concurrency", "3",
              "--think-time-ms", "1000", "--duration", "0.5"});
  ASSERT_EQ(r2.exit_code, 0) << r2;
  const nlohmann::json s2 = ReadJson(out2 + "/summary.json");
  EXPECT_EQ(s2["requests"]["total"], 3);
  EXPECT_EQ(s2["replay"]["sent"], 3);
  EXPECT_LT(s2["replay"]["wall_s"].get<double>(), 1.0);
}

// Session turns live: a later turn is sent its think time after its predecessor's reply ended,
// and its prompt is the predecessor's prompt, the reply's very token ids (which the request
// that later turns continue asked for), then new tokens of its own. An agent step that waits
// for two requests (after) is sent its delay after the later one finished, with a prompt of
// its own.
TEST_F(ReplayTest, SessionTurnsCarryThePredecessorsPromptAndReply) {
  FakeServer server;
  const std::string trace = tmp_.Write(
      "sessions.jsonl",
      R"({"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1], "session_id": "a"}
{"timestamp": 50, "input_length": 32, "output_length": 5, "hash_ids": [2], "session_id": "b", "request_id": "b1"}
{"input_length": 10, "output_length": 3, "session_id": "a", "delay": 100}
{"input_length": 6, "output_length": 2, "session_id": "a", "request_id": "a3"}
{"timestamp": 0, "input_length": 20, "output_length": 2, "hash_ids": [5], "after": ["b1", "a3"], "delay": 50}
)");
  const std::string out = tmp_.File("out");
  // Prompt ids below the fake server's reply ids: where each came from shows.
  const RunResult r = Replay({"--endpoint", server.url(), "--trace", trace, "--out", out,
                              "--vocab-size", std::to_string(replay_test::kReplyTokenBase)});
  ASSERT_EQ(r.exit_code, 0) << r;
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["requests"]["completed"], 5) << s.dump(2);
  EXPECT_EQ(s["sessions"]["count"], 2);
  EXPECT_EQ(s["replay"]["prompt_tokens_mismatched"], 0);

  // The bodies by prompt length: 64, 32, then 64 + 4 + 10 = 78 and 78 + 3 + 6 = 87.
  std::map<std::size_t, nlohmann::json> by_length;
  for (const nlohmann::json& b : server.Completions()) by_length[b["prompt"].size()] = b;
  ASSERT_EQ(by_length.size(), 5u);
  ASSERT_TRUE(by_length.count(64) && by_length.count(78) && by_length.count(87));
  const auto p0 = by_length[64]["prompt"].get<std::vector<std::int32_t>>();
  const auto p1 = by_length[78]["prompt"].get<std::vector<std::int32_t>>();
  const auto p2 = by_length[87]["prompt"].get<std::vector<std::int32_t>>();
  auto reply = [](int n) {
    std::vector<std::int32_t> ids;
    for (int t = 0; t < n; ++t) ids.push_back(replay_test::kReplyTokenBase + t);
    return ids;
  };
  auto expect_continues = [&](const std::vector<std::int32_t>& turn,
                              const std::vector<std::int32_t>& parent, int reply_tokens) {
    std::vector<std::int32_t> context = parent;
    const std::vector<std::int32_t> ids = reply(reply_tokens);
    context.insert(context.end(), ids.begin(), ids.end());
    ASSERT_GT(turn.size(), context.size());
    EXPECT_TRUE(std::equal(context.begin(), context.end(), turn.begin()));
    // The new tokens are the turn's own: no reply id, none of the context repeated.
    for (std::size_t i = context.size(); i < turn.size(); ++i)
      EXPECT_LT(turn[i], replay_test::kReplyTokenBase) << i;
  };
  expect_continues(p1, p0, 4);
  expect_continues(p2, p1, 3);
  // Only the requests that later turns continue ask for their reply's ids.
  EXPECT_EQ(by_length[64].value("return_token_ids", false), true);
  EXPECT_EQ(by_length[78].value("return_token_ids", false), true);
  EXPECT_FALSE(by_length[87].contains("return_token_ids"));
  EXPECT_FALSE(by_length[32].contains("return_token_ids"));
  EXPECT_FALSE(by_length[20].contains("return_token_ids"));

  // requests.csv in trace order: sessions, prompts sent, and the think time after the reply.
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 5u);
  const std::vector<std::string> sessions = {"0", "1", "0", "0", ""};  // the step has none
  const std::vector<double> inputs = {64, 32, 78, 87, 20};
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(csv.Get(i, "session"), sessions[i]) << i;
    EXPECT_EQ(csv.Number(i, "input_tokens"), inputs[i]) << i;
  }
  auto finished_ms = [&](std::size_t i) {
    return csv.Number(i, "arrival_s") * 1e3 + csv.Number(i, "e2e_ms");
  };
  EXPECT_TRUE(Late(csv.Number(2, "arrival_s") * 1e3, finished_ms(0) + 100, "turn 2's send"));
  EXPECT_TRUE(Late(csv.Number(3, "arrival_s") * 1e3, finished_ms(2), "turn 3's send"));
  EXPECT_TRUE(Late(csv.Number(4, "arrival_s") * 1e3, std::max(finished_ms(1), finished_ms(3)) + 50,
                   "the agent step's send"));
}

// A turn cannot be sent when its predecessor was not served (rejected: HTTP 429), nor when the
// server did not return the reply's token ids: it is rejected with the reason, and the run goes
// on.
TEST_F(ReplayTest, TurnsWhosePredecessorCannotBeContinuedAreRejected) {
  FakeServerOptions options;
  options.token_ids = false;
  FakeServer server(options);
  const std::string trace = tmp_.Write(
      "sessions.jsonl",
      R"({"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1], "session_id": "a"}
{"timestamp": 0, "input_length": 64, "output_length": 7, "hash_ids": [2], "session_id": "b"}
{"input_length": 10, "output_length": 3, "session_id": "a"}
{"input_length": 10, "output_length": 3, "session_id": "b"}
{"input_length": 10, "output_length": 3, "session_id": "b"}
{"timestamp": 0, "input_length": 16, "output_length": 2, "hash_ids": [3]}
)");
  const std::string out = tmp_.File("out");
  const RunResult r = Replay({"--endpoint", server.url(), "--trace", trace, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(server.Completions().size(), 3u);  // the three first turns
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["requests"]["total"], 6);
  EXPECT_EQ(s["requests"]["completed"], 2);
  EXPECT_EQ(s["replay"]["errors"], nlohmann::json({{"http_429", 1}, {"dependency", 3}}));
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 6u);
  EXPECT_EQ(csv.Get(0, "status"), "completed");
  EXPECT_EQ(csv.Get(1, "status"), "rejected");
  EXPECT_EQ(csv.Get(2, "status"), "rejected");
  EXPECT_TRUE(ContainsAll(csv.Get(2, "reason"), {"dependency unusable: request 0 completed",
                                                 "0 token ids for 4", "return_token_ids"}))
      << csv.Get(2, "reason");
  EXPECT_EQ(csv.Get(3, "reason"), "dependency not completed: request 1 was rejected");
  EXPECT_EQ(csv.Get(4, "reason"), "dependency not completed: request 3 was rejected");
  EXPECT_EQ(csv.Get(5, "status"), "completed");
  ExpectMetricsSchema(out, RunKind::kLive);
}

// SIGINT ends a run early: the request in flight fails ("interrupted"), every request not sent
// yet is recorded as not sent, whatever order the trace's dependencies send them in (here a
// later turn, due in a minute, waits while a request after it in arrival order was sent), and
// the files are written.
TEST_F(ReplayTest, SigintRecordsTheRequestsNotSentAndWritesTheFiles) {
  FakeServer server;
  const std::string trace = tmp_.Write(
      "sessions.jsonl",
      R"({"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1], "session_id": "a"}
{"timestamp": 300, "input_length": 32, "output_length": 60, "hash_ids": [2]}
{"input_length": 10, "output_length": 4, "session_id": "a", "delay": 60000}
)");
  const std::string out = tmp_.File("out");
  const pid_t pid = SpawnDuet(
      {"replay", "--endpoint", server.url(), "--trace", trace, "--out", out, "--progress", "never"},
      tmp_.File("stderr"));
  ASSERT_GE(pid, 0);
  // The second request is streaming (1.3 s of chunks) once the server has its body.
  bool streaming = false;
  for (int i = 0; i < 300 && !streaming; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    streaming = server.Completions().size() == 2;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGINT);
  const std::optional<int> status = WaitForExit(pid, std::chrono::seconds(6));
  ASSERT_TRUE(streaming) << "the second request was never sent";
  ASSERT_TRUE(status && WIFEXITED(*status)) << "duet replay did not exit after SIGINT";
  EXPECT_EQ(WEXITSTATUS(*status), 1) << ReadFile(tmp_.File("stderr"));

  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["replay"]["interrupted"], true);
  EXPECT_EQ(s["replay"]["errors"], nlohmann::json({{"interrupted", 1}, {"not_sent", 1}}));
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(csv.Get(i, "request_id"), std::to_string(i));
  EXPECT_EQ(csv.Get(0, "status"), "completed");
  EXPECT_EQ(csv.Get(1, "reason"), "interrupted before the reply ended");
  EXPECT_EQ(csv.Get(2, "reason"), "not sent: the run was interrupted");
  ExpectMetricsSchema(out, RunKind::kLive);
}

TEST_F(ReplayTest, TimeoutFailsSlowRequestsAndTheRunEnds) {
  FakeServer server;
  const std::string out = tmp_.File("out");
  const RunResult r = Replay({"--endpoint", server.url(), "--model", "m", "--trace", trace_,
                              "--out", out, "--limit", "2", "--timeout", "0.05"});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(csv.Get(i, "status"), "failed");
    EXPECT_TRUE(ContainsAll(csv.Get(i, "reason"), {"timeout", "0.05 s"}));
  }
  const nlohmann::json s = ReadJson(out + "/summary.json");
  EXPECT_EQ(s["replay"]["errors"], nlohmann::json({{"timeout", 2}}));
  // Both requests end at their timeout, not when the server finishes (0.3 + 0.26 s).
  EXPECT_LT(s["replay"]["wall_s"].get<double>(), 0.3 + 0.05 + kLateMs / 1000);
}

TEST_F(ReplayTest, AzureRequestsShareNoPrefix) {
  FakeServer server;
  const std::string azure = tmp_.Write("azure.csv",
                                       "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                       "2023-11-16 18:15:46.0000000,512,3\n"
                                       "2023-11-16 18:15:46.1000000,512,3\n");
  const std::string out = tmp_.File("out");
  const RunResult r = Replay({"--endpoint", server.url(), "--trace", azure, "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r;
  const Csv csv = Csv::Read(out + "/requests.csv");
  ASSERT_EQ(csv.size(), 2u);
  EXPECT_EQ(csv.Get(1, "arrival_s"), "0.100000");
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(csv.Get(i, "status"), "completed") << csv.Get(i, "reason");
    EXPECT_EQ(csv.Get(i, "cached_tokens"), "0");
  }
  const auto bodies = server.Completions();
  ASSERT_EQ(bodies.size(), 2u);
  EXPECT_NE(bodies[0]["prompt"], bodies[1]["prompt"]);
}

// ---- Runs that cannot start: one error line, the exit code, no output files ----------------

TEST_F(ReplayTest, UnreachableEndpointWritesNothing) {
  unsigned short port = 0;
  {
    FakeServer closed;  // a port that was just listening and is now closed
    port = closed.port();
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  const std::string out = tmp_.File("out");
  for (const bool with_model : {false, true}) {
    std::vector<std::string> args = {"--endpoint", url, "--trace", trace_, "--out", out};
    if (with_model) args.insert(args.end(), {"--model", "m"});
    const RunResult r = Replay(args);
    EXPECT_EQ(r.exit_code, 1) << r;
    EXPECT_TRUE(ContainsAll(r.err, {"duet: error: ", url, "connect", "refused"})) << r;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r;
    EXPECT_FALSE(fs::exists(out)) << r;
  }
}

TEST_F(ReplayTest, ServerWithoutModelListWritesNothing) {
  FakeServerOptions options;
  options.list_models = false;
  FakeServer server(options);
  const std::string out = tmp_.File("out");
  const RunResult r = Replay({"--endpoint", server.url(), "--trace", trace_, "--out", out});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_TRUE(ContainsAll(r.err, {"/v1/models", "HTTP 404", "Not Found", "--model"})) << r;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(server.Completions().empty());
}

TEST_F(ReplayTest, BadCommandLinesAndTracesWriteNothing) {
  FakeServer server;
  const std::string out = tmp_.File("out");
  const std::string bad_trace = tmp_.Write("bad.jsonl",
                                           "{\"timestamp\": 0, \"input_length\": 10, "
                                           "\"output_length\": 2, \"hash_ids\": [1]}\n{oops\n");
  const std::string session_trace = tmp_.Write(
      "session.jsonl",
      "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"session_id\": 1}\n"
      "{\"input_length\": 10, \"output_length\": 2, \"session_id\": 1}\n");
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {{"--endpoint", "ftp://127.0.0.1", "--trace", trace_}, 2, {"--endpoint", "'ftp'"}},
      {{"--endpoint", "https://127.0.0.1", "--trace", trace_}, 2, {"--endpoint", "https"}},
      {{"--endpoint", "http://127.0.0.1:99999", "--trace", trace_}, 2, {"port '99999'"}},
      {{"--endpoint", "127.0.0.1:8000", "--trace", trace_}, 2, {"is not a URL"}},
      {{"--endpoint", server.url(), "--trace", trace_, "--vocab-size", "16"}, 2, {"--vocab-size"}},
      {{"--endpoint", server.url(), "--trace", trace_, "--timeout", "0"}, 2, {"--timeout"}},
      {{"--endpoint", server.url(), "--trace", trace_, "--progress", "maybe"}, 2, {"--progress"}},
      {{"--endpoint", server.url(), "--trace", trace_, "--rate-scale", "0"}, 2, {"--rate-scale"}},
      {{"--endpoint", server.url(), "--trace", session_trace, "--concurrency", "2"},
       2,
       {session_trace, "closed loop", "follow others"}},
      {{"--trace", trace_}, 2, {"--endpoint"}},
      {{"--endpoint", server.url()}, 2, {"--trace"}},
      {{"--endpoint", server.url(), "--trace", bad_trace}, 1, {bad_trace + ":2:", "invalid JSON"}},
      {{"--endpoint", server.url(), "--trace", tmp_.File("missing.jsonl")}, 1, {"missing.jsonl"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--out", out});
    const RunResult r = Replay(args);
    EXPECT_EQ(r.exit_code, c.exit_code) << r;
    EXPECT_EQ(r.err.rfind("duet: error: ", 0), 0u) << r;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r;
    for (const std::string& part : c.message) EXPECT_TRUE(ContainsAll(r.err, {part})) << r;
    EXPECT_FALSE(fs::exists(out)) << r;
  }
  EXPECT_TRUE(server.Completions().empty());
}

// The live schema check is strict in its own way: a "sim" section fails it.
TEST_F(ReplayTest, LiveSchemaRejectsASimSection) {
  FakeServer server;
  const std::string out = tmp_.File("out");
  ASSERT_EQ(Replay({"--endpoint", server.url(), "--trace", trace_, "--out", out, "--limit", "1"})
                .exit_code,
            0);
  nlohmann::json s = ReadJson(out + "/summary.json");
  s["sim"] = {{"wall_s", 0}, {"simulated_s", 0}, {"events", 0}};
  WriteJson(out + "/summary.json", s);
  EXPECT_NONFATAL_FAILURE(ExpectMetricsSchema(out, RunKind::kLive), "no \"sim\" section");
  ExpectMetricsSchema(out, RunKind::kSimulated);
}

}  // namespace
}  // namespace duet::e2e
