#include "cli/validate_flags.h"

#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "common/text.h"
#include "policies/request.h"

namespace duet::cli {
namespace {

using json = nlohmann::json;

constexpr const char* kDistributions[] = {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"};
constexpr const char* kStatistics[] = {"mean", "p50", "p90", "p99"};
constexpr const char* kHitTiers[] = {"gpu", "dram", "ssd", "remote"};

}  // namespace

std::vector<Metric> Metrics(bool tiers) {
  std::vector<Metric> out;
  for (const char* d : kDistributions)
    for (const char* s : kStatistics)
      out.push_back(
          {std::string(d) + "." + s, json::json_pointer(std::string("/") + d + "/" + s), s});
  out.push_back({"throughput.output_tokens_per_s",
                 json::json_pointer("/throughput/output_tokens_per_s"), "throughput"});
  out.push_back(
      {"prefix_cache.hit_rate", json::json_pointer("/prefix_cache/hit_rate"), "hit_rate"});
  // With KV tiers: where the hits came from, the GPU's prefix cache and each lower tier.
  for (const char* tier : kHitTiers) {
    if (!tiers) break;
    out.push_back({std::string("prefix_cache.by_tier.") + tier + ".hit_rate",
                   json::json_pointer(std::string("/prefix_cache/by_tier/") + tier + "/hit_rate"),
                   "hit_rate"});
  }
  // Where TTFT goes (METRICS.md's breakdown): the frontend (arrival to the hand-over to the
  // engines), the queue, the prefill, and the rest to the first token (PD: the KV transfer; live
  // also the first token's way out: detokenizing, the SSE write, the client's read).
  for (const char* part :
       {"frontend.p50", "frontend.p99", "queue.p50", "prefill.p50", "transfer.p50"}) {
    std::string path = std::string("/ttft_breakdown_ms/") + part;
    path[path.rfind('.')] = '/';
    out.push_back(
        {std::string("ttft_breakdown_ms.") + part, json::json_pointer(path), "ttft_part"});
  }
  // PD: the end of a prefill to its KV usable on the decode instance (0 in both worlds when
  // colocated, so not compared there).
  for (const char* s : {"mean", "p50", "p99"})
    out.push_back({std::string("kv_transfer_ms.") + s,
                   json::json_pointer(std::string("/kv_transfer/time_ms/") + s), "kv_transfer"});
  // PD: its parts (policies::KvTransferBreakdown), which say where the transfer's error lies:
  // the KvReady message's way, the wait on the decode instance for the pull to start, the pull.
  for (const char* part : policies::KvTransferParts::kNames)
    for (const char* s : {"p50", "p99"})
      out.push_back({std::string("kv_transfer_parts_ms.") + part + "." + s,
                     json::json_pointer(std::string("/kv_transfer/parts_ms/") + part + "/" + s),
                     "kv_part"});
  // PD: TPOT without the KV transfer before each request's second token (validate derives it
  // from each run's requests.csv: ReadRunSummary), which tells the transfer's part of TPOT's
  // error from the decode steps'.
  for (const char* s : {"p50", "p99"})
    out.push_back({std::string("tpot_after_kv_transfer_ms.") + s,
                   json::json_pointer(std::string("/tpot_after_kv_transfer_ms/") + s),
                   "tpot_part"});
  return out;
}

Result<std::map<std::string, double>> ParseTolerances(const std::string& text) {
  std::map<std::string, double> out;
  if (text.empty()) return out;
  std::set<std::string> known;
  for (const Metric& m : Metrics(/*tiers=*/true)) {
    known.insert(m.name);
    known.insert(m.statistic);
  }
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (eq == std::string::npos || !known.count(key))
      return Status::Error("--tolerance: '" + Excerpt(item, 40) +
                           "' is not METRIC=PERCENT (METRIC: mean, p50, p90, p99, throughput, "
                           "hit_rate, kv_transfer, kv_part, ttft_part, tpot_part, or one "
                           "metric such as ttft_ms.p50)");
    char* end = nullptr;
    const std::string value = item.substr(eq + 1);
    const double pct = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(pct >= 0) || !std::isfinite(pct))
      return Status::Error("--tolerance: '" + Excerpt(item, 40) + "': a percentage >= 0");
    out[key] = pct;
  }
  return out;
}

Result<std::vector<double>> ParseRateScales(const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const double r = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(r > 0) || r > 1e6)
      return Status::Error("--rate-scales: '" + Excerpt(item, 40) +
                           "' is not a rate scale in (0, 1e6]");
    out.push_back(r);
  }
  if (out.empty() || out.size() > 8)
    return Status::Error("--rate-scales: give 1 to 8 rate scales, e.g. 0.5,1,2");
  return out;
}

}  // namespace duet::cli
