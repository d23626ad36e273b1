// The `duet` command: dispatches to a subcommand (each in its own file under cli/). Exceptions
// that escape a command are reported here, at the edge, as one clear line and exit 1.
#include <cstdio>
#include <new>
#include <string>

#include "backend/registry.h"
#include "cli/commands.h"

using namespace duet;
using duet::cli::Fail;
using duet::cli::kExitOk;
using duet::cli::kExitUsage;

namespace {

void Usage() {
  std::printf(
      "usage: duet <command> [options]\n\n"
      "commands:\n"
      "  simulate         replay a request trace on a simulated PD or colocated cluster\n"
      "  plan             the cheapest cluster that meets an SLO on a trace, searched by "
      "simulation\n"
      "  sweep            every setup of a scenario file at every rate scale, simulated (here or "
      "on Ray)\n"
      "  replay           replay a request trace against a live OpenAI-compatible server\n"
      "  serve            serve a model over an OpenAI-compatible HTTP/WebSocket API\n"
      "  worker           one prefill, decode or colocated instance of a duet serve cluster\n"
      "  calibrate        measure a backend's step times and fit the simulator's cost model\n"
      "  generate         run a model on the CPU backend and print its continuation\n"
      "  make-test-model  write the deterministic tiny test model\n"
      "  model            a model's parameters, weight and KV bytes, and its memory plan on a GPU\n"
      "  validate         the simulator's error against a live run of the same trace\n"
      "  version          print the version and the optional backends built in\n\n"
      "'duet <command> --help' describes a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    Usage();
    return argc < 2 ? kExitUsage : kExitOk;
  }
  const std::string command = argv[1];
  try {
    if (command == "simulate") return cli::Simulate(argc - 1, argv + 1);
    if (command == "plan") return cli::Plan(argc - 1, argv + 1);
    if (command == "sweep") return cli::Sweep(argc - 1, argv + 1);
    if (command == "replay") return cli::Replay(argc - 1, argv + 1);
    if (command == "serve") return cli::Serve(argc - 1, argv + 1);
    if (command == "worker") return cli::Worker(argc - 1, argv + 1);
    if (command == "calibrate") return cli::Calibrate(argc - 1, argv + 1);
    if (command == "validate") return cli::Validate(argc - 1, argv + 1);
    if (command == "generate") return cli::Generate(argc - 1, argv + 1);
    if (command == "model") return cli::Model(argc - 1, argv + 1);
    if (command == "make-test-model") return cli::MakeTestModel(argc - 1, argv + 1);
    if (command == "version" || command == "--version") {
      if (argc > 2) {
        const std::string arg = argv[2];
        if (arg != "--help" && arg != "-h")
          return Fail("version: unexpected argument '" + arg + "' (see duet version --help)",
                      kExitUsage);
        std::printf("duet version: print the version and the optional backends built in\n");
        return kExitOk;
      }
      std::printf("duet 0.1.0 (%s)\n", backend::DescribeFeatures().c_str());
      return kExitOk;
    }
  } catch (const std::bad_alloc&) {
    // The inputs' own checks bound what they ask for; this is the last guard.
    return Fail("out of memory: the inputs ask for more memory than this machine has");
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
  Usage();
  return Fail("unknown command '" + command + "'", kExitUsage);
}
