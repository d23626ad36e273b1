// Fuzz target for the command-line parsing of `duet simulate` (cli::ParseSimulateArgs, with the
// shared ParseArgs and trace flags): the input's lines are the arguments. Any arguments must
// give options, help, or a usage error (exit 2) with a message; never a crash, an escaping
// exception, or a file read.
#include <cstdint>

#include "cli/commands.h"
#include "fuzz/command_line.h"
#include "sim/simulation.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzCommandLine line("simulate", data, size);
  boost::program_options::variables_map vm;
  duet::sim::SimOptions options;
  int code = -1;
  const bool ok = duet::cli::ParseSimulateArgs(line.argc(), line.argv.data(), vm, &options, &code);
  if (ok ? code != duet::cli::kExitOk : code != duet::cli::kExitOk && code != duet::cli::kExitUsage)
    __builtin_trap();
  return 0;
}
