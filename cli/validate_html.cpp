// The HTML page of `duet validate --report` (validate_html.h): CDFs drawn as inline SVG step
// lines from the runs' requests.csv, and the report's tables, in one file with nothing fetched.
#include "cli/validate_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli/validate_report.h"
#include "cli/validate_schedule.h"
#include "cli/validate_steps.h"
#include "policies/metrics.h"

namespace duet::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Format(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

// A machine reading (SummarizeReference's): "+3.0% (prefill 256 +2.9%, decode 1x256 +27.4%)", and
// beside another instance alike.
std::string MachineCell(const json& machine) {
  auto reading = [](const json& r) {
    std::string each;
    const json shapes = r.value("shapes", json::object());
    for (const auto& [name, pct] : shapes.items())
      each += (each.empty() ? "" : ", ") + name + " " + PercentText(pct);
    return PercentText(r["slower_pct"]) + (each.empty() ? "" : " (" + each + ")");
  };
  return Escape(reading(machine) + (machine.contains("beside")
                                        ? "; beside another instance: " + reading(machine["beside"])
                                        : ""));
}

struct Series {
  std::string label;   // its own: "live run 2"
  std::string legend;  // in the legend: "live runs (3)"
  std::string color;
  std::vector<double> values;
};

// The tick step for an axis from 0 to `max`: 1, 2 or 5 times a power of ten, at most 6 ticks.
double TickStep(double max) {
  const double raw = max / 5;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) return m * power;
  return 10 * power;
}

// One plot: the empirical CDF of each series as a step line, x from 0 to the largest value.
std::string CdfSvg(const std::string& title, const std::vector<Series>& series) {
  constexpr double kWidth = 450, kHeight = 260, kLeft = 48, kRight = 112, kTop = 28, kBottom = 40;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  double max = 0;
  for (const Series& s : series)
    for (double v : s.values) max = std::max(max, v);
  if (!(max > 0)) max = 1;
  const double step = TickStep(max);
  max = std::ceil(max / step) * step;
  auto x = [&](double v) { return kLeft + plot_w * v / max; };
  auto y = [&](double p) { return kTop + plot_h * (1 - p); };
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Format("%.0f", kWidth) +
                    "\" height=\"" + Format("%.0f", kHeight) + "\" role=\"img\">";
  svg += "<title>" + Escape(title) + "</title>";
  svg +=
      "<text x=\"" + Format("%.0f", kLeft) + "\" y=\"16\" class=\"t\">" + Escape(title) + "</text>";
  svg += "<rect x=\"" + Format("%.1f", kLeft) + "\" y=\"" + Format("%.1f", kTop) + "\" width=\"" +
         Format("%.1f", plot_w) + "\" height=\"" + Format("%.1f", plot_h) +
         "\" fill=\"none\" stroke=\"#999\"/>";
  for (double v = 0; v <= max * (1 + 1e-9); v += step) {
    svg += "<line x1=\"" + Format("%.1f", x(v)) + "\" x2=\"" + Format("%.1f", x(v)) + "\" y1=\"" +
           Format("%.1f", y(0)) + "\" y2=\"" + Format("%.1f", y(0) + 4) + "\" stroke=\"#999\"/>";
    svg += "<text x=\"" + Format("%.1f", x(v)) + "\" y=\"" + Format("%.1f", y(0) + 16) +
           "\" class=\"a\" text-anchor=\"middle\">" + Format("%g", v) + "</text>";
  }
  for (double p : {0.0, 0.5, 1.0})
    svg += "<text x=\"" + Format("%.1f", kLeft - 6) + "\" y=\"" + Format("%.1f", y(p) + 4) +
           "\" class=\"a\" text-anchor=\"end\">" + Format("%g", p) + "</text>";
  svg += "<text x=\"" + Format("%.1f", kLeft + plot_w / 2) + "\" y=\"" +
         Format("%.1f", kHeight - 6) + "\" class=\"a\" text-anchor=\"middle\">ms</text>";
  for (std::size_t k = 0; k < series.size(); ++k) {
    std::vector<double> values = series[k].values;
    std::sort(values.begin(), values.end());
    const double n = static_cast<double>(values.size());
    std::string points;
    for (std::size_t i = 0; i < values.size(); ++i) {
      points += Format("%.1f", x(values[i])) + "," + Format("%.1f", y(i / n)) + " ";
      points += Format("%.1f", x(values[i])) + "," + Format("%.1f", y((i + 1) / n)) + " ";
    }
    svg += "<polyline class=\"cdf\" data-series=\"" + Escape(series[k].label) + "\" data-n=\"" +
           std::to_string(values.size()) + "\" fill=\"none\" stroke=\"" + series[k].color +
           "\" stroke-width=\"1.5\" stroke-opacity=\"0.8\" points=\"" + points + "\"/>";
  }
  // The legend, right of the plot: one entry per label (a load's live runs share theirs).
  std::vector<const Series*> legend;
  for (const Series& s : series) {
    if (std::none_of(legend.begin(), legend.end(),
                     [&](const Series* l) { return l->legend == s.legend; }))
      legend.push_back(&s);
  }
  for (std::size_t k = 0; k < legend.size(); ++k) {
    const double lx = kLeft + plot_w + 8, ly = kTop + 10 + 16 * static_cast<double>(k);
    svg += "<line x1=\"" + Format("%.1f", lx) + "\" x2=\"" + Format("%.1f", lx + 16) + "\" y1=\"" +
           Format("%.1f", ly - 4) + "\" y2=\"" + Format("%.1f", ly - 4) + "\" stroke=\"" +
           legend[k]->color + "\" stroke-width=\"2\"/>";
    svg += "<text x=\"" + Format("%.1f", lx + 20) + "\" y=\"" + Format("%.1f", ly) +
           "\" class=\"a\">" + Escape(legend[k]->legend) + "</text>";
  }
  return svg + "</svg>";
}

constexpr const char* kStyle =
    "body{font-family:sans-serif;margin:2em;max-width:80em}"
    "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px;"
    "text-align:right}th{background:#eee}td.m{text-align:left}.miss{background:#fdd}"
    ".noise{background:#efe}.t{font-size:13px;font-weight:bold}.a{font-size:11px}"
    "svg{margin:0 1em 1em 0}";

// Which steps each world ran, per load and instance (validate_schedule.h): live (the median of
// the runs), simulated and each variant simulated (as live, ...).
std::string ScheduleTable(const json& report) {
  std::string html =
      "<h2>Which steps ran</h2>\n<table><tr><th>load</th><th>instance</th><th>world</th>";
  for (const ScheduleFigure& f : kScheduleFigures) html += "<th>" + Escape(f.label) + "</th>";
  html += "</tr>\n";
  for (const json& load : report["loads"]) {
    if (!load.contains("schedule")) continue;
    std::vector<std::string> worlds = {"live", "simulated"};
    for (const json& v : load["schedule"]["variants"])
      worlds.push_back("simulated_" + v["key"].get<std::string>());
    for (const auto& [name, entry] : load["schedule"]["instances"].items()) {
      for (const std::string& world : worlds) {
        if (!entry.contains(world) || entry[world].is_null()) continue;
        html += "<tr><td>x" + Escape(RateText(load["rate_scale"].get<double>())) + "</td><td>" +
                Escape(name) + "</td><td>" + Escape(world) + "</td>";
        for (const ScheduleFigure& f : kScheduleFigures) {
          const json& v = entry[world][f.key];
          html += "<td>" + (v.is_number() ? Format(f.format, v.get<double>()) : "n/a") + "</td>";
        }
        html += "</tr>\n";
      }
    }
  }
  return html +
         "</table>\n<p>With the steps priced right, a latency error comes from which steps ran. "
         "After an idle spell: steps that began when the instance had run none for a "
         "millisecond, and the requests (prefill chunks and decode rows) each took. The "
         "wake-up: from the message that woke the idle engine to the iteration of its step (a "
         "simulation's: what it priced). A decode "
         "token's step: the rows and the time of the step each decode token was made in, "
         "averaged over the tokens (the time per output token the steps give). Live: the median "
         "of the runs.</p>\n";
}

}  // namespace

Status WriteValidationHtml(const json& report, const std::vector<Metric>& metrics,
                           const std::string& out_dir, const std::string& path) {
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>duet "
      "validate: " +
      Escape(report["trace"].get<std::string>()) + "</title><style>" + kStyle +
      "</style></head><body>\n<h1>duet validate</h1>\n<p>";
  std::string selection;
  for (const json& arg : report["trace_selection"]) selection += " " + arg.get<std::string>();
  html += "Cluster <code>" + Escape(report["cluster"].get<std::string>()) +
          "</code>, model <code>" + Escape(report["model"].get<std::string>()) +
          "</code>, trace <code>" + Escape(report["trace"].get<std::string>() + selection) +
          "</code>. Live: the median of each load's live runs, with their range; simulated: "
          "<code>duet simulate</code> on the same cluster file and trace. Error: simulated over "
          "live, less one. Green: the simulated value lies within the live runs' range; red: the "
          "error exceeds its tolerance. The cost model's profile: " +
          Escape(ProfileText(report["profile"])) + ".</p>\n";
  for (const json& load : report["loads"]) {
    const std::string rate = RateText(load["rate_scale"].get<double>());
    const std::string dir = (fs::path(out_dir) / ("rate-" + rate)).string();
    const int repeats = load["repeats"].get<int>();
    html += "<h2>Rate x" + Escape(rate) + "</h2>\n<div>";
    // Each run's requests.csv, read once: the live runs', then the simulation's.
    std::vector<Series> runs;
    std::vector<std::pair<std::string, std::string>> files;  // path, text
    for (int k = 1; k <= repeats; ++k) {
      runs.push_back({"live run " + std::to_string(k),
                      repeats > 1 ? "live runs (" + std::to_string(repeats) + ")" : "live",
                      "#1f77b4",
                      {}});
      files.emplace_back(dir + "/live" + RunSuffix(k) + "/requests.csv", "");
    }
    runs.push_back({"simulated", "simulated", "#ff7f0e", {}});
    files.emplace_back(dir + "/sim/requests.csv", "");
    for (auto& [file, text] : files) {
      if (!fs::exists(file)) return Status::Error(file + ": no such file");
      text = ReadText(file);
    }
    for (const auto& [column, title] :
         {std::pair{"ttft_ms", "TTFT"}, std::pair{"tpot_ms", "TPOT"}, std::pair{"e2e_ms", "E2E"}}) {
      for (std::size_t r = 0; r < runs.size(); ++r) {
        auto values = policies::ParseRequestsCsvColumn(files[r].second, files[r].first, column);
        if (!values) return values.status();
        runs[r].values = std::move(*values);
      }
      html += CdfSvg(std::string(title) + " at x" + rate + " (CDF)", runs);
    }
    html += "</div>\n";
  }
  // The error table: metrics by load.
  html += "<h2>Errors</h2>\n<table><tr><th>metric</th>";
  for (const json& load : report["loads"])
    html += "<th>x" + Escape(RateText(load["rate_scale"].get<double>())) +
            " live</th><th>range</th><th>sim</th><th>error</th>";
  html += "</tr>\n";
  for (const Metric& m : metrics) {
    html += "<tr><td class=\"m\">" + Escape(m.name) + "</td>";
    for (const json& load : report["loads"]) {
      const json& e = load["metrics"][m.name];
      const bool miss = Missed(e, "error_pct");
      const char* cls = miss                                  ? " class=\"miss\""
                        : e.value("within_live_range", false) ? " class=\"noise\""
                                                              : "";
      const auto number = [](const json& v) {
        return v.is_number() ? Format("%.2f", v.get<double>()) : "n/a";
      };
      const std::string range =
          e.contains("live_min") ? number(e["live_min"]) + "&ndash;" + number(e["live_max"]) : "";
      html += "<td>" + number(e["live"]) + "</td><td>" + range + "</td><td>" +
              number(e["simulated"]) + "</td><td" + cls + ">" + PercentText(e["error_pct"]) +
              "</td>";
    }
    html += "</tr>\n";
  }
  html += "</table>\n";
  // Where the error comes from, per load.
  html +=
      "<h2>Where the error comes from</h2>\n<table><tr><th>load</th><th>live steps</th><th>"
      "simulated steps</th><th>live forward passes</th><th>priced by the profile</th><th>the "
      "machine against its calibration</th>";
  for (std::size_t c = 0; c < models::kShapeClasses; ++c)
    html += std::string("<th>") + models::ToString(static_cast<models::ShapeClass>(c)) + "</th>";
  html +=
      "<th>host per step, live</th><th>priced</th><th>TTFT p50 error as live</th><th>TPOT p50 "
      "as live</th><th>E2E p50 as live</th><th>TTFT / TPOT / E2E p50 at the machine's "
      "speed</th><th>TTFT / TPOT / E2E p50 at the live runs' speed</th><th>TTFT / TPOT / E2E p50 "
      "as live, handing over as live</th><th>TTFT / TPOT / "
      "E2E p50 at the live send times</th><th>the same, as live</th></tr>\n";
  for (const json& load : report["loads"]) {
    const json& s = load["steps"];
    html += "<tr><td>x" + Escape(RateText(load["rate_scale"].get<double>())) + "</td><td>" +
            s["live_steps"].dump() + "</td><td>" + s["simulated_steps"].dump() + "</td><td>" +
            Format("%.2f s", s["forward_s"].get<double>()) + "</td><td>" +
            PercentText(s["priced_error_pct"]) + "</td><td>" +
            (load.contains("machine") && load["machine"].is_object() ? MachineCell(load["machine"])
                                                                     : "n/a") +
            "</td>";
    for (std::size_t c = 0; c < models::kShapeClasses; ++c) {
      const json& cls = s["classes"][models::ToString(static_cast<models::ShapeClass>(c))];
      html += "<td>" + PercentText(cls["error_pct"]);
      if (cls.contains("beyond_sweep"))
        html += " (" + cls["beyond_sweep"]["steps"].dump() +
                " beyond the sweep: " + PercentText(cls["beyond_sweep"]["error_pct"]) + ")";
      html += "</td>";
    }
    const bool host = s.contains("host_per_step");
    html +=
        "<td>" +
        (host ? Format("%.1f us", 1e3 * s["host_per_step"]["outside_forward_ms"].get<double>())
              : "n/a") +
        "</td><td>" +
        (host ? Format("%.1f us", 1e3 * s["host_per_step"]["priced_ms"].get<double>()) : "n/a") +
        "</td>";
    for (const char* name : {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"}) {
      const json& e = load["metrics"][name];
      html += "<td>" +
              (e.contains("error_as_live_pct") ? PercentText(e["error_as_live_pct"]) : "n/a") +
              "</td>";
    }
    for (const char* key :
         {"error_at_machine_speed_pct", "error_at_live_speed_pct", "error_as_live_hand_over_pct",
          "error_at_live_send_pct", "error_as_live_at_live_send_pct"}) {
      std::string cell;
      for (const char* name : {"ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"}) {
        const json& e = load["metrics"][name];
        if (!e.contains(key)) break;
        // "!": beyond the tolerance that holds it (validate --tolerance-at live-speed).
        cell += (cell.empty() ? "" : " / ") + PercentText(e[key]) + (Missed(e, key) ? " !" : "");
      }
      html += "<td>" + (cell.empty() ? std::string("n/a") : cell) + "</td>";
    }
    html += "</tr>\n";
  }
  html +=
      "</table>\n<p>Priced by the profile: the cost model's price for the live steps' shapes "
      "over their measured forward passes, less one; beyond the sweep: steps of a class the "
      "profile prices past every shape of it that it measured. The machine against its "
      "calibration: the profile's own reference steps (a prefill pass, a batch of decode rows "
      "and one decode row) timed alone before and after each live run, over what calibration "
      "measured for them, less one (the median, all together and each step's; positive: slower "
      "now); beside another instance (instances side by side on a node): the same steps timed "
      "while a second copy of the model runs one of the other kind over and over, over their "
      "time alone, less one. At the machine's speed: the error left when each kind of step is "
      "priced slower by what the reference step of its kind read (a one-row decode step, bound "
      "by memory bandwidth, for the pieces that price it; a prefill pass and a batch of decode "
      "rows for theirs; the rest by all of them together): not the machine's drift. At the live "
      "runs' speed: the same with every step priced "
      "at the live steps' time over the fits' price for them, times the fits' price for "
      "calibration's own measurements over what it measured (the machine while it served "
      "against when it was calibrated, timed by the live steps themselves). At the live send times "
      "(a trace whose requests follow "
      "others): the error left "
      "when every request is sent when the first live run sent it. As live: the error left when "
      "the simulation prices each shape class as its live steps ran (not the step "
      "costs'). Handing over as live: besides, an idle engine wakes as late after the message "
      "that wakes it, and the frontend takes as long per request, as the live runs measured "
      "(their medians), so that as many of a burst's requests join a waking engine's step (not "
      "the hand-over's).</p>\n";
  for (const json& load : report["loads"])
    if (const std::string goal = GoalText(load); !goal.empty())
      html += "<p>Goal at x" + Escape(RateText(load["rate_scale"].get<double>())) + ": " +
              Escape(goal) + ".</p>\n";
  for (const json& load : report["loads"])
    if (const std::string places = PlacesText(load); !places.empty())
      html += "<p>Places at x" + Escape(RateText(load["rate_scale"].get<double>())) +
              ": each value's percentile among the live runs' requests (how many of them lie "
              "below it): " +
              Escape(places) +
              ". Where few requests lie near a percentile, an error in value is one of few "
              "requests.</p>\n";
  for (const json& load : report["loads"])
    if (const std::string after = AfterText(load["steps"]); !after.empty())
      html += "<p>By what ran before at x" + Escape(RateText(load["rate_scale"].get<double>())) +
              ": the profile prices the live steps, by what their instance ran just before them "
              "(an idle spell of 1 ms or more, or a step of a class, each priced with what the "
              "profile adds after it), at " +
              Escape(after) + ".</p>\n";
  for (const json& load : report["loads"])
    if (const std::string on_cpu = OnCpuText(load["steps"]); !on_cpu.empty())
      html += "<p>On a core at x" + Escape(RateText(load["rate_scale"].get<double>())) + ": " +
              Escape(on_cpu) + ".</p>\n";
  for (const json& load : report["loads"])
    if (const std::string beside = BesideOthersText(load["steps"]); !beside.empty())
      html += "<p>Beside other instances at x" +
              Escape(RateText(load["rate_scale"].get<double>())) +
              ": the profile prices the live steps that ran alone and those that ran beside "
              "another instance's iterations (half their own or more) at " +
              Escape(beside) + ".</p>\n";
  for (const json& load : report["loads"])
    if (const std::string text = SensitivityText(load); !text.empty())
      html += "<p>Sensitivity at x" + Escape(RateText(load["rate_scale"].get<double>())) + ": " +
              Escape(text) +
              ". A metric that moves more than the steps amplifies a price error by as much.</p>\n";
  html += ScheduleTable(report);
  html += "</body></html>\n";
  std::ofstream out(path);
  out << html;
  if (!out) return Status::Error("--report: cannot write " + path);
  return Status::Ok();
}

}  // namespace duet::cli
