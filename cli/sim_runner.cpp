#include "cli/sim_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cli/child_processes.h"
#include "cli/commands.h"
#include "common/json_util.h"

extern char** environ;

namespace duet::cli {
namespace {

namespace fs = std::filesystem;

// The value after `flag` in args ("" when absent).
std::string FlagValue(const std::vector<std::string>& args, const std::string& flag) {
  auto it = std::find(args.begin(), args.end(), flag);
  return it == args.end() || it + 1 == args.end() ? "" : *(it + 1);
}

class LocalRunner final : public SimRunner {
 public:
  explicit LocalRunner(int jobs) : jobs_(jobs) {}
  int slots() const override { return jobs_; }

  Status Start(std::uint64_t id, const std::vector<std::string>& args) override {
    const std::string log = (fs::path(FlagValue(args, "--out")) / "log.txt").string();
    std::vector<std::string> all = {"simulate"};
    all.insert(all.end(), args.begin(), args.end());
    auto pid = children_.Spawn(all, log);
    if (!pid) return pid.status();
    running_[id] = *pid;
    return Status::Ok();
  }

  Result<std::optional<Finished>> Poll(Seconds timeout_s) override {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
    while (true) {
      for (auto it = running_.begin(); it != running_.end(); ++it) {
        if (auto status = children_.Wait(it->second, 0)) {
          const Finished f{it->first, *status};
          running_.erase(it);
          return std::optional<Finished>(f);
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::optional<Finished>();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void Cancel(std::uint64_t id) override {
    auto it = running_.find(id);
    if (it == running_.end()) return;
    children_.Stop(it->second, 5);
    running_.erase(it);
  }

 private:
  int jobs_;
  ChildProcesses children_;
  std::map<std::uint64_t, pid_t> running_;
};

// scripts/ray_runner.py in the project's .venv/, spoken to in JSON lines over its stdin and
// stdout (the protocol is in that file).
class RayRunner final : public SimRunner {
 public:
  ~RayRunner() override {
    if (to_ >= 0) ::close(to_);  // EOF: the runner cancels what is left and disconnects
    if (from_ >= 0) ::close(from_);
    if (pid_ > 0) {
      for (int i = 0; i < 300; ++i) {
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  Status Open(const std::string& address, int jobs, const std::string& log_path) {
    const std::string python = Locate(".venv/bin/python");
    const std::string script = Locate("scripts/ray_runner.py");
    if (!fs::exists(python))
      return Status::Error("--ray needs the project's .venv/ with Ray (scripts/venv.sh makes it)");
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
      return Status::Error(std::string("pipe: ") + std::strerror(errno));
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return Status::Error("cannot find the duet binary's path");
    self[n] = '\0';
    std::vector<std::string> args = {python, script, "--address", address, "--duet", self};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_adddup2(&files, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&files, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&files, STDERR_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int rc = posix_spawn(&pid_, python.c_str(), &files, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      return Status::Error("starting the Ray runner: " + std::string(std::strerror(rc)));
    }
    // Its first line: connected (and the cluster's CPUs), or why not.
    auto hello = ReadLine(120);
    if (!hello) return hello.status();
    if (!*hello)
      return Status::Error("the Ray runner did not connect to " + address + " in 120 s; see " +
                           log_path);
    if (!(*hello)->contains("cpus")) {
      return Status::Error("the Ray runner could not connect to " + address + ": " +
                           (*hello)->value("error", std::string("no reason given")) + " (see " +
                           log_path + ")");
    }
    slots_ = jobs > 0 ? jobs : std::max(1, (**hello)["cpus"].get<int>());
    log_path_ = log_path;
    return Status::Ok();
  }

  int slots() const override { return slots_; }

  Status Start(std::uint64_t id, const std::vector<std::string>& args) override {
    return Send({{"op", "start"}, {"id", id}, {"args", args}});
  }

  Result<std::optional<Finished>> Poll(Seconds timeout_s) override {
    while (true) {
      auto line = ReadLine(timeout_s);
      if (!line) return line.status();
      if (!*line) return std::optional<Finished>();
      const nlohmann::json& j = **line;
      if (j.contains("id") && j.contains("exit")) {
        const auto id = j["id"].get<std::uint64_t>();
        if (cancelled_.erase(id)) continue;  // finished as it was being cancelled
        return std::optional<Finished>(Finished{id, j["exit"].get<int>()});
      }
      return Status::Error("the Ray runner says: " + j.dump() + " (see " + log_path_ + ")");
    }
  }

  void Cancel(std::uint64_t id) override {
    cancelled_.insert(id);
    (void)Send({{"op", "cancel"}, {"id", id}});
  }

 private:
  Status Send(const nlohmann::json& message) {
    const std::string line = message.dump() + "\n";
    std::size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(to_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::Error("the Ray runner exited; see " + log_path_);
      done += static_cast<std::size_t>(n);
    }
    return Status::Ok();
  }

  // One JSON line, nullopt after `timeout_s` without one.
  Result<std::optional<nlohmann::json>> ReadLine(Seconds timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
    while (true) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        const std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded() || !j.is_object())
          return Status::Error("the Ray runner wrote a line that is not a JSON object: " +
                               line.substr(0, 200));
        return std::optional<nlohmann::json>(std::move(j));
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      pollfd p{from_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::max<long long>(0, left)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) return std::optional<nlohmann::json>();
      char chunk[65536];
      const ssize_t n = ::read(from_, chunk, sizeof chunk);
      if (n <= 0) return Status::Error("the Ray runner exited; see " + log_path_);
      if (buffer_.size() > (1u << 20)) return Status::Error("the Ray runner wrote a runaway line");
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  int slots_ = 1;
  std::string buffer_, log_path_;
  std::set<std::uint64_t> cancelled_;
};

}  // namespace

Status ClaimResultsDir(const std::string& out_dir, const nlohmann::json& inputs,
                       const std::string& other) {
  const fs::path path = fs::path(out_dir) / "inputs.json";
  if (fs::exists(path)) {
    auto previous = ReadJsonFile(path.string());
    if (!previous) return previous.status();
    if (*previous != inputs)
      return Status::Error(out_dir + " holds " + other + ": give another --out or remove it");
    return Status::Ok();
  }
  std::ofstream f(path);
  f << inputs.dump(2) << "\n";
  if (!f) return Status::Error(path.string() + ": write failed");
  return Status::Ok();
}

namespace {
volatile std::sig_atomic_t stop_requested = 0;
extern "C" void OnStopSignal(int) { stop_requested = 1; }
}  // namespace

void CatchStopSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool StopRequested() { return stop_requested != 0; }

Result<std::unique_ptr<SimRunner>> MakeRunner(const boost::program_options::variables_map& vm,
                                              const std::string& ray_log) {
  const int jobs = vm["jobs"].as<int>();
  if (!vm.count("ray")) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::unique_ptr<SimRunner>(std::make_unique<LocalRunner>(jobs > 0 ? jobs : cores));
  }
  auto runner = std::make_unique<RayRunner>();
  DUET_RETURN_IF_ERROR(runner->Open(vm["ray"].as<std::string>(), jobs, ray_log));
  return std::unique_ptr<SimRunner>(std::move(runner));
}

}  // namespace duet::cli
