// Run metrics as METRICS.md defines them: collects each request's final record and the
// inter-token gaps, then writes summary.json and requests.csv. Simulated and real runs use
// this same collector, so their files compare line by line. Not thread-safe.
#pragma once

#include <deque>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/ports.h"
#include "policies/request.h"

namespace duet::policies {

// A finished request as METRICS.md's outputs read it: its record, with the spec's identity and
// sizes. output_tokens: what it generated when a stop ended it (before its max_tokens), else
// what it asked for (a request that ran to its length generated that many).
struct FinishedRequest : RequestRecord {
  RequestId id = 0;
  Seconds arrival_s = 0;
  Seconds frontend_s = 0;
  Tokens input_tokens = 0;
  Tokens output_tokens = 0;
  std::int64_t session = -1;

  static FinishedRequest Of(const RequestSpec& spec, const RequestRecord& record);
};

// Service-level objectives; a request meets them when it completed and meets every one given.
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2e_ms;
  bool any() const { return ttft_ms || tpot_ms || e2e_ms; }
  bool Met(const FinishedRequest& r) const;
};
// "ttft=2000,tpot=100,e2e=30000" (milliseconds, each key at most once, values > 0).
Result<Slo> ParseSlo(const std::string& text);

// Percentiles with linear interpolation between order statistics (numpy's default).
struct Distribution {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
  std::size_t count = 0;
};
Distribution Summarize(std::vector<double> values);
// The same over (value, count) samples, as if each value were repeated count times.
Distribution SummarizeWeighted(std::vector<std::pair<double, std::int64_t>> samples);
// x rounded to `digits` decimals, as summary.json writes numbers.
double Round(double x, int digits);
// {mean, p50, p90, p99, max} to 3 decimals, as summary.json writes a distribution. With
// `none_completed`, an empty one is null throughout: no request completed, so there is no
// latency to report (0 would read as instant).
nlohmann::json ToJson(const Distribution& d, bool none_completed = false);

// (value, count) samples kept for exact percentiles, with their count, sum (in the order they
// were added, so the mean does not depend on later reordering) and max kept as they arrive.
// Millions of inter-token gaps: 12 bytes each, in a deque (no doubling reallocations).
class WeightedSamples {
 public:
  struct __attribute__((packed)) Sample {
    double value;
    std::int32_t count;
  };
  void Add(double value, std::int64_t count);  // count <= 0: ignored
  // Reorders the samples (selection, not a full sort); the result is the same every time.
  Distribution Summarize();

 private:
  std::deque<Sample> samples_;
  std::int64_t n_ = 0;
  double sum_ = 0;
  double max_ = -std::numeric_limits<double>::infinity();
};

class MetricsCollector : public EventSink {
 public:
  void OnFinished(const RequestSpec& spec, const RequestRecord& record) override;
  void OnPrefillDone(const RequestSpec&, const RequestRecord&) override {}
  void OnTokenGaps(Seconds gap_s, std::int64_t count) override;
  void OnPreempted(const RequestSpec&, const RequestRecord&, InstanceId) override;

  std::size_t finished() const { return records_.size(); }
  std::int64_t preemptions() const { return preemptions_; }

  // METRICS.md summary for `total_requests` requests (those never finished count as failed).
  nlohmann::json Summary(std::size_t total_requests, const Slo& slo) const;
  // One row per finished request, by request id; instance ids printed as names[id].
  Status WriteRequestsCsv(const std::string& path,
                          const std::vector<std::string>& instance_names) const;

 private:
  std::vector<FinishedRequest> records_;
  // Inter-token gaps in ms (ITL). Summary reorders them in place: mutable.
  mutable WeightedSamples gaps_ms_;
  std::int64_t preemptions_ = 0;
};

// Columns of a requests.csv, read back (`duet validate`): one row per record whose status is
// "completed", each holding the value of every column asked for in their order, none where the
// field is empty (a request without a KV transfer has no kv_transfer_ms). `text` is the file's
// contents (RFC 4180: quoted fields may hold commas, doubled quotes and line breaks); errors name
// `source`, the record and what is wrong.
using RequestsCsvRow = std::vector<std::optional<double>>;
Result<std::vector<RequestsCsvRow>> ParseRequestsCsvColumns(
    const std::string& text, const std::string& source, const std::vector<std::string>& columns);

// One column: its values in the completed records where it is not empty.
Result<std::vector<double>> ParseRequestsCsvColumn(const std::string& text,
                                                   const std::string& source,
                                                   const std::string& column);

}  // namespace duet::policies
