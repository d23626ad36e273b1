// The engine's host time by phase (see host_time.h).
#include "models/host_time.h"

#include <numeric>

#include "common/json_util.h"

namespace duet::models {

Seconds HostStep::total() const { return std::accumulate(phase_s.begin(), phase_s.end(), 0.0); }

namespace {
constexpr std::array<std::string_view, 4> kCountNames = {"rows", "admitted", "finished", "tokens"};
constexpr double kMaxCount = 2147483648.0;

std::array<double*, 4> CountsOf(HostCounts& c) {
  return {&c.rows, &c.admitted, &c.finished, &c.tokens};
}
}  // namespace

nlohmann::json HostStepToJson(const HostStep& step) {
  nlohmann::json out = nlohmann::json::object();
  for (std::size_t p = 0; p < kHostPhases; ++p)
    out[std::string(kHostPhaseNames[p]) + "_s"] = step.phase_s[p];
  HostCounts counts = step.counts;
  const auto values = CountsOf(counts);
  for (std::size_t k = 0; k < kCountNames.size(); ++k)
    out[std::string(kCountNames[k])] = static_cast<std::int64_t>(*values[k]);
  return out;
}

Result<HostStep> ParseHostStep(const nlohmann::json& obj, const std::string& where, Seconds max_s) {
  if (!obj.is_object()) return Status::Error(where + ": must be an object");
  HostStep step;
  for (std::size_t p = 0; p < kHostPhases; ++p) {
    auto v = JsonNumberIn(obj, std::string(kHostPhaseNames[p]) + "_s", 0, max_s, where);
    if (!v) return v.status();
    step.phase_s[p] = *v;
  }
  const auto values = CountsOf(step.counts);
  for (std::size_t k = 0; k < kCountNames.size(); ++k) {
    auto v =
        JsonIntIn(obj, std::string(kCountNames[k]), 0, static_cast<std::int64_t>(kMaxCount), where);
    if (!v) return v.status();
    *values[k] = static_cast<double>(*v);
  }
  return step;
}

std::array<double, kHostColumns> HostColumns(const HostCounts& c) {
  return {1.0, c.rows, c.admitted, c.finished, c.tokens};
}

}  // namespace duet::models
