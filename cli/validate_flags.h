// The flags of `duet validate` that are more than a number: the metrics it compares, and the
// --tolerance and --rate-scales lists (cli/validate.cpp; fuzz/cli_validate_flags_fuzz.cpp).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace duet::cli {

// One compared number: where it is in summary.json, and what a tolerance names it by.
struct Metric {
  std::string name;  // "ttft_ms.p50", "throughput.output_tokens_per_s", "prefix_cache.hit_rate"
  nlohmann::json::json_pointer pointer;
  std::string statistic;  // "p50", ..., "throughput", "hit_rate": a tolerance's short key
};
// TTFT, TPOT, ITL and E2E at mean, p50, p90 and p99; output throughput; prefix hit rate and,
// with `tiers`, its part from the GPU's cache and from each lower tier
// ("prefix_cache.by_tier.dram.hit_rate", ...: statistic "hit_rate"); TTFT's parts (frontend at
// p50 and p99, queue, prefill and transfer at p50: statistic "ttft_part"); PD's KV transfer
// time at mean, p50 and p99 (statistic "kv_transfer") and TPOT after it at p50 and p99
// (statistic "tpot_part").
std::vector<Metric> Metrics(bool tiers);

// --tolerance "p50=5,p99=10,ttft_ms.mean=8": percent by statistic or by metric (the metric's
// own wins); empty: none. Errors name the item.
Result<std::map<std::string, double>> ParseTolerances(const std::string& text);
// --rate-scales "0.5,1,2": 1 to 8 scales in (0, 1e6].
Result<std::vector<double>> ParseRateScales(const std::string& text);

}  // namespace duet::cli
