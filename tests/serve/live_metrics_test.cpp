// LiveMetrics as Prometheus sees it: every METRICS.md live name exposed with its type, counters
// and histograms fed by lifecycle events (from several threads at once), gauges from the
// frontend's stats at scrape time, and every line valid text exposition format.
#include "backend/serve/live_metrics.h"

#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <thread>
#include <tuple>

namespace duet::backend::serve {
namespace {

using policies::FinishReason;
using policies::Request;
using policies::RequestState;

// The value of one series (name with its labels, exactly as exposed); NaN when absent.
double Value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::nan("");
}

void Finish(LiveMetrics& metrics, const Request& r) { metrics.OnFinished(r, r); }

Request Finished(FinishReason reason, RequestState state = RequestState::kCompleted) {
  Request r;
  r.state = state;
  r.finish_reason = reason;
  r.arrival_s = 10.0;
  r.first_scheduled_s = 10.25;
  r.first_token_s = 10.5;
  r.last_token_s = 11.0;
  r.finished_s = 11.0;
  r.input_tokens = 20;
  r.cached_tokens = 16;
  r.tier_hit_tokens = {12, 4, 0};  // of the 16: from DRAM and SSD
  return r;
}

TEST(LiveMetrics, EveryLiveNameIsExposedWithItsType) {
  LiveMetrics metrics;
  const std::string text = metrics.Scrape({});
  for (const char* gauge :
       {"duet:num_requests_running", "duet:num_requests_waiting", "duet:kv_cache_usage_perc",
        "duet:kv_blocks_used", "duet:kv_blocks_free", "duet:kv_leases_held"})
    EXPECT_NE(text.find(std::string("# TYPE ") + gauge + " gauge"), std::string::npos) << gauge;
  for (const char* counter :
       {"duet:prompt_tokens_total", "duet:generation_tokens_total", "duet:request_success_total",
        "duet:prefix_cache_queries_total", "duet:prefix_cache_hits_total",
        "duet:prefix_cache_tier_hits_total", "duet:num_preemptions_total",
        "duet:kv_leases_expired_total", "duet:kv_load_failures_total",
        "duet:kv_load_recomputes_total", "duet:forward_failures_total"})
    EXPECT_NE(text.find(std::string("# TYPE ") + counter + " counter"), std::string::npos)
        << counter;
  for (const char* histogram :
       {"duet:time_to_first_token_seconds", "duet:inter_token_latency_seconds",
        "duet:e2e_request_latency_seconds", "duet:request_queue_time_seconds",
        "duet:kv_transfer_seconds", "duet:kv_transfer_part_seconds"})
    EXPECT_NE(text.find(std::string("# TYPE ") + histogram + " histogram"), std::string::npos)
        << histogram;
  // Every finish reason is there from the start, at zero.
  for (const char* reason : {"stop", "length", "abort", "error"})
    EXPECT_EQ(
        Value(text, std::string("duet:request_success_total{finished_reason=\"") + reason + "\"}"),
        0)
        << reason;
}

TEST(LiveMetrics, EventsFeedCountersAndHistograms) {
  LiveMetrics metrics;
  Request r = Finished(FinishReason::kStop);
  metrics.OnPrefillDone(r, r);
  for (int i = 0; i < 5; ++i) metrics.OnToken(r, r, 7);
  metrics.OnTokenGaps(0.03, 4);
  metrics.OnFinished(r, r);
  Finish(metrics, Finished(FinishReason::kLength));
  Finish(metrics, Finished(FinishReason::kAbort, RequestState::kFailed));  // as engines do
  Finish(metrics, Finished(FinishReason::kError, RequestState::kFailed));
  Finish(metrics, Finished(FinishReason::kNone, RequestState::kRejected));  // not counted
  metrics.OnPreempted(r, r, 0);
  const std::string text = metrics.Scrape({});

  EXPECT_EQ(Value(text, "duet:prompt_tokens_total"), 20);
  EXPECT_EQ(Value(text, "duet:prefix_cache_queries_total"), 20);
  EXPECT_EQ(Value(text, "duet:prefix_cache_hits_total"), 16);
  EXPECT_EQ(Value(text, "duet:prefix_cache_tier_hits_total{tier=\"dram\"}"), 12);
  EXPECT_EQ(Value(text, "duet:prefix_cache_tier_hits_total{tier=\"ssd\"}"), 4);
  EXPECT_EQ(Value(text, "duet:prefix_cache_tier_hits_total{tier=\"remote\"}"), 0);
  EXPECT_EQ(Value(text, "duet:generation_tokens_total"), 5);
  EXPECT_EQ(Value(text, "duet:num_preemptions_total"), 1);
  for (const char* reason : {"stop", "length", "abort", "error"})
    EXPECT_EQ(
        Value(text, std::string("duet:request_success_total{finished_reason=\"") + reason + "\"}"),
        1)
        << reason;
  // Four finished requests (the rejected one had no latencies): TTFT 0.5 s, queue 0.25 s,
  // E2E 1 s each.
  EXPECT_EQ(Value(text, "duet:time_to_first_token_seconds_count"), 4);
  EXPECT_DOUBLE_EQ(Value(text, "duet:time_to_first_token_seconds_sum"), 2.0);
  EXPECT_EQ(Value(text, "duet:time_to_first_token_seconds_bucket{le=\"0.25\"}"), 0);
  EXPECT_EQ(Value(text, "duet:time_to_first_token_seconds_bucket{le=\"0.5\"}"), 4);
  EXPECT_DOUBLE_EQ(Value(text, "duet:request_queue_time_seconds_sum"), 1.0);
  EXPECT_DOUBLE_EQ(Value(text, "duet:e2e_request_latency_seconds_sum"), 4.0);
  EXPECT_EQ(Value(text, "duet:e2e_request_latency_seconds_bucket{le=\"+Inf\"}"), 4);
  // Four gaps of 30 ms land in the 40 ms bucket and above.
  EXPECT_EQ(Value(text, "duet:inter_token_latency_seconds_count"), 4);
  EXPECT_DOUBLE_EQ(Value(text, "duet:inter_token_latency_seconds_sum"), 0.12);
  EXPECT_EQ(Value(text, "duet:inter_token_latency_seconds_bucket{le=\"0.02\"}"), 0);
  EXPECT_EQ(Value(text, "duet:inter_token_latency_seconds_bucket{le=\"0.04\"}"), 4);
  EXPECT_EQ(Value(text, "duet:kv_transfer_seconds_count"), 0);  // colocated: no transfers
}

// PD: each KV transfer observed whole and in its three parts, which add up to it; a transfer
// whose parts were not stamped counts whole only.
TEST(LiveMetrics, KvTransfersAreObservedInTheirParts) {
  LiveMetrics metrics;
  Request r = Finished(FinishReason::kLength);
  r.prefill_done_s = 10.5;
  r.kv_arrived_s = 10.503;        // message 3 ms
  r.kv_pull_started_s = 10.5045;  // wait 1.5 ms
  r.kv_ready_s = 10.5245;         // pull 20 ms
  Finish(metrics, r);
  Finish(metrics, r);
  r.kv_arrived_s = r.kv_pull_started_s = -1;
  Finish(metrics, r);
  const std::string text = metrics.Scrape({});
  EXPECT_EQ(Value(text, "duet:kv_transfer_seconds_count"), 3);
  double parts_sum = 0;
  for (const auto& [part, seconds, bucket] : {std::tuple{"message", 0.003, "0.005"},
                                              {"wait", 0.0015, "0.005"},
                                              {"pull", 0.020, "0.025"}}) {
    const std::string series = std::string("duet:kv_transfer_part_seconds");
    const std::string label = std::string("part=\"") + part + "\"";
    EXPECT_EQ(Value(text, series + "_count{" + label + "}"), 2) << part;
    EXPECT_NEAR(Value(text, series + "_sum{" + label + "}"), 2 * seconds, 1e-9) << part;
    EXPECT_EQ(Value(text, series + "_bucket{" + label + ",le=\"" + bucket + "\"}"), 2) << part;
    parts_sum += Value(text, series + "_sum{" + label + "}");
  }
  EXPECT_NEAR(parts_sum, Value(text, "duet:kv_transfer_seconds_sum") * 2 / 3, 1e-9);
}

TEST(LiveMetrics, GaugesComeFromTheFrontendAtScrapeTime) {
  LiveMetrics metrics;
  FrontendStats stats;
  stats.load.waiting = 2;
  stats.load.running = 3;
  stats.load.kv_blocks_used = 10;
  stats.load.kv_blocks_free = 30;
  stats.load.kv_blocks_total = 40;
  std::string text = metrics.Scrape(stats);
  EXPECT_EQ(Value(text, "duet:num_requests_waiting"), 2);
  EXPECT_EQ(Value(text, "duet:num_requests_running"), 3);
  EXPECT_EQ(Value(text, "duet:kv_blocks_used"), 10);
  EXPECT_EQ(Value(text, "duet:kv_blocks_free"), 30);
  EXPECT_DOUBLE_EQ(Value(text, "duet:kv_cache_usage_perc"), 0.25);
  text = metrics.Scrape({});
  EXPECT_EQ(Value(text, "duet:kv_blocks_used"), 0);
  EXPECT_EQ(Value(text, "duet:kv_cache_usage_perc"), 0);
}

// The engines' PD counts become counters that follow them up, scrape after scrape.
TEST(LiveMetrics, PdCountsFollowTheEngines) {
  LiveMetrics metrics;
  FrontendStats stats;
  stats.load.leases_held = 4;
  stats.load.leases_expired = 1;
  stats.load.kv_load_failures = 3;
  stats.load.kv_load_recomputes = 2;
  std::string text = metrics.Scrape(stats);
  EXPECT_EQ(Value(text, "duet:kv_leases_held"), 4);
  EXPECT_EQ(Value(text, "duet:kv_leases_expired_total"), 1);
  EXPECT_EQ(Value(text, "duet:kv_load_failures_total"), 3);
  EXPECT_EQ(Value(text, "duet:kv_load_recomputes_total"), 2);
  stats.load.leases_held = 0;
  stats.load.kv_load_failures = 5;
  text = metrics.Scrape(stats);
  EXPECT_EQ(Value(text, "duet:kv_leases_held"), 0);
  EXPECT_EQ(Value(text, "duet:kv_load_failures_total"), 5);
  EXPECT_EQ(Value(text, "duet:kv_leases_expired_total"), 1);
}

// Failed forward passes, as the engines count them, become a counter that follows them up.
TEST(LiveMetrics, ForwardFailuresFollowTheEngines) {
  LiveMetrics metrics;
  FrontendStats stats;
  EXPECT_EQ(Value(metrics.Scrape(stats), "duet:forward_failures_total"), 0);
  stats.load.forward_failures = 2;
  EXPECT_EQ(Value(metrics.Scrape(stats), "duet:forward_failures_total"), 2);
  stats.load.forward_failures = 3;
  EXPECT_EQ(Value(metrics.Scrape(stats), "duet:forward_failures_total"), 3);
}

TEST(LiveMetrics, ConcurrentEventsAndScrapesLoseNothing) {
  LiveMetrics metrics;
  Request r = Finished(FinishReason::kLength);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        metrics.OnToken(r, r, 1);
        metrics.OnTokenGaps(0.01, 1);
        if (i % 100 == 0) metrics.OnFinished(r, r);
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 50; ++i) (void)metrics.Scrape({});
  });
  for (auto& t : threads) t.join();
  const std::string text = metrics.Scrape({});
  EXPECT_EQ(Value(text, "duet:generation_tokens_total"), 8000);
  EXPECT_EQ(Value(text, "duet:inter_token_latency_seconds_count"), 8000);
  EXPECT_EQ(Value(text, "duet:request_success_total{finished_reason=\"length\"}"), 80);
}

TEST(LiveMetrics, EveryLineIsTextExpositionFormat) {
  LiveMetrics metrics;
  Finish(metrics, Finished(FinishReason::kStop));
  const std::string text = metrics.Scrape({1, 2, 3, 4, 10});
  const std::regex sample(
      R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? [-+]?([0-9.eE+-]+|Inf|NaN)$)");
  const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  std::istringstream in(text);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      EXPECT_TRUE(std::regex_match(line, comment)) << line;
    } else {
      EXPECT_TRUE(std::regex_match(line, sample)) << line;
      ++samples;
    }
  }
  EXPECT_GT(samples, 50);
}

}  // namespace
}  // namespace duet::backend::serve
