// The flags of `duet plan` (cli/plan.cpp; fuzz/cli_plan_args_fuzz.cpp): the SLO target, the
// search space, prices, rates and how to search.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

#include "plan/space.h"
#include "policies/metrics.h"

namespace duet::cli {

struct PlanFlags {
  policies::Slo slo;
  double attainment = 0.99;
  plan::SpaceOptions space;
  plan::Prices prices;
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
