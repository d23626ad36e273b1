// Metrics: SLO parsing, percentiles (numpy's linear interpolation), the summary's fields and
// the requests.csv format of METRICS.md.
#include "policies/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace duet::policies {
namespace {

TEST(Slo, ParsesKeysAndRejectsBadInput) {
  auto slo = ParseSlo("ttft=2000,tpot=100");
  ASSERT_TRUE(slo.ok()) << slo.error();
  EXPECT_EQ(*slo->ttft_ms, 2000);
  EXPECT_EQ(*slo->tpot_ms, 100);
  EXPECT_FALSE(slo->e2e_ms.has_value());
  for (const char* bad : {"ttft=abc", "ttft", "ttft=-1", "foo=1", "ttft=1,ttft=2", "", "ttft=1x"}) {
    auto r = ParseSlo(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.error().find("--slo"), std::string::npos) << r.error();
    }
  }
}

TEST(Summarize, MatchesNumpyLinearInterpolation) {
  // numpy.percentile([1,2,3,4,10], [50,90,99]) == [3, 7.6, 9.76]
  const Distribution d = Summarize({4, 1, 10, 3, 2});
  EXPECT_DOUBLE_EQ(d.mean, 4.0);
  EXPECT_DOUBLE_EQ(d.p50, 3.0);
  EXPECT_NEAR(d.p90, 7.6, 1e-12);
  EXPECT_NEAR(d.p99, 9.76, 1e-12);
  EXPECT_DOUBLE_EQ(d.max, 10);
  EXPECT_EQ(Summarize({}).count, 0u);
}

TEST(Summarize, WeightedEqualsExpanded) {
  const Distribution w = SummarizeWeighted({{5.0, 3}, {1.0, 2}, {9.0, 1}});
  const Distribution e = Summarize({5, 5, 5, 1, 1, 9});
  EXPECT_DOUBLE_EQ(w.mean, e.mean);
  EXPECT_DOUBLE_EQ(w.p50, e.p50);
  EXPECT_DOUBLE_EQ(w.p90, e.p90);
  EXPECT_DOUBLE_EQ(w.p99, e.p99);
  EXPECT_EQ(w.count, 6u);
}

// The percentiles come from a multi-rank selection, not a sort: compare with sorting the
// expanded samples, over sizes, heavy ties and weights (issue 12's speed work).
TEST(Summarize, SelectionEqualsSortingTheExpandedSamples) {
  std::mt19937_64 rng(7);
  for (int n : {1, 2, 3, 31, 33, 100, 1000, 20000}) {
    for (int distinct : {1, 3, 50, 1000000}) {
      std::vector<std::pair<double, std::int64_t>> samples;
      std::vector<double> expanded;
      for (int i = 0; i < n; ++i) {
        const double v = static_cast<double>(rng() % static_cast<std::uint64_t>(distinct)) * 0.25;
        const auto c = static_cast<std::int64_t>(rng() % 4 + 1);
        samples.emplace_back(v, c);
        for (std::int64_t k = 0; k < c; ++k) expanded.push_back(v);
      }
      std::sort(expanded.begin(), expanded.end());
      auto at = [&](double p) {
        const double pos = p * static_cast<double>(expanded.size() - 1);
        const auto lo = static_cast<std::size_t>(std::floor(pos));
        const double frac = pos - static_cast<double>(lo);
        return frac == 0 ? expanded[lo] : expanded[lo] + (expanded[lo + 1] - expanded[lo]) * frac;
      };
      const Distribution d = SummarizeWeighted(samples);
      SCOPED_TRACE(::testing::Message() << "n " << n << " distinct " << distinct);
      EXPECT_EQ(d.count, expanded.size());
      EXPECT_EQ(d.p50, at(0.50));
      EXPECT_EQ(d.p90, at(0.90));
      EXPECT_EQ(d.p99, at(0.99));
      EXPECT_EQ(d.max, expanded.back());
    }
  }
}

void Finish(MetricsCollector& m, const Request& r) { m.OnFinished(r, r); }

Request Completed(RequestId id, Seconds arrival, Seconds ttft, Seconds e2e, Tokens out) {
  Request r;
  r.id = id;
  r.arrival_s = arrival;
  r.input_tokens = 100;
  r.output_tokens = out;
  r.cached_tokens = 20;
  r.prefill_instance = 0;
  r.decode_instance = 1;
  r.first_scheduled_s = arrival + 0.01;
  r.prefill_done_s = arrival + ttft - 0.005;
  r.kv_ready_s = arrival + ttft;
  r.first_token_s = arrival + ttft;
  r.finished_s = arrival + e2e;
  r.kv_transfer_bytes = 1000;
  r.state = RequestState::kCompleted;
  return r;
}

TEST(MetricsCollector, SummaryFollowsMetricsMd) {
  MetricsCollector m;
  Finish(m, Completed(0, 0.0, 0.5, 2.5, 11));  // tpot 200 ms
  Finish(m, Completed(1, 1.0, 3.0, 4.0, 11));  // tpot 100 ms, misses ttft=2000
  Request rej;
  rej.id = 2;
  rej.arrival_s = 2;
  rej.state = RequestState::kRejected;
  rej.reason = "too long";
  Finish(m, rej);
  m.OnTokenGaps(0.1, 10);
  const auto s = m.Summary(4, *ParseSlo("ttft=2000,tpot=250"));
  EXPECT_EQ(s["schema"], "duet.summary/1");
  EXPECT_EQ(s["requests"]["total"], 4);
  EXPECT_EQ(s["requests"]["completed"], 2);
  EXPECT_EQ(s["requests"]["rejected"], 1);
  EXPECT_EQ(s["requests"]["failed"], 1);  // never finished
  EXPECT_EQ(s["requests"]["rejected_reasons"]["too long"], 1);
  EXPECT_DOUBLE_EQ(s["duration_s"].get<double>(), 5.0);  // first arrival 0 to last finish 5
  EXPECT_DOUBLE_EQ(s["ttft_ms"]["mean"].get<double>(), 1750);
  EXPECT_DOUBLE_EQ(s["tpot_ms"]["mean"].get<double>(), 150);
  EXPECT_DOUBLE_EQ(s["e2e_ms"]["max"].get<double>(), 4000);
  EXPECT_DOUBLE_EQ(s["queue_ms"]["p50"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(s["itl_ms"]["p99"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(s["throughput"]["requests_per_s"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(s["throughput"]["output_tokens_per_s"].get<double>(), 4.4);
  EXPECT_DOUBLE_EQ(s["goodput"]["requests_per_s"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(s["goodput"]["attainment"].get<double>(), 0.25);
  EXPECT_EQ(s["prefix_cache"]["lookup_tokens"], 200);
  EXPECT_EQ(s["prefix_cache"]["hit_tokens"], 40);
  EXPECT_DOUBLE_EQ(s["prefix_cache"]["hit_rate"].get<double>(), 0.2);
  EXPECT_TRUE(s["prefix_cache"]["by_tier"].contains("gpu"));
  EXPECT_EQ(s["kv_transfer"]["transfers"], 2);
  EXPECT_EQ(s["kv_transfer"]["bytes"], 2000);
  EXPECT_DOUBLE_EQ(s["kv_transfer"]["time_ms"]["mean"].get<double>(), 5);
}

// A live run (duet replay) knows a completed request was admitted but, from a server that does
// not report queue time, not when: its prompt counts as looked up, it adds no queue time. A
// failed request that never reached admission counts in neither.
TEST(MetricsCollector, CompletedWithoutAdmissionTimeCountsForThePrefixCacheOnly) {
  MetricsCollector m;
  Request live = Completed(0, 0.0, 0.5, 1.0, 4);
  live.first_scheduled_s = -1;
  live.prefill_done_s = -1;
  live.kv_ready_s = -1;
  live.input_tokens = 300;
  live.cached_tokens = 120;
  Finish(m, live);
  Request failed;
  failed.id = 1;
  failed.input_tokens = 500;
  failed.state = RequestState::kFailed;
  Finish(m, failed);
  const auto s = m.Summary(2, Slo{});
  EXPECT_EQ(s["prefix_cache"]["lookup_tokens"], 300);
  EXPECT_EQ(s["prefix_cache"]["hit_tokens"], 120);
  EXPECT_DOUBLE_EQ(s["prefix_cache"]["hit_rate"].get<double>(), 0.4);
  EXPECT_EQ(s["queue_ms"]["max"], 0);
  EXPECT_DOUBLE_EQ(s["ttft_ms"]["mean"].get<double>(), 500);
  EXPECT_EQ(s["kv_transfer"]["transfers"], 0);
}

// With no completed request there is no latency to report: null, not 0 (issue 12).
TEST(MetricsCollector, WithNoCompletedRequestLatenciesAreNull) {
  MetricsCollector m;
  const auto s = m.Summary(0, Slo{});
  for (const char* key : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"}) {
    for (const char* stat : {"mean", "p50", "p90", "p99", "max"})
      EXPECT_TRUE(s[key][stat].is_null()) << key << "." << stat;
  }
  EXPECT_TRUE(s["kv_transfer"]["time_ms"]["p99"].is_null());
  EXPECT_EQ(s["throughput"]["requests_per_s"], 0);
  EXPECT_EQ(s["goodput"]["slo"]["ttft_ms"], 0);
  EXPECT_EQ(s["kv_transfer"]["transfers"], 0);
}

// Per session: output tokens of its completed requests over its first arrival to its last
// finish. Session 0: 3 + 3 tokens over [1.0, 3.5] s = 2.4 tok/s; session 1: 3 over [4, 5.5] s =
// 2; the request with no session and the rejected one count nowhere.
TEST(MetricsCollector, SessionThroughputAndTimeToSecondToken) {
  MetricsCollector m;
  Request a = Completed(0, 1.0, 0.5, 1.5, 3), b = Completed(1, 2.0, 0.5, 1.5, 3);
  Request c = Completed(2, 4.0, 0.5, 1.5, 3), alone = Completed(3, 0.0, 0.5, 9.0, 3);
  a.session = b.session = 0;
  c.session = 1;
  a.second_token_s = 1.6;  // first token at 1.5: 100 ms after it
  c.second_token_s = 4.8;  // first at 4.5: 300 ms
  Request rejected;
  rejected.id = 4;
  rejected.session = 1;
  rejected.output_tokens = 50;
  rejected.state = RequestState::kRejected;
  for (const Request& r : {a, b, c, alone, rejected}) Finish(m, r);
  const auto s = m.Summary(5, Slo{});
  EXPECT_EQ(s["sessions"]["count"], 2);
  EXPECT_DOUBLE_EQ(s["sessions"]["output_tokens_per_s"]["mean"].get<double>(), 2.2);
  EXPECT_DOUBLE_EQ(s["sessions"]["output_tokens_per_s"]["max"].get<double>(), 2.4);
  EXPECT_DOUBLE_EQ(s["ttst_ms"]["mean"].get<double>(), 200);
  EXPECT_EQ(s["ttst_ms"]["max"], 300);
  // None: null, like every distribution without a sample.
  EXPECT_TRUE(
      MetricsCollector().Summary(0, Slo{})["sessions"]["output_tokens_per_s"]["p50"].is_null());
}

TEST(MetricsCollector, WritesRequestsCsvInIdOrderWithMetricsMdColumns) {
  MetricsCollector m;
  Finish(m, Completed(5, 1.0, 0.5, 1.5, 3));
  // Served partly from the lower tiers: 60 cached tokens, 16 from DRAM and 32 from SSD, whose
  // load took 100 ms of the 500 ms TTFT.
  Request tiered = Completed(7, 2.0, 0.5, 1.5, 3);
  tiered.cached_tokens = 60;
  tiered.tier_hit_tokens = {16, 32, 0};
  tiered.load_wait_s = 0.1;
  tiered.frontend_s = 0.004;        // 4 ms of its 10 ms to admission were the frontend's
  tiered.router_score = 1234.5678;  // written to 3 decimals; unscored requests leave it empty
  tiered.second_token_s = 2.7;
  tiered.session = 3;
  // Its 5 ms KV transfer: the KvReady message 1 ms, the wait for the pull 1.5 ms, the pull.
  tiered.kv_arrived_s = tiered.prefill_done_s + 0.001;
  tiered.kv_pull_started_s = tiered.kv_arrived_s + 0.0015;
  Finish(m, tiered);
  Request rej;
  rej.id = 2;
  rej.arrival_s = 0.25;
  rej.input_tokens = 9;
  rej.output_tokens = 1;
  rej.state = RequestState::kRejected;
  rej.reason = "needs 10, max 5";
  Finish(m, rej);
  const auto path = std::filesystem::temp_directory_path() / "duet_metrics_test.csv";
  ASSERT_TRUE(m.WriteRequestsCsv(path.string(), {"p0", "d0"}).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(),
            "request_id,arrival_s,input_tokens,output_tokens,cached_tokens,prefill_instance,"
            "decode_instance,queue_ms,ttft_ms,tpot_ms,e2e_ms,kv_transfer_ms,status,reason,"
            "gpu_hit_tokens,dram_hit_tokens,ssd_hit_tokens,remote_hit_tokens,ttft_queue_ms,"
            "ttft_load_ms,ttft_prefill_ms,ttft_transfer_ms,router_score,ttst_ms,session,"
            "ttft_frontend_ms,kv_message_ms,kv_wait_ms,kv_pull_ms\n"
            "2,0.250000,9,1,0,,,,,,,,rejected,\"needs 10, max 5\",0,0,0,0,,,,,,,,,,,\n"
            "5,1.000000,100,3,20,p0,d0,10.000,500.000,500.000,1500.000,5.000,completed,,20,0,0,0,"
            "10.000,0.000,485.000,5.000,,,,0.000,,,\n"
            "7,2.000000,100,3,60,p0,d0,10.000,500.000,500.000,1500.000,5.000,completed,,12,16,32,0,"
            "6.000,100.000,385.000,5.000,1234.568,200.000,3,4.000,1.000,1.500,2.500\n");
  // The summary splits the hits by tier and the TTFT into its parts.
  const nlohmann::json s = m.Summary(3, Slo{});
  EXPECT_EQ(s["prefix_cache"]["hit_tokens"], 80);
  EXPECT_EQ(s["prefix_cache"]["by_tier"]["gpu"]["hit_tokens"], 32);
  EXPECT_EQ(s["prefix_cache"]["by_tier"]["dram"]["hit_tokens"], 16);
  // The KV transfer's parts over the one transfer whose parts were stamped.
  EXPECT_NEAR(s["kv_transfer"]["parts_ms"]["wait"]["p50"].get<double>(), 1.5, 1e-9);
  EXPECT_NEAR(s["kv_transfer"]["parts_ms"]["pull"]["mean"].get<double>(), 2.5, 1e-9);
  EXPECT_EQ(s["prefix_cache"]["by_tier"]["ssd"]["hit_tokens"], 32);
  EXPECT_EQ(s["prefix_cache"]["by_tier"]["remote"]["hit_tokens"], 0);
  EXPECT_DOUBLE_EQ(s["ttft_breakdown_ms"]["load"]["max"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(s["ttft_breakdown_ms"]["prefill"]["mean"].get<double>(), 435.0);
  EXPECT_DOUBLE_EQ(s["ttft_breakdown_ms"]["frontend"]["max"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(s["ttft_breakdown_ms"]["queue"]["mean"].get<double>(), 8.0);
  // Read back: a column of the completed requests, past the quoted reason of the rejected one.
  auto ttft = ParseRequestsCsvColumn(text.str(), path.string(), "ttft_ms");
  ASSERT_TRUE(ttft.ok()) << ttft.error();
  EXPECT_EQ(*ttft, (std::vector<double>{500, 500}));
  auto session = ParseRequestsCsvColumn(text.str(), path.string(), "session");
  ASSERT_TRUE(session.ok()) << session.error();
  EXPECT_EQ(*session, std::vector<double>{3});  // empty values are left out
  std::filesystem::remove(path);
}

TEST(RequestsCsvColumn, QuotedFieldsAndBadFilesNameTheRecord) {
  const std::string quoted =
      "request_id,ttft_ms,status,reason\r\n0,1.5,completed,\r\n1,,failed,\"a, \"\"b\"\"\nc\"\r\n"
      "2,2.25,completed,\r\n";
  auto values = ParseRequestsCsvColumn(quoted, "q.csv", "ttft_ms");
  ASSERT_TRUE(values.ok()) << values.error();
  EXPECT_EQ(*values, (std::vector<double>{1.5, 2.25}));
  struct Case {
    std::string text, error;
  };
  for (const Case& c : std::vector<Case>{
           {"", "q.csv: empty"},
           {"request_id,status\n0,completed\n", "q.csv: the header has no ttft_ms column"},
           {"ttft_ms\n1\n", "q.csv: the header has no status column"},
           {"ttft_ms,status\n1\n", "q.csv: record 2 has 1 fields, the header 2"},
           {"ttft_ms,status\n1,completed\nx1,completed\n",
            "q.csv: record 3: ttft_ms 'x1' is not a number"},
           {"ttft_ms,status\n1e999,completed\n",
            "q.csv: record 2: ttft_ms '1e999' is not a number"},
       }) {
    auto r = ParseRequestsCsvColumn(c.text, "q.csv", "ttft_ms");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.error(), c.error);
  }
}

// Several columns read together stay aligned record by record: an empty field is an empty value
// in its row, not a shorter column.
TEST(RequestsCsvColumn, ColumnsReadTogetherKeepEachRecordsEmptyFields) {
  const std::string text =
      "request_id,output_tokens,kv_transfer_ms,status,reason\n"
      "0,1,,completed,\n"
      "1,5,2.5,completed,\n"
      "2,0,,rejected,too long\n"
      "3,7,4,completed,\n";
  auto rows = ParseRequestsCsvColumns(text, "q.csv", {"kv_transfer_ms", "output_tokens"});
  ASSERT_TRUE(rows.ok()) << rows.error();
  ASSERT_EQ(rows->size(), 3u);  // the completed records
  EXPECT_EQ((*rows)[0], (RequestsCsvRow{std::nullopt, 1.0}));
  EXPECT_EQ((*rows)[1], (RequestsCsvRow{2.5, 5.0}));
  EXPECT_EQ((*rows)[2], (RequestsCsvRow{4.0, 7.0}));
  auto missing = ParseRequestsCsvColumns(text, "q.csv", {"output_tokens", "ttft_ms"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error(), "q.csv: the header has no ttft_ms column");
}

// The engine never rewrites the spec: the record says what happened. A request a stop token
// ended reports (and the throughput counts) what it generated; one that ran to its length, or
// failed, what it asked for.
TEST(MetricsCollector, OutputTokensAreWhatAStopLeftElseWhatWasAsked) {
  Request stopped = Completed(0, 0.0, 0.5, 1.5, 20);
  stopped.generated_tokens = 7;
  stopped.finish_reason = FinishReason::kStop;
  Request ran = Completed(1, 0.0, 0.5, 1.5, 20);
  ran.generated_tokens = 20;
  ran.finish_reason = FinishReason::kLength;
  Request failed = Completed(2, 0.0, 0.5, 1.5, 20);
  failed.state = RequestState::kFailed;
  failed.generated_tokens = 3;
  failed.finish_reason = FinishReason::kError;
  EXPECT_EQ(FinishedRequest::Of(stopped, stopped).output_tokens, 7);
  EXPECT_EQ(FinishedRequest::Of(ran, ran).output_tokens, 20);
  EXPECT_EQ(FinishedRequest::Of(failed, failed).output_tokens, 20);
  MetricsCollector m;
  for (const Request& r : {stopped, ran, failed}) Finish(m, r);
  const auto s = m.Summary(3, Slo{});
  // 27 output tokens over 1.5 s; the stopped request's TPOT is (1500 - 500) / 6 ms.
  EXPECT_DOUBLE_EQ(s["throughput"]["output_tokens_per_s"].get<double>(), 18.0);
  EXPECT_DOUBLE_EQ(s["tpot_ms"]["max"].get<double>(), 166.667);
}

}  // namespace
}  // namespace duet::policies
