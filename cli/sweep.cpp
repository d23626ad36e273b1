// `duet sweep`: every setup of a scenario file at every rate scale, simulated here (several at
// once) or as tasks on a Ray cluster, into one results directory with a results.csv of the
// figures that compare them. A sweep interrupted there resumes.

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/commands.h"
#include "cli/sim_runner.h"
#include "cli/validate_flags.h"
#include "common/json_util.h"
#include "common/progress.h"
#include "common/text.h"
#include "plan/scenario.h"
#include "policies/metrics.h"
#include "sim/cluster_spec.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace duet::cli {
namespace {

// Mean and peak requests in flight, from arrival to completion, of the completed requests in a
// requests.csv: the mean by Little's law (summed end-to-end times over the span from the
// first arrival to the last completion), the peak over every instant (completions first at a
// tie).
Result<std::pair<double, int>> Concurrency(const fs::path& requests_csv) {
  std::ifstream in(requests_csv);
  if (!in) return Status::Error(requests_csv.string() + ": cannot read");
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header;
  {
    std::stringstream h(line);
    std::string col;
    while (std::getline(h, col, ',')) header.push_back(col);
  }
  auto col = [&](const std::string& name) -> int {
    auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? -1 : static_cast<int>(it - header.begin());
  };
  const int arrival = col("arrival_s"), e2e = col("e2e_ms"), status = col("status");
  if (arrival < 0 || e2e < 0 || status < 0)
    return Status::Error(requests_csv.string() + ": no arrival_s, e2e_ms or status column");
  std::vector<std::pair<double, int>> events;
  double sum = 0, first = INFINITY, last = -INFINITY;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream row(line);
    std::string cell;
    while (std::getline(row, cell, ',')) f.push_back(cell);
    if (static_cast<int>(f.size()) <= std::max({arrival, e2e, status})) continue;
    if (f[static_cast<std::size_t>(status)] != "completed") continue;
    const double a = std::stod(f[static_cast<std::size_t>(arrival)]);
    const double end = a + std::stod(f[static_cast<std::size_t>(e2e)]) / 1e3;
    events.push_back({a, 1});
    events.push_back({end, -1});
    sum += end - a;
    first = std::min(first, a);
    last = std::max(last, end);
  }
  std::sort(events.begin(), events.end());  // at a tie, -1 (a completion) first
  int live = 0, peak = 0;
  for (const auto& e : events) peak = std::max(peak, live += e.second);
  return std::make_pair(last > first ? sum / (last - first) : 0.0, peak);
}

std::string Cell(const nlohmann::json& v) {
  if (v.is_null()) return "";
  if (v.is_number_float()) return ShortNumber(v.get<double>());
  return v.dump();
}

}  // namespace

int Sweep(int argc, char** argv) {
  po::options_description opts(
      "duet sweep: every setup of a scenario file at every rate scale, simulated");
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("scenario", po::value<std::string>()->required(),
     "scenario file (JSON: trace, rate_scales, setups [{name, cluster}], optional router, slo; "
     "docs/scenarios.md)")
    ("out", po::value<std::string>()->default_value("out/sweep"),
     "results directory; a sweep interrupted there resumes")
    ("rate-scales", po::value<std::string>(),
     "1 to 8 rate scales to run instead of the scenario's, e.g. 1,2,4");
  // clang-format on
  AddRunnerOptions(opts);
  AddProgressOption(opts);
  po::variables_map vm;
  int code = kExitOk;
  if (!ParseArgs(argc, argv, opts, vm, &code)) return code;
  if (Status st = CheckRunnerOptions(vm); !st.ok()) return Fail(st.message(), kExitUsage);
  auto progress = ProgressWanted(vm);
  if (!progress) return Fail(progress.error(), kExitUsage);
  const std::string scenario_path = Locate(vm["scenario"].as<std::string>());
  auto doc = ReadJsonFile(scenario_path);
  if (!doc) return Fail(doc.error());
  auto scenario = plan::ParseScenario(*doc, scenario_path);
  if (!scenario) return Fail(scenario.error());
  if (vm.count("rate-scales")) {
    auto rates = ParseRateScales(vm["rate-scales"].as<std::string>());
    if (!rates) return Fail(rates.error(), kExitUsage);
    scenario->rate_scales = *rates;
  }
  // Absolute: a Ray task runs in a directory of its own.
  scenario->trace = fs::absolute(Locate(scenario->trace)).lexically_normal().string();
  const fs::path out_dir = vm["out"].as<std::string>();
  std::error_code ec;
  fs::create_directories(out_dir / "runs", ec);
  if (ec) return Fail(out_dir.string() + ": cannot create the results directory: " + ec.message());

  // Each setup's cluster file: as named, or patched (into OUT/runs/SETUP/cluster.json once the
  // directory is this sweep's); every one checked before anything runs.
  std::map<std::string, fs::path> clusters;
  std::map<std::string, nlohmann::json> patched;
  nlohmann::json inputs = {{"scenario", *doc}, {"clusters", nlohmann::json::object()}};
  for (const plan::Setup& s : scenario->setups) {
    const fs::path original = fs::absolute(Locate(s.cluster));
    if (!fs::is_regular_file(original))
      return Fail(scenario_path + ": setup '" + s.name + "': cluster file " + s.cluster +
                  " not found");
    auto cluster_doc = ReadJsonFile(original.string());
    if (!cluster_doc) return Fail(cluster_doc.error());
    clusters[s.slug] = original;
    if (!s.patch.empty()) {
      try {
        *cluster_doc = cluster_doc->patch(s.patch);
      } catch (const nlohmann::json::exception& e) {
        return Fail(scenario_path + ": setup '" + s.name + "': patch does not apply to " +
                    s.cluster + ": " + e.what());
      }
      sim::AbsolutizeClusterRefs(*cluster_doc, original.parent_path().string());
      clusters[s.slug] = out_dir / "runs" / s.slug / "cluster.json";
      patched[s.slug] = *cluster_doc;
    }
    auto spec = sim::ParseClusterSpec(*cluster_doc, original.string(), DataDir());
    if (!spec) return Fail(scenario_path + ": setup '" + s.name + "': " + spec.error());
    inputs["clusters"][s.slug] = *cluster_doc;
  }
  // What this sweep is (the scenario and every cluster file it runs), so that a resume into a
  // directory of another sweep is refused rather than mixed with it.
  if (Status st = ClaimResultsDir(out_dir.string(), inputs,
                                  "a sweep of another scenario or other cluster files");
      !st.ok())
    return Fail(st.message());
  for (const auto& [slug, cluster_doc] : patched) {
    const fs::path& path = clusters.at(slug);
    fs::create_directories(path.parent_path(), ec);
    std::ofstream f(path);
    f << cluster_doc.dump(2) << "\n";
    if (!f) return Fail(path.string() + ": write failed");
  }

  struct Run {
    const plan::Setup* setup;
    double rate;
    fs::path dir;
  };
  std::vector<Run> runs;
  for (double rate : scenario->rate_scales)
    for (const plan::Setup& s : scenario->setups)
      runs.push_back({&s, rate, out_dir / "runs" / s.slug / ("rate-" + ShortNumber(rate))});

  CatchStopSignals();
  auto made = MakeRunner(vm, (out_dir / "ray.log").string());
  if (!made) return Fail(made.error());
  std::unique_ptr<SimRunner> runner = std::move(*made);
  std::size_t next = 0, running = 0, done = 0, resumed = 0;
  while (done < runs.size()) {
    if (StopRequested())
      return Fail("stopped by a signal; the runs that finished are in " + out_dir.string() +
                      ": the same command resumes there",
                  kExitSignal);
    while (next < runs.size() && static_cast<int>(running) < runner->slots()) {
      const Run& r = runs[next];
      if (fs::exists(r.dir / "summary.json")) {
        ++next, ++done, ++resumed;
        continue;
      }
      fs::remove_all(r.dir, ec);
      fs::create_directories(r.dir, ec);
      const fs::path& cluster = clusters.at(r.setup->slug);
      std::vector<std::string> args = {
          "--cluster",         cluster.string(), "--trace",      scenario->trace, "--rate-scale",
          ShortNumber(r.rate), "--out",          r.dir.string(), "--progress",    "never"};
      if (!scenario->trace_format.empty())
        args.insert(args.end(), {"--trace-format", scenario->trace_format});
      const std::string router = !r.setup->router.empty() ? r.setup->router : scenario->router;
      if (!router.empty()) args.insert(args.end(), {"--router", router});
      if (!scenario->slo.empty()) args.insert(args.end(), {"--slo", scenario->slo});
      if (Status st = runner->Start(next, args); !st.ok()) return Fail(st.message());
      ++next, ++running;
    }
    if (running == 0) continue;
    auto finished = runner->Poll(0.05);
    if (!finished) return Fail(finished.error());
    if (*finished) {
      --running, ++done;
      const Run& r = runs[(*finished)->id];
      if ((*finished)->exit_status != 0)
        return Fail("simulating " + r.setup->name + " at " + ShortNumber(r.rate) +
                    "x failed (exit " + std::to_string((*finished)->exit_status) + "); see " +
                    (r.dir / "log.txt").string());
    }
    if (*progress) DrawProgress(done, runs.size(), std::to_string(resumed) + " resumed");
  }
  if (*progress) std::fprintf(stderr, "\n");

  // results.csv: one row per run, in the scenario's order.
  const fs::path csv_path = out_dir / "results.csv";
  std::ofstream csv(csv_path);
  csv << "setup,rate_scale,completed,total,ttft_mean_ms,ttft_p90_ms,ttft_p99_ms,tpot_mean_ms,"
         "tpot_p99_ms,output_tokens_per_s,prefix_hit_rate,dram_hit_rate,ssd_hit_rate,"
         "mean_concurrency,peak_concurrency,attainment,run\n";
  for (const Run& r : runs) {
    auto s = ReadJsonFile((r.dir / "summary.json").string());
    if (!s) return Fail(s.error());
    auto conc = Concurrency(r.dir / "requests.csv");
    if (!conc) return Fail(conc.error());
    try {
      const auto& j = *s;
      const auto& by = j["prefix_cache"]["by_tier"];
      csv << "\"" << r.setup->name << "\"," << ShortNumber(r.rate) << ","
          << j["requests"]["completed"] << "," << j["requests"]["total"] << ","
          << Cell(j["ttft_ms"]["mean"]) << "," << Cell(j["ttft_ms"]["p90"]) << ","
          << Cell(j["ttft_ms"]["p99"]) << "," << Cell(j["tpot_ms"]["mean"]) << ","
          << Cell(j["tpot_ms"]["p99"]) << "," << Cell(j["throughput"]["output_tokens_per_s"]) << ","
          << Cell(j["prefix_cache"]["hit_rate"]) << "," << Cell(by["dram"]["hit_rate"]) << ","
          << Cell(by["ssd"]["hit_rate"]) << ","
          << ShortNumber(std::round(conc->first * 1000) / 1000) << "," << conc->second << ","
          << (scenario->slo.empty() ? "" : Cell(j["goodput"]["attainment"])) << ","
          << fs::relative(r.dir, out_dir).generic_string() << "\n";
    } catch (const std::exception& e) {
      return Fail((r.dir / "summary.json").string() + ": not a duet summary: " + e.what());
    }
  }
  csv.close();
  if (!csv) return Fail(csv_path.string() + ": write failed");
  std::printf("duet sweep: %zu runs (%zu resumed) of %s; wrote %s\n", runs.size(), resumed,
              scenario->name.c_str(), csv_path.string().c_str());
  return kExitOk;
}

}  // namespace duet::cli
