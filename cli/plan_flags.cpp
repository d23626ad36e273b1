#include "cli/plan_flags.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "common/text.h"

namespace po = boost::program_options;

namespace duet::cli {
namespace {

// "1,2,4" into numbers, each checked by `ok`; errors name the flag.
template <typename T>
Result<std::vector<T>> ParseList(const po::variables_map& vm, const std::string& flag,
                                 bool (*ok)(double), const std::string& bounds) {
  std::vector<T> out;
  std::stringstream in(vm[flag].as<std::string>());
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double x = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !ok(x))
      return Status::Error("--" + flag + ": '" + Excerpt(item) + "' is not " + bounds);
    if constexpr (std::is_integral_v<T>) {
      if (x != std::floor(x))
        return Status::Error("--" + flag + ": '" + Excerpt(item) + "' is not whole");
    }
    out.push_back(static_cast<T>(x));
  }
  if (out.empty()) return Status::Error("--" + flag + " needs at least one value");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

bool ParsePlanArgs(int argc, char** argv, po::variables_map& vm, PlanFlags* out, int* exit_code) {
  po::options_description opts(
      "duet plan: the cheapest cluster that meets an SLO target on a trace, searched by "
      "simulation");
  // clang-format off
  opts.add_options()
    ("help,h", "show this help")
    ("slo", po::value<std::string>()->required(),
     "service-level objectives in ms, e.g. ttft=2000,tpot=100")
    ("attainment", po::value<double>()->default_value(0.99),
     "the fraction of requests that must meet the SLO")
    ("model", po::value<std::string>(), "model (as a cluster file names it); default: the base's")
    ("gpu", po::value<std::string>(),
     "GPU types (as a cluster file names them), comma-separated: candidates of every type are "
     "searched together; default: the base's")
    ("base", po::value<std::string>()->default_value("sim/clusters/h100-8p8d-llama8b-tiered.json"),
     "cluster file whose links, engine settings, tier parameters and cost model every "
     "candidate keeps")
    ("max-gpus", po::value<int>()->default_value(16), "the most GPUs a candidate may have")
    ("gpu-prices", po::value<std::string>(),
     "JSON table of GPU type -> price per GPU-hour, merged over the bundled plan/gpu_prices.json")
    ("gpu-hour-cost", po::value<double>(),
     "price of a GPU per hour for every type (default: each type's from plan/gpu_prices.json "
     "and --gpu-prices)")
    ("dram-gib-cost", po::value<double>()->default_value(0.002),
     "price of a GiB of host DRAM per hour")
    ("ssd-tib-cost", po::value<double>()->default_value(0.05), "price of a TiB of SSD per hour")
    ("layouts", po::value<std::string>()->default_value("colocated,pd"),
     "colocated, pd or both")
    ("tp", po::value<std::string>()->default_value("1,2,4"),
     "TP degrees of colocated and prefill instances")
    ("dp", po::value<std::string>()->default_value("1"),
     "attention data-parallel ranks of colocated and prefill instances (each of a --tp degree)")
    ("decode-tp", po::value<std::string>()->default_value("1"), "TP degrees of decode instances")
    ("decode-dp", po::value<std::string>()->default_value("1"),
     "attention data-parallel ranks of decode instances (each of a --decode-tp degree)")
    ("token-budgets", po::value<std::string>()->default_value("8192,16384"),
     "engine token budgets per step (max_num_batched_tokens)")
    ("dram-gib", po::value<std::string>()->default_value("0,512"),
     "host DRAM KV tier sizes per node, GiB (0: none)")
    ("ssd-tib", po::value<std::string>()->default_value("0,4"),
     "SSD KV tier sizes per node, TiB (0: none; only with DRAM)")
    ("routers", po::value<std::string>()->default_value("kv-aware,prefix-aware"),
     "routers to try")
    ("rates", po::value<std::string>()->default_value("1,1.5,2,3"),
     "rates, as multiples of the trace's (after --rate-scale), at which to find the cheapest "
     "cluster: the frontier; the lowest is the target")
    ("exhaustive", "simulate every candidate at every rate, full length (the yardstick)")
    ("out", po::value<std::string>()->default_value("out/plan"),
     "results directory; a search interrupted there resumes");
  // clang-format on
  AddRunnerOptions(opts);
  AddProgressOption(opts);
  AddTraceOptions(opts);
  if (!ParseArgs(argc, argv, opts, vm, exit_code)) return false;
  // Every error below is the command line's.
  auto usage = [&](const std::string& message) {
    *exit_code = Fail(message, kExitUsage);
    return false;
  };
  PlanFlags f;

  auto slo = policies::ParseSlo(vm["slo"].as<std::string>());
  if (!slo) return usage(slo.error());
  f.slo = *slo;
  f.attainment = vm["attainment"].as<double>();
  if (!(f.attainment > 0 && f.attainment <= 1)) return usage("--attainment must be in (0, 1]");
  plan::SpaceOptions& space = f.space;
  plan::Prices& prices = f.prices;
  space.max_gpus = vm["max-gpus"].as<int>();
  if (space.max_gpus < 1 || space.max_gpus > 4096) return usage("--max-gpus must be in [1, 4096]");
  prices.dram_gib_hour = vm["dram-gib-cost"].as<double>();
  prices.ssd_tib_hour = vm["ssd-tib-cost"].as<double>();
  for (const char* f : {"gpu-hour-cost", "dram-gib-cost", "ssd-tib-cost"}) {
    if (!vm.count(f)) continue;
    const double x = vm[f].as<double>();
    if (!(x >= 0 && x <= 1e6)) return usage(std::string("--") + f + " must be in [0, 1e6]");
  }
  if (vm.count("gpu-hour-cost")) f.gpu_hour_cost = vm["gpu-hour-cost"].as<double>();
  if (vm.count("gpu-prices")) {
    if (f.gpu_hour_cost) return usage("--gpu-prices and --gpu-hour-cost exclude each other");
    f.gpu_prices = vm["gpu-prices"].as<std::string>();
    if (f.gpu_prices.empty()) return usage("--gpu-prices needs a file");
  }
  space.gpus = {""};
  if (vm.count("gpu")) {
    // In order, each once; several types' keys are told apart by their GPU's name.
    space.gpus.clear();
    std::set<std::string> key_names;
    std::stringstream in(vm["gpu"].as<std::string>());
    std::string item;
    while (std::getline(in, item, ',')) {
      if (std::find(space.gpus.begin(), space.gpus.end(), item) != space.gpus.end()) continue;
      if (item.empty()) return usage("--gpu: an empty GPU type");
      if (!key_names.insert(plan::GpuKeyName(item)).second)
        return usage("--gpu: '" + Excerpt(item) + "' has the name of another type, " +
                     plan::GpuKeyName(item) + ", which keys could not tell apart");
      space.gpus.push_back(item);
    }
    if (space.gpus.empty()) return usage("--gpu needs at least one GPU type");
  }
  {
    std::stringstream in(vm["layouts"].as<std::string>());
    std::string item;
    space.colocated = space.pd = false;
    while (std::getline(in, item, ',')) {
      if (item == "colocated") {
        space.colocated = true;
      } else if (item == "pd") {
        space.pd = true;
      } else {
        return usage("--layouts: '" + Excerpt(item) + "' is not colocated or pd");
      }
    }
    if (!space.colocated && !space.pd) return usage("--layouts needs colocated, pd or both");
  }
  auto tp_ok = [](double x) { return x >= 1 && x <= 64; };
  auto tp = ParseList<int>(vm, "tp", tp_ok, "a TP degree in [1, 64]");
  if (!tp) return usage(tp.error());
  auto decode_tp = ParseList<int>(vm, "decode-tp", tp_ok, "a TP degree in [1, 64]");
  if (!decode_tp) return usage(decode_tp.error());
  auto dp = ParseList<int>(vm, "dp", tp_ok, "a DP degree in [1, 64]");
  if (!dp) return usage(dp.error());
  auto decode_dp = ParseList<int>(vm, "decode-dp", tp_ok, "a DP degree in [1, 64]");
  if (!decode_dp) return usage(decode_dp.error());
  auto budgets = ParseList<Tokens>(
      vm, "token-budgets", [](double x) { return x >= 16 && x <= 1 << 20; },
      "a token budget in [16, 1048576]");
  if (!budgets) return usage(budgets.error());
  auto dram = ParseList<double>(
      vm, "dram-gib", [](double x) { return x >= 0 && x <= 1 << 20; }, "a size in [0, 1048576]");
  if (!dram) return usage(dram.error());
  auto ssd = ParseList<double>(
      vm, "ssd-tib", [](double x) { return x >= 0 && x <= 1024; }, "a size in [0, 1024]");
  if (!ssd) return usage(ssd.error());
  auto rates = ParseList<double>(
      vm, "rates", [](double x) { return x >= 0.001 && x <= 1000; }, "a rate in [0.001, 1000]");
  if (!rates) return usage(rates.error());
  space.tp = *tp;
  space.decode_tp = *decode_tp;
  space.dp = *dp;
  space.decode_dp = *decode_dp;
  space.token_budgets = *budgets;
  space.dram_gib = *dram;
  space.ssd_tib = *ssd;
  space.routers.clear();
  {
    std::stringstream in(vm["routers"].as<std::string>());
    std::string item;
    while (std::getline(in, item, ',')) {
      auto kind = policies::ParseRouterKind(item);
      if (!kind) return usage("--routers: " + kind.error());
      space.routers.push_back(*kind);
    }
    if (space.routers.empty()) return usage("--routers needs at least one router");
  }
  f.rates = *rates;
  if (auto n = plan::CountCandidates(space); n > plan::kMaxCandidates)
    return usage("the search space holds " + std::to_string(n) + " candidates, more than " +
                 std::to_string(plan::kMaxCandidates) +
                 ": narrow --gpu, --max-gpus, --tp, --dp, --decode-tp, --decode-dp, "
                 "--token-budgets, --dram-gib, --ssd-tib or --routers");
  if (Status st = CheckRunnerOptions(vm); !st.ok()) return usage(st.message());
  f.exhaustive = vm.count("exhaustive") > 0;
  auto progress = ProgressWanted(vm);
  if (!progress) return usage(progress.error());
  f.progress = *progress;
  f.out_dir = vm["out"].as<std::string>();
  if (f.out_dir.empty()) return usage("--out needs a directory");
  *out = std::move(f);
  *exit_code = kExitOk;
  return true;
}

}  // namespace duet::cli
