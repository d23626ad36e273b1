// `duet simulate`: replay a request trace on a simulated PD or colocated cluster, print a
// summary and write the METRICS.md files.

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "policies/request.h"
#include "sim/simulation.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace duet::cli {
namespace {

void PrintSummary(const nlohmann::json& s, const std::string& out_dir) {
  const auto& req = s["requests"];
  const auto& run = s["run"];
  const auto& sim = s["sim"];
  std::printf("duet simulate: %s (%s, %d instances, %s), router %s\n",
              run["cluster"].get<std::string>().c_str(), run["mode"].get<std::string>().c_str(),
              run["instances"].get<int>(), run["model"].get<std::string>().c_str(),
              run["router"].get<std::string>().c_str());
  std::printf("  trace          %s\n", run["trace"].get<std::string>().c_str());
  std::printf("  requests       %d total, %d completed, %d rejected, %d failed, %d preemptions\n",
              req["total"].get<int>(), req["completed"].get<int>(), req["rejected"].get<int>(),
              req["failed"].get<int>(), req["preemptions"].get<int>());
  for (const auto& [reason, n] : req["rejected_reasons"].items())
    std::printf("    rejected %d: %s\n", n.get<int>(), reason.c_str());
  for (const auto& [reason, n] : req["failed_reasons"].items())
    std::printf("    failed %d: %s\n", n.get<int>(), reason.c_str());
  const double wall = sim["wall_s"].get<double>();
  const double simulated = sim["simulated_s"].get<double>();
  std::printf(
      "  duration       %.1f s of traffic; simulated %.1f s in %.2f s wall (%.0fx), %lld events\n",
      s["duration_s"].get<double>(), simulated, wall, wall > 0 ? simulated / wall : 0.0,
      static_cast<long long>(sim["events"].get<std::int64_t>()));
  std::printf("  GPU-hours      %.4f (%d GPUs held for the simulated time)\n",
              s["gpu_hours"].get<double>(), run["gpus"].get<int>());
  if (run["closed_loop"]["users"].get<std::size_t>() > 0) {
    std::printf("  closed loop    %zu users, think time %g ms\n",
                run["closed_loop"]["users"].get<std::size_t>(),
                run["closed_loop"]["think_time_ms"].get<double>());
  }
  PrintThroughputAndLatencies(s);
  PrintDistribution("TTST ms", s["ttst_ms"]);
  PrintDistribution("queue ms", s["queue_ms"]);
  if (s["sessions"]["count"].get<std::size_t>() > 0) {
    std::printf("  sessions       %zu\n", s["sessions"]["count"].get<std::size_t>());
    PrintDistribution("tok/s/session", s["sessions"]["output_tokens_per_s"]);
  }
  const auto& pc = s["prefix_cache"];
  std::printf("  prefix cache   hit rate %.2f%% (%lld of %lld prompt tokens)",
              100 * pc["hit_rate"].get<double>(),
              static_cast<long long>(pc["hit_tokens"].get<std::int64_t>()),
              static_cast<long long>(pc["lookup_tokens"].get<std::int64_t>()));
  const char* const kTiers[] = {"gpu", "dram", "ssd", "remote"};
  bool any_tier = false;
  for (const char* t : kTiers) {
    if (t != kTiers[0] && s["tiers"][t]["enabled"].get<bool>()) any_tier = true;
  }
  if (any_tier) {
    std::printf(": by tier");
    for (const char* t : kTiers) {
      if (t == kTiers[0] || s["tiers"][t]["enabled"].get<bool>())
        std::printf(" %s %.2f%%", t, 100 * pc["by_tier"][t]["hit_rate"].get<double>());
    }
  }
  std::printf("\n");
  const auto& tb = s["ttft_breakdown_ms"];
  std::printf("  TTFT parts ms  mean queue %s, load %s, prefill %s, transfer %s\n",
              FormatStat(tb["queue"]["mean"]).c_str(), FormatStat(tb["load"]["mean"]).c_str(),
              FormatStat(tb["prefill"]["mean"]).c_str(),
              FormatStat(tb["transfer"]["mean"]).c_str());
  const auto& kv = s["kv_transfer"];
  std::printf("  KV transfer    %lld transfers, %.2f GB, mean %s ms, p99 %s ms\n",
              static_cast<long long>(kv["transfers"].get<std::int64_t>()),
              static_cast<double>(kv["bytes"].get<std::int64_t>()) / 1e9,
              FormatStat(kv["time_ms"]["mean"]).c_str(), FormatStat(kv["time_ms"]["p99"]).c_str());
  if (kv["transfers"].get<std::int64_t>() > 0) {
    std::printf("  KV parts ms    mean");
    const char* separator = " ";
    for (const char* part : policies::KvTransferParts::kNames) {
      std::printf("%s%s %s", separator, part, FormatStat(kv["parts_ms"][part]["mean"]).c_str());
      separator = ", ";
    }
    std::printf("\n");
  }
  PrintGoodput(s);
  if (sim["stopped_early"].get<bool>())
    std::printf(
        "  stopped early  at %.1f s: the attainment asked for was out of reach; requests "
        "not finished by then count as failed\n",
        simulated);
  std::printf("  wrote          %s, %s, %s\n",
              (fs::path(out_dir) / "summary.json").string().c_str(),
              (fs::path(out_dir) / "requests.csv").string().c_str(),
              (fs::path(out_dir) / "links.csv").string().c_str());
}

}  // namespace

bool ParseSimulateArgs(int argc, char** argv, po::variables_map& vm, sim::SimOptions* out,
                       int* exit_code) {
  po::options_description opts("duet simulate: replay a request trace on a simulated cluster");
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("cluster", po::value<std::string>()->default_value("sim/clusters/h100-8p8d-llama8b.json"),
     "cluster description (JSON)")
    ("slo", po::value<std::string>(), "service-level objectives in ms, e.g. ttft=2000,tpot=100")
    ("stop-below-attainment", po::value<double>(),
     "with --slo: stop the run once more requests have missed the SLO than this attainment "
     "(a fraction in (0, 1]) allows; the summary says so (sim.stopped_early)")
    ("reject-over-slo",
     "cache-aware router: reject at arrival a request whose estimated TTFT exceeds the TTFT SLO")
    ("out", po::value<std::string>()->default_value("out"), "output directory")
    ("timeline", po::value<std::string>(),
     "also write a Perfetto / Chrome trace of the run to FILE (JSON; open it in "
     "ui.perfetto.dev): steps per instance, KV transfers, tier I/O, request lifecycles")
    ("step-log", po::value<std::string>(),
     "also write every step to FILE as `duet serve --step-log` does (JSON lines: shape, "
     "instance, start, iteration; the forward pass as the cost model priced it)");
  // clang-format on
  AddRouterOptions(opts, "prefix-aware");
  opts.add_options()("router-staleness-ms", po::value<double>()->default_value(0),
                     "the router sees the instances' GPU prefix caches this late (KV events "
                     "in flight); 0: as they are");
  AddClosedLoopOptions(opts);
  AddProgressOption(opts);
  AddTraceOptions(opts, "traces/bundled/default.json");
  if (!ParseArgs(argc, argv, opts, vm, exit_code)) return false;
  // Every error below is the command line's.
  auto usage = [&](const std::string& message) {
    *exit_code = Fail(message, kExitUsage);
    return false;
  };

  sim::SimOptions options;
  const Status router = ParseRouterOptions(vm, &options.router);
  if (!router.ok()) return usage(router.message());
  const double staleness_ms = vm["router-staleness-ms"].as<double>();
  // An hour bounds it: a view older than that is no view (and the delay stays finite).
  if (!(staleness_ms >= 0 && staleness_ms <= 3.6e6))
    return usage("--router-staleness-ms must be in [0, 3600000], not " +
                 std::to_string(staleness_ms));
  options.router_staleness_s = staleness_ms / 1e3;
  options.router.seed = vm["seed"].as<std::uint64_t>();
  if (vm.count("slo")) {
    auto slo = policies::ParseSlo(vm["slo"].as<std::string>());
    if (!slo) return usage(slo.error());
    options.slo = *slo;
  }
  if (vm.count("reject-over-slo")) {
    if (options.router.kind != policies::RouterKind::kCacheAware || !options.slo.ttft_ms)
      return usage("--reject-over-slo needs --router cache-aware and a TTFT SLO (--slo ttft=MS)");
    options.reject_over_slo = true;
  }
  if (Status s = ParseClosedLoopOptions(vm, &options.closed_loop); !s.ok())
    return usage(s.message());
  if (vm.count("stop-below-attainment")) {
    const double a = vm["stop-below-attainment"].as<double>();
    if (!(a > 0 && a <= 1))
      return usage("--stop-below-attainment must be in (0, 1], not " + std::to_string(a));
    if (!options.slo.any()) return usage("--stop-below-attainment needs an SLO (--slo)");
    if (options.closed_loop.users > 0)
      return usage("--stop-below-attainment needs an open loop (not --concurrency)");
    options.stop_below_attainment = a;
  }
  auto progress = ProgressWanted(vm);
  if (!progress) return usage(progress.error());
  options.progress = *progress;
  options.out_dir = vm["out"].as<std::string>();
  if (vm.count("timeline")) {
    options.timeline_path = vm["timeline"].as<std::string>();
    if (options.timeline_path.empty()) return usage("--timeline needs a file name");
  }
  if (vm.count("step-log")) {
    options.step_log_path = vm["step-log"].as<std::string>();
    if (options.step_log_path.empty()) return usage("--step-log needs a file name");
  }

  *out = std::move(options);
  *exit_code = kExitOk;
  return true;
}

int Simulate(int argc, char** argv) {
  po::variables_map vm;
  sim::SimOptions options;
  int code = kExitOk;
  if (!ParseSimulateArgs(argc, argv, vm, &options, &code)) return code;

  const std::string cluster_path = Locate(vm["cluster"].as<std::string>());
  auto cluster = sim::LoadClusterSpec(cluster_path, DataDir());
  if (!cluster) return Fail(cluster.error());
  if (cluster->router && vm["router"].defaulted()) options.router.kind = *cluster->router;

  auto trace = LoadTrace(vm, &code);
  if (!trace) return Fail(trace.error(), code);

  auto report = sim::RunSimulation(*cluster, *trace, options);
  if (!report) return Fail(report.error());
  PrintSummary(report->summary, options.out_dir);
  if (!options.timeline_path.empty())
    std::printf("  timeline       %s (open it in ui.perfetto.dev)\n",
                options.timeline_path.c_str());
  return kExitOk;
}

}  // namespace duet::cli
