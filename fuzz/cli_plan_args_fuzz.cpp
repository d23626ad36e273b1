// Fuzz target for the command-line parsing of `duet plan` (cli::ParsePlanArgs): the input's
// lines are the arguments. Any arguments must give flags, help, or a usage error (exit 2) with a
// message; never a crash, an escaping exception, a file read, or a search space too large to
// hold.
#include <cstdint>

#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "fuzz/command_line.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzCommandLine line("plan", data, size);
  boost::program_options::variables_map vm;
  duet::cli::PlanFlags flags;
  int code = -1;
  const bool ok = duet::cli::ParsePlanArgs(line.argc(), line.argv.data(), vm, &flags, &code);
  if (ok ? code != duet::cli::kExitOk : code != duet::cli::kExitOk && code != duet::cli::kExitUsage)
    __builtin_trap();
  if (ok && (flags.rates.empty() || !flags.slo.any() ||
             duet::plan::CountCandidates(flags.space) > duet::plan::kMaxCandidates))
    __builtin_trap();
  return 0;
}
