// The comparison and the printed report of `duet validate` (validate_report.h).
#include "cli/validate_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include "cli/validate_schedule.h"
#include "cli/validate_steps.h"
#include "common/json_util.h"
#include "common/text.h"
#include "models/step_profile.h"
#include "policies/metrics.h"

namespace duet::cli {
using nlohmann::json;

bool SameFile(const std::string& a, const std::string& b) {
  auto canonical = [](const std::string& file) {
    std::error_code ec;
    const std::filesystem::path c = std::filesystem::weakly_canonical(file, ec);
    return ec ? std::filesystem::path(file) : c;
  };
  return canonical(a) == canonical(b);
}

namespace {

// What a recorded load measured beside its live runs, which --again keeps and the report prints:
// "cpu" (CpuOf's form) and, where present, "machine" (SummarizeReference's).
Status CheckMeasuredBeside(const json& load, const std::string& where) {
  const std::string cpu_at = where + ": cpu";
  if (!load.contains("cpu") || !load["cpu"].is_object())
    return FieldError(where, "cpu", "must be an object");
  const json& cpu = load["cpu"];
  std::vector<const char*> numbers = {"replay_s", "client_cpu_s", "client_cores", "server_cpu_s"};
  if (cpu.contains("steal_s"))
    numbers.insert(numbers.end(), {"serve_s", "other_cpu_s", "steal_s", "steal_pct"});
  for (const char* key : numbers)
    if (auto v = JsonNumber(cpu, key, cpu_at); !v) return v.status();
  for (const char* key : {"cores", "server_involuntary_switches"})
    if (auto v = JsonInt(cpu, key, cpu_at); !v) return v.status();
  if (!load.contains("machine") || load["machine"].is_null()) return Status::Ok();
  const std::string machine_at = where + ": machine";
  const json& m = load["machine"];
  if (!m.is_object()) return FieldError(where, "machine", "must be an object");
  for (const char* key : {"slower_pct", "min_pct", "max_pct"})
    if (auto v = JsonNumber(m, key, machine_at); !v) return v.status();
  if (!m.contains("timings") || !m["timings"].is_array() || m["timings"].empty())
    return FieldError(machine_at, "timings", "must be an array of timings with their shapes");
  for (std::size_t t = 0; t < m["timings"].size(); ++t) {
    const json& timing = m["timings"][t];
    if (!timing.is_object() || !timing.contains("shapes") || !timing["shapes"].is_array() ||
        timing["shapes"].empty())
      return FieldError(machine_at, "timings", "must be an array of timings with their shapes");
    for (const json& shape : timing["shapes"]) {
      const std::string shape_at = machine_at + ": timings[" + std::to_string(t) + "].shapes[]";
      if (auto v = JsonString(shape, "name", shape_at); !v) return v.status();
      // What the machine's speed per kind of step is read from (ProfileAtMachineSpeed), and
      // read again against another profile (RereadReference).
      for (const char* key : {"calibrated_ms", "now_ms"})
        if (auto v = JsonNumberIn(shape, key, 0, 3.6e6, shape_at); !v) return v.status();
    }
  }
  if (m.contains("shapes")) {
    if (!m["shapes"].is_object()) return FieldError(machine_at, "shapes", "must be an object");
    for (const auto& item : m["shapes"].items())
      if (auto v = JsonNumber(m["shapes"], item.key(), machine_at + ": shapes"); !v)
        return v.status();
  }
  if (m.contains("beside") && (!m["beside"].is_object() || !m["beside"].contains("shapes") ||
                               !m["beside"]["shapes"].is_object()))
    return FieldError(machine_at, "beside", "must be an object with its shapes");
  return Status::Ok();
}

// The first difference between the layout the live servers ran and the one the cluster file
// plans (ClusterLayout's form), in words.
std::string LayoutDifference(const json& recorded, const json& wanted) {
  auto text = [](const json& value) { return Excerpt(value.dump(), 300); };
  if (!recorded.is_object()) return "the layout " + text(recorded);
  const json& engine = recorded.value("engine", json());
  if (recorded.value("instances", json()) != wanted["instances"] || !engine.is_object())
    return "the instances " + text(recorded.value("instances", json())) +
           "; the cluster file plans " + text(wanted["instances"]);
  for (const auto& [key, value] : wanted["engine"].items())
    if (!engine.contains(key) || engine[key] != value)
      return "the engine setting " + key + " = " + text(engine.value(key, json())) +
             "; the cluster file gives " + text(value);
  return "the engine settings " + text(engine) + "; the cluster file gives " +
         text(wanted["engine"]);
}

}  // namespace

Result<json> RecordedReport(const json& p, const std::string& path, const RecordedRuns& wanted) {
  if (!p.is_object()) return Status::Error(path + ": not a report of duet validate");
  auto recorded_trace = JsonString(p, "trace", path);
  if (!recorded_trace) return recorded_trace.status();
  if (!SameFile(*recorded_trace, wanted.trace))
    return Status::Error(path + ": its live runs replayed " + Excerpt(*recorded_trace, 200) +
                         ", not " + Excerpt(wanted.trace, 200));
  if (!p.contains("trace_selection") || p["trace_selection"] != json(wanted.selection))
    return Status::Error(path + ": its live runs replayed the selection " +
                         Excerpt(p.value("trace_selection", json()).dump(), 200) + ", not " +
                         json(wanted.selection).dump());
  if (p.contains("kv_blocks") && p["kv_blocks"] != json(wanted.kv_blocks))
    return Status::Error(path + ": its live servers had " + DescribeJson(p["kv_blocks"]) +
                         " KV blocks per instance; the cluster file plans " +
                         std::to_string(wanted.kv_blocks));
  if (p.contains("layout") && p["layout"] != wanted.layout)
    return Status::Error(path + ": its live servers ran " +
                         LayoutDifference(p["layout"], wanted.layout));
  if (!p.contains("loads") || !p["loads"].is_array())
    return FieldError(path, "loads", "must be an array");
  if (p.contains("profile") && !p["profile"].is_object())
    return FieldError(path, "profile", "must be an object");
  if (p.contains("machine_not_timed") && !p["machine_not_timed"].is_string())
    return FieldError(path, "machine_not_timed", "must be a string");
  // The loads, at rate scales as --rate-scales bounds them, each once (a load's files are in
  // rate-R/).
  const json& loads = p["loads"];
  if (loads.empty() || loads.size() > 8) return FieldError(path, "loads", "must hold 1 to 8 loads");
  std::set<std::string> seen;
  for (std::size_t i = 0; i < loads.size(); ++i) {
    const std::string at = path + ": loads[" + std::to_string(i) + "]";
    auto rate = JsonNumber(loads[i], "rate_scale", at);
    if (!rate) return rate.status();
    if (!(*rate > 0 && *rate <= 1e6) || !seen.insert(RateText(*rate)).second)
      return FieldError(at, "rate_scale", "must be a rate scale in (0, 1e6] of no other load");
    const std::string where = path + ": the load at x" + RateText(*rate);
    auto n = JsonIntIn(loads[i], "repeats", 1, 10, where);
    if (!n) return n.status();
    if (wanted.repeats && *wanted.repeats != *n)
      return Status::Error(where + " has " + std::to_string(*n) + " live runs, not " +
                           std::to_string(*wanted.repeats));
    if (Status s = CheckMeasuredBeside(loads[i], where); !s.ok()) return s;
  }
  return p;
}

std::string PercentText(const json& value) {
  if (!value.is_number()) return "n/a";
  char text[32];
  std::snprintf(text, sizeof text, "%+.1f%%", value.get<double>());
  return text;
}

namespace {

// A band of steps_by rows or tokens (AttributeSteps' "decode_by_rows", "prefill_by_tokens"):
// "1", "2-3", "64-127".
std::string BandName(const json& band, const std::string& unit) {
  const auto from = band[unit + "_from"].get<std::int64_t>(),
             to = band[unit + "_to"].get<std::int64_t>();
  return std::to_string(from) + (to > from ? "-" + std::to_string(to) : "");
}

// A class's bands' errors ("1 +3.0%, 2-3 -1.2%") and the fit's on calibration's own
// measurements in them ("" where it measured none of them).
std::pair<std::string, std::string> BandsText(const json& bands, const std::string& unit) {
  std::string errors, calibrated;
  bool any_calibrated = false;
  for (const json& b : bands) {
    const std::string name = BandName(b, unit);
    errors += (errors.empty() ? "" : ", ") + name + " " + PercentText(b["error_pct"]);
    any_calibrated = any_calibrated || b.contains("calibration");
    calibrated += (calibrated.empty() ? "" : ", ") + name + " " +
                  (b.contains("calibration") ? PercentText(b["calibration"]["error_pct"])
                                             : std::string("n/a"));
  }
  if (!any_calibrated) calibrated.clear();
  return {errors, calibrated};
}

}  // namespace

std::string AfterText(const json& steps) {
  std::string text;
  for (const auto& [name, c] : steps["classes"].items()) {
    if (!c.contains("after") || c["after"].empty()) continue;
    std::string parts;
    for (const auto& [before, t] : c["after"].items())
      parts += (parts.empty() ? "" : ", ") + ("after " + before) + " " +
               PercentText(t["error_pct"]) + " (" + t["steps"].dump() + " steps)";
    text += (text.empty() ? "" : "; ") + name + " " + parts;
  }
  return text;
}

std::string BesideOthersText(const json& steps) {
  if (!steps.contains("beside_other_instances")) return "";
  std::string text;
  for (const auto& [name, c] : steps["beside_other_instances"].items()) {
    const json &alone = c["alone"], &beside = c["beside"];
    const json& share = beside["overlap_share"];
    char part[256];
    std::snprintf(part, sizeof part, "%s alone %s (%lld steps), beside %s (%lld steps",
                  name.c_str(), PercentText(alone["error_pct"]).c_str(),
                  static_cast<long long>(alone["steps"].get<std::int64_t>()),
                  PercentText(beside["error_pct"]).c_str(),
                  static_cast<long long>(beside["steps"].get<std::int64_t>()));
    text += (text.empty() ? "" : "; ") + std::string(part);
    if (share.is_number())
      text += ", " + std::to_string(std::lround(100 * share.get<double>())) +
              "% of their iterations overlapped";
    text += ")";
  }
  std::string bands;
  for (const json& b : steps["decode_by_rows"]) {
    if (!b.contains("beside")) continue;
    bands += (bands.empty() ? "" : ", ") + BandName(b, "rows") + " " +
             PercentText(b["alone"]["error_pct"]) + " / " + PercentText(b["beside"]["error_pct"]);
  }
  if (!bands.empty()) text += "; decode by batch rows, alone / beside: " + bands;
  return text;
}

std::string OnCpuText(const json& steps) {
  if (!steps.contains("on_cpu")) return "";
  auto share = [](const json& on_cpu) {
    if (!on_cpu["share"].is_number()) return std::string("n/a");
    char text[32];
    std::snprintf(text, sizeof text, "%.1f%%", 100 * on_cpu["share"].get<double>());
    return std::string(text);
  };
  std::string shares, errors;
  for (const auto& [name, c] : steps["classes"].items()) {
    if (!c.contains("on_cpu")) continue;
    shares += (shares.empty() ? "" : ", ") + name + " " + share(c["on_cpu"]);
    errors +=
        (errors.empty() ? "" : ", ") + name + " " + PercentText(c["on_cpu"]["priced_error_pct"]);
  }
  std::string band_shares, band_errors;
  for (const json& b : steps["decode_by_rows"]) {
    if (!b.contains("on_cpu")) continue;
    const std::string rows = BandName(b, "rows");
    band_shares += (band_shares.empty() ? "" : ", ") + rows + " " + share(b["on_cpu"]);
    band_errors += (band_errors.empty() ? "" : ", ") + rows + " " +
                   PercentText(b["on_cpu"]["priced_error_pct"]);
  }
  if (!band_shares.empty()) {
    shares += "; decode by batch rows " + band_shares;
    errors += "; decode by batch rows " + band_errors;
  }
  const json& all = steps["on_cpu"];
  return "the live forward passes' threads were on a core for " + share(all) +
         " of the passes' time (" + shares + "); against that time the cost model prices them at " +
         PercentText(all["priced_error_pct"]) + " (" + errors + ")";
}

std::string RateText(double r) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", r);
  return text;
}

std::string RunSuffix(int k) {
  if (k == 1) return "";
  std::string suffix = "-";
  suffix += std::to_string(k);
  return suffix;
}

Result<json> ReadRunSummary(const std::string& dir) {
  auto summary = ReadJsonFile(dir + "/summary.json");
  if (!summary) return summary;
  const std::string path = dir + "/requests.csv";
  auto rows = policies::ParseRequestsCsvColumns(
      ReadText(path), path, {"output_tokens", "e2e_ms", "ttft_ms", "kv_transfer_ms"});
  if (!rows) return rows.status();
  // Of the completed requests with a KV transfer (PD) and a second token.
  std::vector<double> per_token;
  for (const policies::RequestsCsvRow& r : *rows) {
    if (!r[0] || !r[1] || !r[2] || !r[3] || *r[0] < 2) continue;
    per_token.push_back((*r[1] - *r[2] - *r[3]) / (*r[0] - 1));
  }
  if (!per_token.empty()) {
    const policies::Distribution d = policies::Summarize(std::move(per_token));
    (*summary)["tpot_after_kv_transfer_ms"] = {{"p50", d.p50}, {"p99", d.p99}};
  }
  return summary;
}

json Compare(const Metric& m, const std::vector<json>& live_runs, const json& simulated) {
  std::vector<double> values;
  json per_run = json::array();
  for (const json& run : live_runs) {
    const json& v = run.contains(m.pointer) ? run[m.pointer] : json();
    per_run.push_back(v);
    if (v.is_number()) values.push_back(v.get<double>());
  }
  const json live = values.size() == live_runs.size() && !values.empty()
                        ? json(policies::Summarize(values).p50)
                        : json();
  const json& b = simulated.contains(m.pointer) ? simulated[m.pointer] : json();
  json entry = {{"live", live}, {"simulated", b}, {"error_pct", nullptr}};
  if (live_runs.size() > 1) {
    entry["live_runs"] = per_run;
    if (live.is_number()) {
      const auto [low, high] = std::minmax_element(values.begin(), values.end());
      entry["live_min"] = *low;
      entry["live_max"] = *high;
      entry["live_spread_pct"] =
          live.get<double>() != 0 ? json(100 * (*high - *low) / live.get<double>()) : json();
      if (b.is_number())
        entry["within_live_range"] = b.get<double>() >= *low && b.get<double>() <= *high;
    }
  }
  if (live.is_number() && b.is_number() && live.get<double>() != 0)
    entry["error_pct"] = 100.0 * (b.get<double>() - live.get<double>()) / live.get<double>();
  return entry;
}

namespace {

// The percent of `sorted` below `x`, ties counting half.
double PlaceAmong(const std::vector<double>& sorted, double x) {
  const auto low = std::lower_bound(sorted.begin(), sorted.end(), x);
  const auto high = std::upper_bound(low, sorted.end(), x);
  return 100 * (static_cast<double>(low - sorted.begin()) + static_cast<double>(high - low) / 2) /
         static_cast<double>(sorted.size());
}

}  // namespace

Status PlaceInLive(json& load, const std::vector<Metric>& metrics,
                   const std::vector<std::string>& live_dirs) {
  // The per-request latencies requests.csv has: each one's live values, pooled over the runs
  // (the completed requests where it is not empty), sorted.
  static const std::vector<std::string> kColumns = {"ttft_ms", "tpot_ms", "e2e_ms"};
  std::map<std::string, std::vector<double>> pooled;
  for (const std::string& dir : live_dirs) {
    const std::string path = dir + "/requests.csv";
    auto rows = policies::ParseRequestsCsvColumns(ReadText(path), path, kColumns);
    if (!rows) return rows.status();
    for (const policies::RequestsCsvRow& row : *rows)
      for (std::size_t c = 0; c < kColumns.size(); ++c)
        if (row[c]) pooled[kColumns[c]].push_back(*row[c]);
  }
  for (auto& [column, values] : pooled) std::sort(values.begin(), values.end());
  for (const Metric& m : metrics) {
    // A percentile of one of them: "/ttft_ms/p50".
    const std::string column = m.pointer.parent_pointer().to_string().substr(1);
    if (m.statistic.size() < 2 || m.statistic[0] != 'p' || !pooled.count(column)) continue;
    const std::vector<double>& values = pooled[column];
    json& entry = load["metrics"][m.name];
    if (!entry["live"].is_number()) continue;
    json place = {{"quantile", std::stod(m.statistic.substr(1))},
                  {"requests", values.size()},
                  {"live_runs", json::array()}};
    for (const json& v :
         entry.contains("live_runs") ? entry["live_runs"] : json::array({entry["live"]}))
      place["live_runs"].push_back(v.is_number() ? json(PlaceAmong(values, v.get<double>()))
                                                 : json());
    for (const auto& [key, v] : entry.items())
      if (key.rfind("simulated", 0) == 0 && v.is_number())
        place[key] = PlaceAmong(values, v.get<double>());
    entry["place_in_live"] = std::move(place);
  }
  return Status::Ok();
}

std::string PlacesText(const json& load) {
  auto p = [](const json& place) {
    char text[32];
    std::snprintf(text, sizeof text, "p%.1f", place.get<double>());
    return std::string(text);
  };
  std::string out;
  for (const char* name :
       {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50", "ttft_ms.p99", "tpot_ms.p99", "e2e_ms.p99"}) {
    if (!load["metrics"].contains(name) || !load["metrics"][name].contains("place_in_live"))
      continue;
    const json& place = load["metrics"][name]["place_in_live"];
    std::vector<double> runs;
    for (const json& v : place["live_runs"])
      if (v.is_number()) runs.push_back(v.get<double>());
    std::string text = std::string(name) + " simulated " +
                       (place.contains("simulated") ? p(place["simulated"]) : "n/a");
    if (place.contains("simulated_at_live_speed"))
      text += " (at the live runs' speed " + p(place["simulated_at_live_speed"]) + ")";
    if (runs.size() > 1) {
      const auto [low, high] = std::minmax_element(runs.begin(), runs.end());
      text += ", the live runs' own " + p(*low) + " to " + p(*high);
    }
    out += (out.empty() ? "" : "; ") + text;
  }
  return out;
}

json Sensitivity(const json& load, const std::vector<Metric>& metrics, const json& plain,
                 double scale, const std::map<std::string, json>& slower) {
  auto value = [](const json& summary, const Metric& m) {
    const json& v = summary.contains(m.pointer) ? summary[m.pointer] : json();
    return v.is_number() ? std::optional<double>(v.get<double>()) : std::nullopt;
  };
  json out = {{"scale", scale}, {"change_pct", json::object()}};
  for (const auto& [name, summary] : slower) {
    json& changes = out["change_pct"][name] = json::object();
    for (const Metric& m : metrics) {
      const auto before = value(plain, m), after = value(summary, m);
      changes[m.name] =
          before && after && *before != 0 ? json(100 * (*after / *before - 1)) : json();
    }
  }
  out["step_speed_spread_pct"] = nullptr;
  out["machine_spread_pct"] = nullptr;
  out["drift_pct"] = nullptr;
  if (!out["change_pct"].contains("all")) return out;
  // A metric's change for a price `pct` percent off on every step, taken as linear.
  auto at_every_step = [&](double pct) {
    json changes = json::object();
    for (const auto& [name, change] : out["change_pct"]["all"].items())
      changes[name] = change.is_number()
                          ? json(std::abs(change.get<double>()) / (100 * (scale - 1)) * pct)
                          : json();
    return changes;
  };
  // Each run's step speed: its live passes over their price (1 / (1 + error)).
  std::vector<double> speeds;
  for (const json& e : load["steps"]["priced_error_pct_by_run"])
    if (e.is_number()) speeds.push_back(100 / (100 + e.get<double>()));
  if (speeds.size() >= 2) {
    const auto [low, high] = std::minmax_element(speeds.begin(), speeds.end());
    out["step_speed_spread_pct"] = 100 * (*high - *low) / policies::Summarize(speeds).p50;
    // As if the runs differed only in their machine's speed, every step's alike.
    out["spread_from_step_speed_pct"] = at_every_step(out["step_speed_spread_pct"].get<double>());
  }
  // The reference shapes' readings beside the runs: their range over their median time.
  if (load.contains("machine") && load["machine"].is_object()) {
    const json& m = load["machine"];
    const double median = 100 + m["slower_pct"].get<double>();  // percent of calibration's time
    if (median > 0)
      out["machine_spread_pct"] =
          100 * (m["max_pct"].get<double>() - m["min_pct"].get<double>()) / median;
  }
  double drift = -1;
  for (const char* key : {"step_speed_spread_pct", "machine_spread_pct"})
    if (out[key].is_number()) drift = std::max(drift, out[key].get<double>());
  if (drift < 0) return out;
  out["drift_pct"] = drift;
  out["error_from_drift_pct"] = at_every_step(drift);
  return out;
}

std::string SensitivityText(const json& load) {
  if (!load.contains("sensitivity")) return "";
  const json& w = load["sensitivity"];
  static const std::vector<std::string> kShown = {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50",
                                                  "ttft_ms.p99", "tpot_ms.p99", "e2e_ms.p99"};
  std::string changes;
  for (const auto& [steps, change] : w["change_pct"].items()) {
    std::string values;
    for (const std::string& name : kShown)
      values += (values.empty() ? "" : " / ") + PercentText(change[name]);
    changes +=
        (changes.empty() ? "" : "; ") + (steps == "all" ? "every step" : steps) + " " + values;
  }
  char scale[32];
  std::snprintf(scale, sizeof scale, "x%.2f", w["scale"].get<double>());
  std::string out = "with the steps priced " + std::string(scale) +
                    ", TTFT / TPOT / E2E p50 and p99 move by " + changes;
  if (w["step_speed_spread_pct"].is_number()) {
    std::string errors, spreads;
    for (const json& x : load["steps"]["priced_error_pct_by_run"])
      errors += (errors.empty() ? "" : ", ") + PercentText(x);
    for (const std::string& name : kShown)
      spreads += (spreads.empty() ? "" : ", ") + name + " " +
                 PercentText(w["spread_from_step_speed_pct"][name]).substr(1) + " (measured " +
                 PercentText(load["metrics"][name]["live_spread_pct"]).substr(1) + ")";
    out += "; the live runs' steps ran " + PercentText(w["step_speed_spread_pct"]).substr(1) +
           " apart in speed (priced at " + errors +
           "), which as the machine's speed would spread the runs' " + spreads;
  }
  if (w["drift_pct"].is_number()) {
    std::string errors, below;
    for (const std::string& name : kShown)
      errors += (errors.empty() ? "" : ", ") + name + " " +
                PercentText(w["error_from_drift_pct"][name]).substr(1);
    for (const auto& [name, entry] : load["metrics"].items())
      if (entry.value("tolerance_below_drift", false))
        below += (below.empty() ? "" : ", ") + name + " (" +
                 PercentText(entry["tolerance_pct"]).substr(1) + " against " +
                 PercentText(w["error_from_drift_pct"][name]).substr(1) + ")";
    out += "; the machine's speed moved " + PercentText(w["drift_pct"]).substr(1) +
           " over the load (the runs' steps " + PercentText(w["step_speed_spread_pct"]).substr(1) +
           ", the reference shapes " + PercentText(w["machine_spread_pct"]).substr(1) +
           "), a price that far off on every step would move " + errors;
    if (!below.empty())
      out +=
          "; the tolerance is below that, so cannot tell a price error from the machine's "
          "drift, at " +
          below;
  }
  return out;
}

void MarkToleranceBelowDrift(json& load) {
  if (!load.contains("sensitivity") || !load["sensitivity"]["drift_pct"].is_number()) return;
  const json& from_drift = load["sensitivity"]["error_from_drift_pct"];
  for (auto& [name, entry] : load["metrics"].items())
    if (entry.contains("tolerance_pct") && from_drift.contains(name) &&
        from_drift[name].is_number())
      entry["tolerance_below_drift"] =
          from_drift[name].get<double>() > entry["tolerance_pct"].get<double>();
}

bool Missed(const json& entry, const std::string& key) {
  return entry.value("tolerance_at", "") == key && !entry["within"].get<bool>();
}

void HoldTolerance(const Metric& m, const std::map<std::string, double>& tolerances,
                   const std::string& key, json& entry, bool* exceeded) {
  auto tol = tolerances.find(m.name);
  if (tol == tolerances.end()) tol = tolerances.find(m.statistic);
  if (tol == tolerances.end() || !entry.contains(key) || !entry[key].is_number()) return;
  const bool over = std::abs(entry[key].get<double>()) > tol->second;
  entry["tolerance_pct"] = tol->second;
  entry["tolerance_at"] = key;
  entry["within"] = !over;
  *exceeded |= over;
}

namespace {

// "decode x1.271, prefill x1.058": each class's pieces' scale (ProfileAsLive's,
// ProfileAtMachineSpeed's), and with `by`, what read each: " (decode 1x256)", else " (all of
// them)".
std::string ScalesText(const json& scales, const json* by = nullptr) {
  std::string out;
  for (const auto& [name, k] : scales.items()) {
    char scale[64];
    std::snprintf(scale, sizeof scale, "%s x%.3f", name.c_str(), k.get<double>());
    out += (out.empty() ? "" : ", ") + std::string(scale);
    if (by) out += " (" + by->value(name, std::string("all of them")) + ")";
  }
  return out;
}

// The simulations that each price one more part of a request's time as it was live, in the
// order a miss is put down to the first whose error is within the tolerance, with what they
// change.
constexpr std::pair<const char*, const char*> kParts[] = {
    {"at_live_speed", "at the live runs' speed (the machine's drift since calibration)"},
    {"at_machine_speed", "at the machine's measured speed (its drift since calibration)"},
    {"as_live", "with the steps priced as they ran live (the step costs)"},
    {"at_live_send", "at the live send times (the send times)"},
    {"as_live_hand_over",
     "as live, handing over as live (the step costs and the hand-over after an idle spell)"},
    {"as_live_at_live_send", "as live at the live send times (the step costs and the send times)"},
};

}  // namespace

void StateGoal(json& load) {
  int held = 0, within = 0;
  json missed = json::array();
  for (const auto& [name, e] : load["metrics"].items()) {
    if (!e.contains("within")) continue;
    ++held;
    if (e["within"].get<bool>()) {
      ++within;
      continue;
    }
    const double tolerance = e["tolerance_pct"].get<double>();
    const std::string held = e["tolerance_at"].get<std::string>();
    const json spread = e.value("live_spread_pct", json());
    json miss = {{"metric", name},
                 {"error_pct", e[held]},
                 {"live_spread_pct", spread},
                 {"spread_below_tolerance", spread.is_number() && spread.get<double>() < tolerance},
                 {"within_live_range", e.value("within_live_range", false)},
                 {"within_when", nullptr},
                 {"nearest", nullptr}};
    for (const auto& [part, what] : kParts) {
      const std::string key = std::string("error_") + part + "_pct";
      if (key == held || !e.contains(key) || !e[key].is_number()) continue;
      const double error = e[key].get<double>();
      if (std::abs(error) <= tolerance && miss["within_when"].is_null()) {
        miss["within_when"] = part;
        miss["within_when_error_pct"] = error;
      }
      if (miss["nearest"].is_null() ||
          std::abs(error) < std::abs(miss["nearest_error_pct"].get<double>())) {
        miss["nearest"] = part;
        miss["nearest_error_pct"] = error;
      }
    }
    missed.push_back(std::move(miss));
  }
  if (held > 0) load["goal"] = {{"held", held}, {"within", within}, {"missed", std::move(missed)}};
}

std::string GoalText(const json& load) {
  if (!load.contains("goal")) return "";
  const json& g = load["goal"];
  auto what = [](const json& part) {
    for (const auto& [key, text] : kParts)
      if (part == key) return std::string(text);
    return part.get<std::string>();
  };
  std::string out = g["within"].dump() + " of " + g["held"].dump() + " held metrics within";
  std::string noise, others;
  for (const json& m : g["missed"]) {
    std::string text = m["metric"].get<std::string>() + " " + PercentText(m["error_pct"]);
    if (m["live_spread_pct"].is_number())
      text += " (the live runs " + PercentText(m["live_spread_pct"]).substr(1) + " apart" +
              (m["within_live_range"].get<bool>() ? ", the simulation within their range" : "") +
              ")";
    if (!m["within_when"].is_null())
      text += ": within " + what(m["within_when"]) + ", " + PercentText(m["within_when_error_pct"]);
    else if (!m["nearest"].is_null())
      text += ": no simulation of one part brings it within; nearest " + what(m["nearest"]) + ", " +
              PercentText(m["nearest_error_pct"]);
    std::string& list = m["spread_below_tolerance"].get<bool>() ? others : noise;
    list += (list.empty() ? "" : "; ") + text;
  }
  if (!others.empty())
    out += "; missed where the live runs differ by less than the tolerance: " + others;
  if (!noise.empty())
    out += "; missed where the live runs differ by as much or more (or ran once): " + noise;
  return out;
}

std::string ProfileText(const json& profile) {
  const std::string traffic = profile["traffic"].get<std::string>();
  const json& source = profile["source"];
  std::string text;
  if (traffic == "this")
    text = "fitted to this trace and selection: the errors are not on traffic it was not fitted to";
  else if (traffic == "same_trace_other_selection")
    text =
        "fitted to another selection of this trace (" + source["trace"]["selection"].dump() + ")";
  else if (traffic == "other")
    text = "fitted to other traffic (" + source["trace"]["path"].get<std::string>() + ")";
  else if (traffic == "ladders")
    text = "the sweep's ladders, fitted to no trace";
  else
    return "none fitted (the cluster file's cost model is not a profile)";
  if (source.contains("passes_pct") && source["passes_pct"].is_array() &&
      !source["passes_pct"].empty()) {
    double lo = 0, hi = 0;
    for (const json& pass : source["passes_pct"]) {
      if (!pass.is_array()) return text;
      for (const json& p : pass) {
        if (!p.is_number()) return text;
        lo = std::min(lo, p.get<double>());
        hi = std::max(hi, p.get<double>());
      }
    }
    char passes[200];
    std::snprintf(passes, sizeof passes,
                  "; in stretches of its calibration the shapes took %+.1f%% to %+.1f%% of its "
                  "medians (the machine's drift while it was measured: a step price error within "
                  "that is within calibration's noise)",
                  lo, hi);
    text += passes;
  }
  return text;
}

namespace {

// A load's errors under `key` (e.g. "error_as_live_pct") for TTFT, TPOT and E2E at p50 and p99,
// and any other metric whose --tolerance holds that error: "ttft_ms.p50 -1.2%, ...", marked "!"
// where beyond its tolerance.
std::string ErrorsText(const json& load, const std::string& key) {
  static const std::vector<std::string> kShown = {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50",
                                                  "ttft_ms.p99", "tpot_ms.p99", "e2e_ms.p99"};
  std::string out;
  auto add = [&](const std::string& name, const json& e) {
    out +=
        (out.empty() ? "" : ", ") + name + " " + PercentText(e[key]) + (Missed(e, key) ? " !" : "");
  };
  for (const std::string& name : kShown) add(name, load["metrics"][name]);
  for (const auto& [name, e] : load["metrics"].items())
    if (e.value("tolerance_at", "") == key &&
        std::find(kShown.begin(), kShown.end(), name) == kShown.end())
      add(name, e);
  return out;
}

}  // namespace

void PrintValidation(const json& report, const std::vector<Metric>& metrics) {
  if (report["profile"]["traffic"] != "none")
    std::printf("profile: %s\n", ProfileText(report["profile"]).c_str());
  const int repeats = report["loads"].empty() ? 1 : report["loads"][0]["repeats"].get<int>();
  // The table: one row per metric, live / simulated / error per load; with several runs, the
  // live median with the runs' range, and "~" where the simulated value lies within it.
  const int width = repeats > 1 ? 48 : 30;
  std::printf("%-32s", "metric");
  for (const json& load : report["loads"])
    std::printf(" | %-*s", width,
                ("rate x" + RateText(load["rate_scale"].get<double>()) +
                 (repeats > 1 ? ": live [range], sim, error" : ": live, sim, error"))
                    .c_str());
  std::printf("\n");
  for (const Metric& m : metrics) {
    std::printf("%-32s", m.name.c_str());
    for (const json& load : report["loads"]) {
      const json& e = load["metrics"][m.name];
      char cell[128];
      if (e["error_pct"].is_number()) {
        char range[64] = "";
        if (e.contains("live_min"))
          std::snprintf(range, sizeof range, " [%.2f-%.2f]", e["live_min"].get<double>(),
                        e["live_max"].get<double>());
        std::snprintf(cell, sizeof cell, "%.2f%s, %.2f, %+.1f%%%s%s", e["live"].get<double>(),
                      range, e["simulated"].get<double>(), e["error_pct"].get<double>(),
                      e.value("within_live_range", false) ? " ~" : "",
                      Missed(e, "error_pct") ? " !" : "");
      } else {
        std::snprintf(cell, sizeof cell, "n/a");
      }
      std::printf(" | %-*s", width, cell);
    }
    std::printf("\n");
  }
  if (repeats > 1) {
    // The live runs' own spread beside the simulation's error, per load.
    for (const json& load : report["loads"]) {
      std::string spreads;
      int within = 0, compared = 0;
      for (const Metric& m : metrics) {
        const json& e = load["metrics"][m.name];
        if (!e.contains("within_live_range")) continue;
        ++compared;
        within += e["within_live_range"].get<bool>();
      }
      for (const char* name : {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50", "ttft_ms.p99",
                               "tpot_ms.p99", "e2e_ms.p99"}) {
        const json& e = load["metrics"][name];
        spreads += std::string(spreads.empty() ? "" : ", ") + name + " " +
                   (e.contains("live_spread_pct") && e["live_spread_pct"].is_number()
                        ? PercentText(e["live_spread_pct"]).substr(1)
                        : std::string("n/a"));
      }
      std::printf(
          "spread at x%s: %d live runs differ by %s (range over median); the simulated value "
          "lies within the live range (~) for %d of %d metrics\n",
          RateText(load["rate_scale"].get<double>()).c_str(), repeats, spreads.c_str(), within,
          compared);
    }
  }
  // Each load against its --tolerance, and what each miss is down to.
  for (const json& load : report["loads"])
    if (const std::string goal = GoalText(load); !goal.empty())
      std::printf("goal at x%s: %s\n", RateText(load["rate_scale"].get<double>()).c_str(),
                  goal.c_str());
  // Where the values fall among the live runs' requests: an error in value at a percentile
  // where few requests lie is an error of few requests.
  for (const json& load : report["loads"])
    if (const std::string places = PlacesText(load); !places.empty())
      std::printf(
          "places at x%s: each value's percentile among the live runs' requests (how many of "
          "them lie below it): %s\n",
          RateText(load["rate_scale"].get<double>()).c_str(), places.c_str());
  // Where the error comes from, per load.
  for (const json& load : report["loads"]) {
    const json& s = load["steps"];
    std::string classes;
    for (const auto& [name, c] : s["classes"].items()) {
      if (c["steps"].get<std::int64_t>() == 0) continue;
      classes += (classes.empty() ? "" : ", ") + name + " " + PercentText(c["error_pct"]);
      if (c.value("tail_pct", json()).is_number())
        classes += " (median step " + PercentText(c["median_step_error_pct"]) + ", tail " +
                   PercentText(c["tail_pct"]) + ")";
      if (c.contains("beyond_sweep"))
        classes += " (" + c["beyond_sweep"]["steps"].dump() +
                   " beyond the sweep: " + PercentText(c["beyond_sweep"]["error_pct"]) + ")";
    }
    std::string quarters;
    for (const json& q : s["priced_error_pct_by_quarter"])
      quarters += (quarters.empty() ? "" : ", ") + PercentText(q);
    // Each band's error, and the fit's own error in the same bands: the part of theirs the live
    // steps did not add.
    std::string bands;
    for (const auto& [key, unit, what] :
         {std::tuple{"decode_by_rows", "rows", "decode by batch rows"},
          std::tuple{"prefill_by_tokens", "tokens", "prefill by new tokens"}}) {
      const auto [errors, calibrated] = BandsText(s.value(key, json::array()), unit);
      if (errors.empty()) continue;
      bands += std::string("; ") + what + " " + errors;
      if (!calibrated.empty())
        bands += " (the fit prices the profile's own measurements of them at " + calibrated + ")";
    }
    // The live figures add up a load's runs; the simulated ones are one run's.
    const std::string runs = repeats > 1 ? " in " + std::to_string(repeats) + " runs" : "";
    char outside[96] = "the forward passes overlap their iterations (asynchronous steps)";
    if (s["outside_forward_ms_per_step"].is_number())
      std::snprintf(outside, sizeof outside,
                    "each live iteration spends %.2f ms outside its forward pass",
                    s["outside_forward_ms_per_step"].get<double>());
    std::printf(
        "steps at x%s: %lld live%s, %s simulated; the cost model prices the live steps' forward "
        "passes (%.2f s) at %s (%s%s; by quarter of the run %s); %s\n",
        RateText(load["rate_scale"].get<double>()).c_str(),
        static_cast<long long>(s["live_steps"].get<std::int64_t>()), runs.c_str(),
        s["simulated_steps"].is_number() ? s["simulated_steps"].dump().c_str() : "n/a",
        s["forward_s"].get<double>(), PercentText(s["priced_error_pct"]).c_str(), classes.c_str(),
        bands.c_str(), quarters.c_str(), outside);
    if (s.contains("host_per_step")) {
      const json& h = s["host_per_step"];
      std::string phases;
      for (const std::string_view name : models::kHostPhaseNames) {
        const std::string key(name);
        char part[64];
        std::snprintf(part, sizeof part, "%s %.1f", key.c_str(),
                      1e3 * h[key + "_ms"].get<double>());
        phases += (phases.empty() ? "" : ", ") + std::string(part);
      }
      std::printf(
          "host at x%s: per iteration %.1f us outside the forward pass (%s, other %.1f us); the "
          "cost model prices %.1f us (%s)\n",
          RateText(load["rate_scale"].get<double>()).c_str(),
          1e3 * h["outside_forward_ms"].get<double>(), phases.c_str(),
          1e3 * h["other_ms"].get<double>(), 1e3 * h["priced_ms"].get<double>(),
          PercentText(h["priced_error_pct"]).c_str());
    }
    if (const std::string after = AfterText(s); !after.empty())
      std::printf(
          "by what ran before at x%s: the cost model prices the live steps, by what their "
          "instance ran just before them (an idle spell, or a step of a class), at %s\n",
          RateText(load["rate_scale"].get<double>()).c_str(), after.c_str());
    if (const std::string on_cpu = OnCpuText(s); !on_cpu.empty())
      std::printf("on a core at x%s: %s\n", RateText(load["rate_scale"].get<double>()).c_str(),
                  on_cpu.c_str());
    if (const std::string beside = BesideOthersText(s); !beside.empty())
      std::printf(
          "beside other instances at x%s: the cost model prices the live steps that ran alone and "
          "those that ran beside another instance's iterations (half their own or more; on one "
          "machine they share its cores and memory) at %s\n",
          RateText(load["rate_scale"].get<double>()).c_str(), beside.c_str());
    if (load.contains("as_live")) {
      const std::string scales = ScalesText(load["as_live"]["scales"]);
      std::printf(
          "as live at x%s: with the steps priced as they ran live (%s) the simulation's errors "
          "are %s\n",
          RateText(load["rate_scale"].get<double>()).c_str(), scales.c_str(),
          ErrorsText(load, "error_as_live_pct").c_str());
    }
    if (load.contains("as_live_hand_over")) {
      const json& h = load["as_live_hand_over"];
      std::printf(
          "as live, handing over as live at x%s: besides, with an idle engine waking %.3f ms after "
          "the message that wakes it and the frontend taking %.3f ms a request beyond its "
          "prompt's tokens (the live runs' medians of %lld wake-ups and %lld requests) the "
          "simulation's errors are %s\n",
          RateText(load["rate_scale"].get<double>()).c_str(), h["wake_ms"].get<double>(),
          h["frontend_request_ms"].get<double>(),
          static_cast<long long>(h["wakes"].get<std::int64_t>()),
          static_cast<long long>(h["requests"].get<std::int64_t>()),
          ErrorsText(load, "error_as_live_hand_over_pct").c_str());
    }
    if (load.contains("at_machine_speed")) {
      // Each class's pieces and the reference shapes that read their speed (ProfileAtMachineSpeed;
      // a record from before it priced every step at one speed).
      const json& k = load["at_machine_speed"];
      const std::string scales = k.contains("scales")
                                     ? ScalesText(k["scales"], &k["by"])
                                     : ScalesText(json{{"every step", k["scale"]}});
      std::printf(
          "at the machine's speed at x%s: with the steps priced as the machine's reference steps "
          "read it (below), %s, the simulation's errors are %s\n",
          RateText(load["rate_scale"].get<double>()).c_str(), scales.c_str(),
          ErrorsText(load, "error_at_machine_speed_pct").c_str());
    }
    if (load.contains("at_live_speed")) {
      const json& k = load["at_live_speed"];
      std::printf(
          "at the live runs' speed at x%s: with every step priced x%.3f (the live steps took "
          "x%.3f of what the fits price them at, which price calibration's own measurements at "
          "x%.3f: the machine while it served against when it was calibrated) the simulation's "
          "errors are %s\n",
          RateText(load["rate_scale"].get<double>()).c_str(), k["scale"].get<double>(),
          k["live_over_priced"].get<double>(), k["fits_over_measured"].get<double>(),
          ErrorsText(load, "error_at_live_speed_pct").c_str());
    }
    if (const std::string text = SensitivityText(load); !text.empty())
      std::printf("sensitivity at x%s: %s\n", RateText(load["rate_scale"].get<double>()).c_str(),
                  text.c_str());
    if (load.contains("at_live_send")) {
      const std::string r = RateText(load["rate_scale"].get<double>());
      const char* rate = r.c_str();
      if (load["at_live_send"].contains("not_simulated")) {
        std::printf("at live send times at x%s: not simulated: %s\n", rate,
                    load["at_live_send"]["not_simulated"].get<std::string>().c_str());
      } else {
        std::printf(
            "at live send times at x%s: with each request sent when the first live run sent it "
            "(not when the simulation's own replies let it go) the simulation's errors are %s\n",
            rate, ErrorsText(load, "error_at_live_send_pct").c_str());
        if (load["metrics"]["ttft_ms.p50"].contains("error_as_live_at_live_send_pct"))
          std::printf("as live at live send times at x%s: %s\n", rate,
                      ErrorsText(load, "error_as_live_at_live_send_pct").c_str());
      }
    }
    if (load["metrics"]["ttft_ms.p50"].contains("error_without_host_pct")) {
      std::string errors;
      for (const char* name : {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"})
        errors += std::string(errors.empty() ? "" : ", ") + name + " " +
                  PercentText(load["metrics"][name]["error_without_host_pct"]) + " (with it " +
                  PercentText(load["metrics"][name]["error_pct"]) + ")";
      std::printf("without host time at x%s: the simulation's errors are %s\n",
                  RateText(load["rate_scale"].get<double>()).c_str(), errors.c_str());
    }
    if (load.contains("schedule"))
      std::fputs(ScheduleText(load["schedule"], RateText(load["rate_scale"].get<double>())).c_str(),
                 stdout);
    const json& cpu = load["cpu"];
    std::printf(
        "cpu at x%s: over the %.1f s replay%s the client used %.1f CPU-s (%.2f of %d cores); the "
        "server, from its start to its stop, %.1f CPU-s, preempted %lld times\n",
        RateText(load["rate_scale"].get<double>()).c_str(), cpu["replay_s"].get<double>(),
        repeats > 1 ? "s" : "", cpu["client_cpu_s"].get<double>(),
        cpu["client_cores"].get<double>(), cpu["cores"].get<int>(),
        cpu["server_cpu_s"].get<double>(),
        static_cast<long long>(cpu["server_involuntary_switches"].get<std::int64_t>()));
    if (cpu.contains("steal_s"))
      std::printf(
          "  the rest of the machine over the servers' %.1f s: other processes %.1f CPU-s, "
          "steal %.2f s (%.2f%% of the cores' time)\n",
          cpu["serve_s"].get<double>(), cpu["other_cpu_s"].get<double>(),
          cpu["steal_s"].get<double>(), cpu["steal_pct"].get<double>());
    if (load.contains("machine") && load["machine"].is_object()) {
      const json& m = load["machine"];
      std::string shapes;
      for (const json& shape : m["timings"].front()["shapes"])
        shapes += (shapes.empty() ? "" : ", ") + shape["name"].get<std::string>();
      std::string each;
      if (m.contains("shapes"))
        for (const auto& [name, pct] : m["shapes"].items())
          each += name + " " + PercentText(pct) + ", ";
      const double slower = m["slower_pct"].get<double>();
      std::printf(
          "machine at x%s: the profile's own %s steps, timed alone before and after each live "
          "run, took %.1f%% %s time than at calibration (%sthe timings: %s to %s)\n",
          RateText(load["rate_scale"].get<double>()).c_str(), shapes.c_str(), std::abs(slower),
          slower >= 0 ? "more" : "less", each.c_str(), PercentText(m["min_pct"]).c_str(),
          PercentText(m["max_pct"]).c_str());
      if (m.contains("beside")) {
        const json& b = m["beside"];
        std::string each;
        for (const auto& [name, pct] : b["shapes"].items())
          each += (each.empty() ? "" : ", ") + name + " " + PercentText(pct);
        std::printf(
            "machine beside another instance at x%s: the same steps, each timed while a second "
            "copy of the model ran one of the other kind over and over on its own thread, took %s "
            "against their time alone (%s; the timings: %s to %s)\n",
            RateText(load["rate_scale"].get<double>()).c_str(),
            PercentText(b["slower_pct"]).c_str(), each.c_str(), PercentText(b["min_pct"]).c_str(),
            PercentText(b["max_pct"]).c_str());
      }
    }
  }
  if (report.contains("machine_not_timed"))
    std::printf("machine: not timed against its calibration: %s\n",
                report["machine_not_timed"].get<std::string>().c_str());
}

}  // namespace duet::cli
