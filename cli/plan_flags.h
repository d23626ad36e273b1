// The flags of `duet plan` (cli/plan.cpp; fuzz/cli_plan_args_fuzz.cpp): the SLO target, the
// search space, prices, rates and how to search.
#pragma once

#include <boost/program_options.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plan/space.h"
#include "policies/metrics.h"

namespace duet::cli {

struct PlanFlags {
  policies::Slo slo;
  double attainment = 0.99;
  plan::SpaceOptions space;  // space.gpus: --gpu's types, or one empty name: the base's
  // Prices; prices.gpu_hour is left to the caller, which reads the tables (plan/gpu_prices.h):
  // --gpu-prices's (empty: the bundled one alone), or every type at --gpu-hour-cost when given.
  plan::Prices prices;
  std::string gpu_prices;
  std::optional<double> gpu_hour_cost;
  std::vector<double> rates;  // ascending; the first is the target
  bool exhaustive = false;
  bool progress = false;
  std::string out_dir;
};

// Parses argv[1..] (argv[0] is "plan") into `vm` (for the trace, model, base and runner flags)
// and `out`. False when the caller should return *exit_code at once: a usage error (reported,
// exit 2) or --help (printed, exit 0). Reads no file.
bool ParsePlanArgs(int argc, char** argv, boost::program_options::variables_map& vm, PlanFlags* out,
                   int* exit_code);

}  // namespace duet::cli
