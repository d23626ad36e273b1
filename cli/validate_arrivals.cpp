#include "cli/validate_arrivals.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "policies/metrics.h"

namespace duet::cli {

Status WriteAtLiveSendTimes(const traces::Trace& trace, const std::string& live_csv,
                            const std::string& csv_source, const std::string& path) {
  auto rows = policies::ParseRequestsCsvColumns(live_csv, csv_source, {"request_id", "arrival_s"});
  if (!rows) return rows.status();
  std::unordered_map<std::uint64_t, Seconds> sent_at;
  for (const policies::RequestsCsvRow& r : *rows) {
    if (!r[0] || !r[1])
      return Status::Error(csv_source + ": records without a request_id or an arrival_s");
    sent_at[static_cast<std::uint64_t>(std::llround(*r[0]))] = *r[1];
  }

  traces::Trace out = trace;
  for (traces::TraceRequest& r : out.requests) {
    const auto it = sent_at.find(r.id);
    if (it == sent_at.end())
      return Status::Error(csv_source + ": no completed record of request " + std::to_string(r.id));
    r.arrival_s = it->second;
    r.delay_s = 0;
  }
  std::stable_sort(out.requests.begin(), out.requests.end(),
                   [](const auto& a, const auto& b) { return a.arrival_s < b.arrival_s; });
  if (out.block_tokens != 512) {
    std::unordered_set<std::uint64_t> seen;
    for (const traces::TraceRequest& r : out.requests)
      for (std::uint64_t id :
           std::unordered_set<std::uint64_t>(r.block_ids.begin(), r.block_ids.end()))
        if (!seen.insert(id).second)
          return Status::Error("requests share prefix blocks of " +
                               std::to_string(out.block_tokens) +
                               " tokens, which a Mooncake trace cannot carry");
    for (traces::TraceRequest& r : out.requests) r.block_ids.clear();
    out.block_tokens = 512;
  }
  return traces::WriteMooncake(out, path);
}

}  // namespace duet::cli
