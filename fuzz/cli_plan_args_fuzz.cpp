// Fuzz target for the command-line parsing of `duet plan` (cli::ParsePlanArgs): the input's
// lines are the arguments. Any arguments must give flags, help, or a usage error (exit 2) with a
// message; never a crash, an escaping exception, a file read, or a search space too large to
// hold.
#include <cstdint>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/plan_flags.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args = {"plan"};
  std::string current;
  for (std::size_t i = 0; i < size && args.size() < 64; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == '\n') {
      args.push_back(current);
      current.clear();
    } else if (c != '\0') {  // argv strings cannot hold NUL
      current += c;
    }
  }
  if (!current.empty()) args.push_back(current);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  boost::program_options::variables_map vm;
  duet::cli::PlanFlags flags;
  int code = -1;
  const bool ok =
      duet::cli::ParsePlanArgs(static_cast<int>(args.size()), argv.data(), vm, &flags, &code);
  if (ok ? code != duet::cli::kExitOk : code != duet::cli::kExitOk && code != duet::cli::kExitUsage)
    __builtin_trap();
  if (ok && (flags.rates.empty() || !flags.slo.any() ||
             duet::plan::CountCandidates(flags.space) > duet::plan::kMaxCandidates))
    __builtin_trap();
  return 0;
}
