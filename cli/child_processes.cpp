#include "cli/child_processes.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

extern char** environ;

namespace duet::cli {
namespace {

int ExitStatus(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

Result<pid_t> ChildProcesses::Spawn(const std::vector<std::string>& args,
                                    const std::string& log_path) {
  std::vector<std::string> all = {"duet"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  // This environment, SetEnv's variables in place of any of the same name.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    if (env_.find(std::string(name)) == env_.end()) env_strings.emplace_back(entry);
  }
  for (const auto& [name, value] : env_) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
  }
  // Every other descriptor closes in the child before exec (close_range): the backstop for
  // those opened without close-on-exec (Asio's sockets: the HTTP listener, clients' sockets),
  // which a worker would otherwise hold open for as long as it lives.
  posix_spawn_file_actions_addclosefrom_np(&files, STDERR_FILENO + 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &files, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&files);
  if (rc != 0) return Status::Error("starting duet " + args.front() + ": " + std::strerror(rc));
  pids_.push_back(pid);
  return pid;
}

void ChildProcesses::SetEnv(const std::string& name, const std::string& value) {
  env_[name] = value;
}

std::string ChildProcesses::Exited() {
  for (pid_t pid : pids_) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) != pid) continue;
    std::erase(pids_, pid);
    return "process " + std::to_string(pid) + " exited (" +
           (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                              : "signal " + std::to_string(WTERMSIG(status))) +
           ")";
  }
  return "";
}

std::optional<int> ChildProcesses::Wait(pid_t pid, Seconds timeout_s) {
  DUET_CHECK(pid > 0);  // waitpid would take 0 and -1 for a group or any child
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  while (true) {
    int status = 0;
    struct rusage ru {};
    if (::wait4(pid, &status, WNOHANG, &ru) == pid) {
      std::erase(pids_, pid);
      usage_[pid] = {static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6,
                     static_cast<std::int64_t>(ru.ru_nivcsw)};
      return ExitStatus(status);
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<ChildUsage> ChildProcesses::UsageOf(pid_t pid) const {
  const auto it = usage_.find(pid);
  if (it == usage_.end()) return std::nullopt;
  return it->second;
}

int ChildProcesses::Stop(pid_t pid, Seconds timeout_s) {
  ::kill(pid, SIGTERM);
  if (auto status = Wait(pid, timeout_s)) return *status;
  ::kill(pid, SIGKILL);
  return Wait(pid, 60).value_or(128 + SIGKILL);
}

void Supervisor::Keep(pid_t pid, std::vector<std::string> args) {
  DUET_CHECK(!thread_.joinable());
  kept_.push_back(
      {pid, std::move(args), 0, options_.first_delay_s, {}, std::chrono::steady_clock::now()});
}

void Supervisor::Start() {
  DUET_CHECK(!thread_.joinable());
  if (kept_.empty()) return;  // nothing to keep running
  thread_ = std::thread([this] { Loop(); });
}

void Supervisor::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Supervisor::Loop() {
  constexpr Seconds kMaxDelay = 30;
  const char* name = options_.name.c_str();
  auto after = [](std::chrono::steady_clock::time_point t, Seconds delay_s) {
    return t + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(delay_s));
  };
  std::unique_lock lock(mu_);
  while (!stop_) {
    for (Kept& k : kept_) {
      const auto now = std::chrono::steady_clock::now();
      if (k.pid > 0) {  // (-1 must never reach waitpid: it means any child)
        const std::optional<int> status = children_.Wait(k.pid, 0);
        if (!status) continue;
        if (*status == 0) {  // it was asked to stop: keep it stopped
          k.pid = -1;
          continue;
        }
        if (now >= after(k.started, options_.healthy_after_s)) {
          k.restarts = 0;
          k.delay_s = options_.first_delay_s;
        }
        if (k.restarts >= options_.max_restarts) {
          std::fprintf(stderr,
                       "%s %d exited (status %d); not starting it again after %d restarts\n", name,
                       static_cast<int>(k.pid), *status, k.restarts);
          k.pid = -1;
          continue;
        }
        std::fprintf(stderr,
                     "%s %d exited (status %d); starting it again in %.1f s (restart "
                     "%d of %d)\n",
                     name, static_cast<int>(k.pid), *status, k.delay_s, k.restarts + 1,
                     options_.max_restarts);
        k.pid = 0;
        k.due = after(now, k.delay_s);
      }
      if (k.pid == 0 && now >= k.due) {
        ++k.restarts;
        k.delay_s = std::min(2 * k.delay_s, kMaxDelay);
        auto pid = children_.Spawn(k.args);
        if (pid) {
          k.pid = *pid;
          k.started = now;
          std::fprintf(stderr, "%s started again as pid %d\n", name, static_cast<int>(*pid));
        } else {  // tried again after the next delay, while restarts are left
          std::fprintf(stderr, "%s: %s\n", name, pid.error().c_str());
          k.pid = k.restarts < options_.max_restarts ? 0 : -1;
          k.due = after(now, k.delay_s);
        }
      }
    }
    wake_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

void ChildProcesses::Reap(Seconds timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  while (!pids_.empty() && std::chrono::steady_clock::now() < deadline) {
    std::erase_if(pids_, [](pid_t pid) { return ::waitpid(pid, nullptr, WNOHANG) == pid; });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : pids_) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  pids_.clear();
}

}  // namespace duet::cli
