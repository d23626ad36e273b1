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
          {"wakes", woke_s.size()},
          {"wake_ms", woke_s.empty() ? json() : json(1e3 * policies::Summarize(woke_s).p50)},
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
        if (line.woke_s) s.woke_s.push_back(*line.woke_s);
        if (const auto wake = line.RequestWakeS()) s.request_woke_s.push_back(*wake);
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

Result<json> CompareSchedules(const std::vector<std::vector<Schedule>>& live,
                              const std::string& simulated_step_log,
                              const std::vector<VariantLog>& variants,
                              const sim::ClusterSpec& cluster) {
  auto simulated = ReadSchedules(simulated_step_log, cluster);
  if (!simulated) return simulated.status();
  std::vector<std::vector<Schedule>> variant_schedules;
  for (const VariantLog& v : variants) {
    auto s = ReadSchedules(v.step_log, cluster);
    if (!s) return s.status();
    variant_schedules.push_back(std::move(*s));
  }
  json out = {{"idle_spell_ms", 1e3 * kIdleSpellS},
              {"variants", json::array()},
              {"instances", json::object()}};
  for (const VariantLog& v : variants)
    out["variants"].push_back({{"key", v.key}, {"label", v.label}});
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
    for (std::size_t v = 0; v < variants.size(); ++v)
      entry["simulated_" + variants[v].key] = variant_schedules[v][i].ToJson();
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
      std::string variants;
      for (const json& v : schedule["variants"])
        variants += (variants.empty() ? "" : ", ") +
                    one(entry["simulated_" + v["key"].get<std::string>()][key]) + " " +
                    v["label"].get<std::string>();
      if (!variants.empty()) out += " (" + variants + ")";
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

json LiveHandOver::ToJson() const {
  return {{"wake_ms", 1e3 * wake_s},
          {"wakes", wakes},
          {"frontend_request_ms", 1e3 * frontend_request_s},
          {"requests", requests}};
}

Result<LiveHandOver> MeasureLiveHandOver(const std::vector<std::vector<Schedule>>& live,
                                         const std::vector<std::string>& live_requests_csvs,
                                         const models::StepProfile& profile) {
  std::vector<double> wakes;
  for (const std::vector<Schedule>& run : live)
    for (const Schedule& instance : run)
      wakes.insert(wakes.end(), instance.request_woke_s.begin(), instance.request_woke_s.end());
  const Seconds per_token = profile.frontend ? profile.frontend->prompt_token_s : 0;
  std::vector<double> beyond;  // each request's service time less its prompt tokens' price
  for (const std::string& csv : live_requests_csvs) {
    auto rows = policies::ParseRequestsCsvColumns(
        ReadText(csv), csv, {"arrival_s", "ttft_frontend_ms", "input_tokens"});
    if (!rows) return rows.status();
    struct HandOver {
      Seconds at_s, arrival_s;
      double input_tokens;
    };
    std::vector<HandOver> hand_overs;
    for (const policies::RequestsCsvRow& r : *rows) {
      if (!r[0] || !r[1] || !r[2])
        return Status::Error(csv +
                             ": completed records without an arrival_s, an input_tokens or a "
                             "ttft_frontend_ms");
      hand_overs.push_back({*r[0] + *r[1] / 1e3, *r[0], *r[2]});
    }
    std::sort(hand_overs.begin(), hand_overs.end(),
              [](const HandOver& a, const HandOver& b) { return a.at_s < b.at_s; });
    Seconds previous_s = 0;
    for (const HandOver& h : hand_overs) {
      const Seconds service_s = h.at_s - std::max(h.arrival_s, previous_s);
      beyond.push_back(std::max(0.0, service_s - per_token * h.input_tokens));
      previous_s = h.at_s;
    }
  }
  LiveHandOver h;
  h.wakes = static_cast<std::int64_t>(wakes.size());
  if (!wakes.empty()) h.wake_s = policies::Summarize(wakes).p50;
  h.requests = static_cast<std::int64_t>(beyond.size());
  if (!beyond.empty()) h.frontend_request_s = policies::Summarize(beyond).p50;
  return h;
}

models::StepProfile ProfileWithHandOver(const models::StepProfile& profile,
                                        const LiveHandOver& hand_over) {
  models::StepProfile out = profile;
  if (!out.host) out.host.emplace();
  out.host->wake_s = hand_over.wake_s;
  out.host->wakes = static_cast<int>(hand_over.wakes);
  if (!out.frontend) out.frontend.emplace();
  out.frontend->request_s = hand_over.frontend_request_s;
  return out;
}

}  // namespace duet::cli
