// The schedules of `duet validate`'s worlds (validate_schedule.h).
#include "cli/validate_schedule.h"

#include <algorithm>
#include <cstdio>

#include "cli/validate_steps.h"
#include "policies/metrics.h"
#include "policies/step_log.h"

namespace duet::cli {

using nlohmann::json;

json Schedule::ToJson() const {
  auto ratio = [](double a, double b) { return b > 0 ? json(a / b) : json(); };
  return {{"steps", steps},
          {"busy_s", busy_s},
          {"after_idle_steps", after_idle_steps},
          {"rows_per_step_after_idle",
           ratio(static_cast<double>(after_idle_rows), static_cast<double>(after_idle_steps))},
          {"decode_tokens", decode_tokens},
          {"decode_rows_per_token", ratio(decode_rows_sum, static_cast<double>(decode_tokens))},
          {"decode_ms_per_token",
           ratio(1e3 * decode_iteration_sum_s, static_cast<double>(decode_tokens))},
          {"decode_tokens_in_mixed_pct", ratio(100.0 * static_cast<double>(decode_tokens_in_mixed),
                                               static_cast<double>(decode_tokens))}};
}

Result<std::vector<Schedule>> ReadSchedules(const std::string& step_log,
                                            const sim::ClusterSpec& cluster) {
  std::vector<Schedule> schedules(cluster.instances.size());
  std::vector<Seconds> last_end(cluster.instances.size(), -1);  // -1: no step yet
  Status bad_instance = Status::Ok();
  const Status read =
      policies::ReadStepLog(ReadText(step_log), step_log, [&](const policies::StepLogLine& line) {
        const auto i = static_cast<std::size_t>(line.instance);
        if (i >= schedules.size()) {
          if (bad_instance.ok())
            bad_instance = Status::Error(step_log + ": instance " + std::to_string(line.instance) +
                                         " is not in the cluster file");
          return;
        }
        Schedule& s = schedules[i];
        const models::StepShape& shape = line.step.shape;
        const auto rows = static_cast<std::int64_t>(shape.prefill.size()) + shape.decode_tokens;
        ++s.steps;
        s.busy_s += line.iteration_s;
        if (last_end[i] < 0 || line.start_s - last_end[i] >= kIdleSpellS) {
          ++s.after_idle_steps;
          s.after_idle_rows += rows;
        }
        last_end[i] = std::max(last_end[i], line.start_s + line.iteration_s);
        if (shape.decode_tokens > 0) {
          const auto tokens = static_cast<double>(shape.decode_tokens);
          s.decode_tokens += shape.decode_tokens;
          s.decode_rows_sum += tokens * static_cast<double>(rows);
          s.decode_iteration_sum_s += tokens * line.iteration_s;
          if (!shape.prefill.empty()) s.decode_tokens_in_mixed += shape.decode_tokens;
        }
      });
  if (!read.ok()) return read;
  if (!bad_instance.ok()) return bad_instance;
  return schedules;
}

namespace {

// Each field of the runs' figures: the median of those that are numbers (null where none is).
json MedianOf(const std::vector<json>& runs) {
  json out = json::object();
  for (const auto& field : runs.front().items()) {
    const std::string& key = field.key();
    std::vector<double> values;
    for (const json& run : runs)
      if (run[key].is_number()) values.push_back(run[key].get<double>());
    if (values.empty()) {
      out[key] = nullptr;
      continue;
    }
    out[key] = policies::Summarize(values).p50;  // as validate's metrics take the runs' median
  }
  return out;
}

}  // namespace

Result<json> CompareSchedules(const std::vector<std::string>& live_step_logs,
                              const std::string& simulated_step_log,
                              const std::string& as_live_step_log,
                              const sim::ClusterSpec& cluster) {
  std::vector<std::vector<Schedule>> live;
  for (const std::string& log : live_step_logs) {
    auto s = ReadSchedules(log, cluster);
    if (!s) return s.status();
    live.push_back(std::move(*s));
  }
  auto simulated = ReadSchedules(simulated_step_log, cluster);
  if (!simulated) return simulated.status();
  std::vector<Schedule> as_live;
  if (!as_live_step_log.empty()) {
    auto s = ReadSchedules(as_live_step_log, cluster);
    if (!s) return s.status();
    as_live = std::move(*s);
  }
  json out = {{"idle_spell_ms", 1e3 * kIdleSpellS}, {"instances", json::object()}};
  for (std::size_t i = 0; i < cluster.instances.size(); ++i) {
    std::vector<json> runs;
    std::int64_t steps = (*simulated)[i].steps;
    for (const std::vector<Schedule>& run : live) {
      runs.push_back(run[i].ToJson());
      steps += run[i].steps;
    }
    if (steps == 0) continue;
    json entry = {{"live", runs.empty() ? json() : MedianOf(runs)},
                  {"live_runs", runs},
                  {"simulated", (*simulated)[i].ToJson()}};
    if (!as_live.empty()) entry["simulated_as_live"] = as_live[i].ToJson();
    out["instances"][cluster.instances[i].name] = std::move(entry);
  }
  return out;
}

std::string ScheduleText(const json& schedule, const std::string& rate) {
  std::string text;
  for (const auto& instance : schedule["instances"].items()) {
    // (Not a structured binding: the lambdas below capture it.)
    const std::string& name = instance.key();
    const json& entry = instance.value();
    const bool as_live = entry.contains("simulated_as_live");
    // "A live [min-max], B simulated (C as live)", in the given format.
    auto figure = [&](const char* key, const char* format) {
      auto one = [&](const json& v) {
        char buffer[32] = "n/a";
        if (v.is_number()) std::snprintf(buffer, sizeof buffer, format, v.get<double>());
        return std::string(buffer);
      };
      std::string out = one(entry["live"][key]) + " live";
      if (entry["live_runs"].size() > 1) {
        double lo = 0, hi = 0;
        bool any = false;
        for (const json& run : entry["live_runs"]) {
          if (!run[key].is_number()) continue;
          const double v = run[key].get<double>();
          lo = any ? std::min(lo, v) : v;
          hi = any ? std::max(hi, v) : v;
          any = true;
        }
        if (any) out += " [" + one(lo) + "-" + one(hi) + "]";
      }
      out += ", " + one(entry["simulated"][key]) + " simulated";
      if (as_live) out += " (" + one(entry["simulated_as_live"][key]) + " as live)";
      return out;
    };
    text += "schedule at x" + rate + ", " + name + ": ";
    for (std::size_t f = 0; f < kScheduleFigures.size(); ++f)
      text += std::string(f > 0 ? "; " : "") + kScheduleFigures[f].label + " " +
              figure(kScheduleFigures[f].key, kScheduleFigures[f].format);
    text += "\n";
  }
  return text;
}

}  // namespace duet::cli
