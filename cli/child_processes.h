// Processes a `duet` command starts: this binary with a subcommand (serve's worker processes,
// validate's server, replay and simulation runs), each in a process group of its own (a
// terminal's Ctrl-C reaches only the parent, which stops them in order) with no signal blocked,
// its output optionally to a file. Those still running when the set goes are killed.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace duet::cli {

class ChildProcesses {
 public:
  ChildProcesses() = default;
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;
  ~ChildProcesses() { Reap(0); }

  // Starts `duet args...`; stdout and stderr go to `log_path` when it is not empty.
  Result<pid_t> Spawn(const std::vector<std::string>& args, const std::string& log_path = "");
  // A child that exited already, as "process PID exited (status N)"; empty while all run.
  std::string Exited();
  // Waits up to `timeout_s` for `pid` to exit: its exit status, or 128 + the signal that ended
  // it; nullopt when it still runs.
  std::optional<int> Wait(pid_t pid, Seconds timeout_s);
  // SIGTERM, then SIGKILL when it has not exited after `timeout_s`; its exit status as Wait's.
  int Stop(pid_t pid, Seconds timeout_s);
  // Waits up to `timeout_s` for every child to exit, then kills the rest.
  void Reap(Seconds timeout_s);

 private:
  std::vector<pid_t> pids_;
};

}  // namespace duet::cli
