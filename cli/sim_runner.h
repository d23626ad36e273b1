// Where `duet plan` and `duet sweep` run their simulations: `duet simulate` processes on this
// machine, or Ray tasks running the same binary on a Ray cluster (scripts/ray_runner.py, from
// the project's .venv/). Either way a simulation's files end up in its output directory on this
// machine: summary.json, requests.csv, links.csv and log.txt (its stdout and stderr).
#pragma once

#include <boost/program_options.hpp>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace duet::cli {

class SimRunner {
 public:
  struct Finished {
    std::uint64_t id;
    int exit_status;  // duet simulate's, or 128 + a signal
  };
  virtual ~SimRunner() = default;
  // How many simulations it runs at once to keep its cores busy.
  virtual int slots() const = 0;
  // Starts `duet simulate --cluster CLUSTER ... --out OUT_DIR ...` (both flags are in `args`).
  virtual Status Start(std::uint64_t id, const std::vector<std::string>& args) = 0;
  // The next simulation to finish, waiting up to `timeout_s`; nullopt when none did. Errors:
  // the runner itself failed (a Ray runner that exited).
  virtual Result<std::optional<Finished>> Poll(Seconds timeout_s) = 0;
  // Stops a running simulation; it is not reported.
  virtual void Cancel(std::uint64_t id) = 0;
};

// A results directory of many runs (plan, sweep) belongs to the inputs it was made for: records
// them in OUT/inputs.json the first time, and refuses a directory that records others (`other`
// says what those are, for the message), so that a resume never mixes two searches.
Status ClaimResultsDir(const std::string& out_dir, const nlohmann::json& inputs,
                       const std::string& other);

// SIGINT and SIGTERM set a flag instead of ending the process, so that a command running many
// simulations can stop them (a runner's destructor does) and say where it stopped; the runs that
// finished stay in its results directory.
void CatchStopSignals();
bool StopRequested();

// From the flags AddRunnerOptions (cli/commands.h) adds. With --ray: connects to the Ray cluster
// whose head is at that address, --jobs tasks at once (0: one per CPU it has); its messages go to
// `ray_log`. The duet binary and every file the arguments name must be at the same paths on its
// nodes (one machine, a shared file system or the same image). Without: --jobs `duet simulate`
// processes here (0: one per core).
Result<std::unique_ptr<SimRunner>> MakeRunner(const boost::program_options::variables_map& vm,
                                              const std::string& ray_log);

}  // namespace duet::cli
