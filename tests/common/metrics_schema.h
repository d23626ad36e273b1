// The METRICS.md output schema as the end-to-end tests check it: every summary.json key (a
// number where a number is due) and the leading requests.csv columns, one row per request.
// Simulated runs (`duet simulate`) have a "sim" section; live runs (`duet replay`) have none,
// and everything else is identical, so one notebook reads both.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/sim/e2e_util.h"

namespace duet::e2e {

// The columns METRICS.md lists for requests.csv, in order.
inline const std::vector<std::string> kMetricsColumns = {
    "request_id",       "arrival_s",       "input_tokens", "output_tokens", "cached_tokens",
    "prefill_instance", "decode_instance", "queue_ms",     "ttft_ms",       "tpot_ms",
    "e2e_ms",           "kv_transfer_ms",  "status"};

enum class RunKind { kSimulated, kLive };

inline void ExpectNumber(const nlohmann::json& s, const std::string& pointer) {
  const nlohmann::json::json_pointer p(pointer);
  ASSERT_TRUE(s.contains(p)) << "summary.json lacks " << pointer;
  EXPECT_TRUE(s.at(p).is_number()) << pointer << " is " << s.at(p).dump();
}

inline void ExpectMetricsSchema(const std::string& out_dir, RunKind kind = RunKind::kSimulated) {
  const nlohmann::json s = ReadJson(out_dir + "/summary.json");
  EXPECT_EQ(s["schema"], "duet.summary/1");
  for (const char* key : {"total", "completed", "rejected", "failed"})
    ExpectNumber(s, std::string("/requests/") + key);
  ExpectNumber(s, "/duration_s");
  for (const char* dist : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"}) {
    for (const char* stat : {"mean", "p50", "p90", "p99", "max"})
      ExpectNumber(s, std::string("/") + dist + "/" + stat);
  }
  for (const char* key : {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s"})
    ExpectNumber(s, std::string("/throughput/") + key);
  ExpectNumber(s, "/goodput/slo/ttft_ms");
  ExpectNumber(s, "/goodput/slo/tpot_ms");
  ExpectNumber(s, "/goodput/requests_per_s");
  ExpectNumber(s, "/goodput/attainment");
  for (const char* key : {"lookup_tokens", "hit_tokens", "hit_rate"})
    ExpectNumber(s, std::string("/prefix_cache/") + key);
  EXPECT_TRUE(s["prefix_cache"]["by_tier"].is_object());
  ExpectNumber(s, "/kv_transfer/transfers");
  ExpectNumber(s, "/kv_transfer/bytes");
  for (const char* stat : {"mean", "p50", "p99"}) {
    ExpectNumber(s, std::string("/kv_transfer/time_ms/") + stat);
    for (const char* part : {"message", "wait", "pull"})
      ExpectNumber(s, std::string("/kv_transfer/parts_ms/") + part + "/" + stat);
  }
  if (kind == RunKind::kSimulated) {
    for (const char* key : {"wall_s", "simulated_s", "events"})
      ExpectNumber(s, std::string("/sim/") + key);
  } else {
    EXPECT_FALSE(s.contains("sim")) << "a live run has no \"sim\" section";
  }

  const Csv csv = Csv::Read(out_dir + "/requests.csv");
  ASSERT_GE(csv.header().size(), kMetricsColumns.size());
  EXPECT_EQ(
      std::vector<std::string>(csv.header().begin(), csv.header().begin() + kMetricsColumns.size()),
      kMetricsColumns);
  EXPECT_EQ(csv.size(), s["requests"]["total"].get<std::size_t>());
}

}  // namespace duet::e2e
