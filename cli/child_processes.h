// Processes a `duet` command starts: this binary with a subcommand (serve's worker processes,
// validate's server, replay and simulation runs), each in a process group of its own (a
// terminal's Ctrl-C reaches only the parent, which stops them in order) with no signal blocked,
// its output optionally to a file. Those still running when the set goes are killed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace duet::cli {

// What a child process used, from its exit (wait4): its own and its reaped children's.
struct ChildUsage {
  Seconds cpu_s = 0;                      // user plus system CPU time
  std::int64_t involuntary_switches = 0;  // times the kernel took a CPU from it (ru_nivcsw)
};

class ChildProcesses {
 public:
  ChildProcesses() = default;
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;
  ~ChildProcesses() { Reap(0); }

  // Starts `duet args...`; stdout and stderr go to `log_path` when it is not empty. The child
  // gets this process's environment (with SetEnv's variables) and no descriptor but 0-2: a
  // socket or file opened without close-on-exec (a library's) stays here.
  Result<pid_t> Spawn(const std::vector<std::string>& args, const std::string& log_path = "");
  // `name`=`value` in the environment of every child started from now on (this process's own
  // stays as it is: setenv is not safe while other threads run).
  void SetEnv(const std::string& name, const std::string& value);
  // A child that exited already, as "process PID exited (status N)"; empty while all run.
  std::string Exited();
  // Waits up to `timeout_s` for `pid` to exit: its exit status, or 128 + the signal that ended
  // it; nullopt when it still runs.
  std::optional<int> Wait(pid_t pid, Seconds timeout_s);
  // SIGTERM, then SIGKILL when it has not exited after `timeout_s`; its exit status as Wait's.
  int Stop(pid_t pid, Seconds timeout_s);
  // Waits up to `timeout_s` for every child to exit, then kills the rest.
  void Reap(Seconds timeout_s);
  // What a child that Wait or Stop saw exit used; nullopt for any other pid.
  std::optional<ChildUsage> UsageOf(pid_t pid) const;

 private:
  std::vector<pid_t> pids_;
  std::map<pid_t, ChildUsage> usage_;
  std::map<std::string, std::string> env_;  // SetEnv's
};

// Keeps some children of a ChildProcesses running (duet serve's worker processes): a thread
// notices one that exited unasked (a crash, SIGKILL, the OOM killer: any exit but status 0) and
// starts it again with the same arguments, after a delay that doubles from `first_delay_s` (to
// 30 s at most), at most `max_restarts` times each. One that had run for `healthy_after_s` when
// it exited was healthy: its restarts and delay start over, so that rare crashes over a long
// life never spend its budget, while a crash loop still does. While it runs it alone waits for
// the set's children: Stop() it before stopping or reaping them.
class Supervisor {
 public:
  struct Options {
    int max_restarts = 5;
    Seconds first_delay_s = 0.5;
    Seconds healthy_after_s = 300;
    std::string name = "process";  // its log lines begin "NAME PID exited ..."
  };
  Supervisor(ChildProcesses& children, Options options)
      : children_(children), options_(std::move(options)) {}
  ~Supervisor() { Stop(); }
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Before Start: keep `pid`, started with `args`, running.
  void Keep(pid_t pid, std::vector<std::string> args);
  void Start();
  // Ends the thread; the children it started stay in the set.
  void Stop();

 private:
  struct Kept {
    pid_t pid = 0;  // running; 0: to start again at `due`; -1: left stopped
    std::vector<std::string> args;
    int restarts = 0;
    Seconds delay_s = 0;
    std::chrono::steady_clock::time_point due;
    std::chrono::steady_clock::time_point started;  // of the process running now
  };
  void Loop();

  ChildProcesses& children_;
  Options options_;
  std::vector<Kept> kept_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace duet::cli
