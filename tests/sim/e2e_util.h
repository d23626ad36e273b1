// Helpers for the end-to-end tests of `duet simulate` (tests/sim and tests/cli): run the duet
// binary as a subprocess (SimGrid allows one simulation per process), read its output files,
// parse requests.csv, and make a private temporary directory per test.
//
// The binary always runs from the source root (DUET_SOURCE_DIR), so relative paths such as
// "sim/clusters/h100-8p8d-llama8b.json" and "traces/bundled/tiny.json" resolve the same way
// whatever directory the test itself was started from.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/shared_traces.h"

namespace duet::e2e {

namespace fs = std::filesystem;

inline std::string SourceDir() { return DUET_SOURCE_DIR; }
inline std::string DuetBinary() { return std::string(DUET_BINARY_DIR) + "/bin/duet"; }
inline std::string MooncakeTracePath() {
  return duet::testing::SharedTrace("mooncake_conversation.jsonl");
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

inline void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
  if (!out) throw std::runtime_error(path + ": cannot write");
}

inline nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadFile(path));
}

inline void WriteJson(const std::string& path, const nlohmann::json& doc) {
  WriteFile(path, doc.dump(2) + "\n");
}

// A fresh directory under the system temp directory, removed with the object (kept when
// DUET_E2E_KEEP_TMP is set, to look at a failing run's files).
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string test =
        info ? std::string(info->test_suite_name()) + "." + info->name() : std::string("test");
    path_ = fs::temp_directory_path() / ("duet_e2e_" + test + "_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    if (std::getenv("DUET_E2E_KEEP_TMP")) return;
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const fs::path& path() const { return path_; }
  // Path of `name` inside the directory (not created).
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  // Writes `contents` to `name` and returns its path.
  std::string Write(const std::string& name, const std::string& contents) const {
    WriteFile(File(name), contents);
    return File(name);
  }

 private:
  fs::path path_;
};

// Quotes one argument for /bin/sh.
inline std::string ShellQuote(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

struct RunResult {
  std::string command;
  int exit_code = -1;  // -1: did not exit normally
  std::string out;     // stdout
  std::string err;     // stderr
  std::string all() const { return out + err; }
};

inline std::ostream& operator<<(std::ostream& os, const RunResult& r) {
  return os << "$ " << r.command << "\nexit " << r.exit_code << "\n--- stdout\n"
            << r.out << "--- stderr\n"
            << r.err;
}

// Runs `duet args...` from the source root with stdout and stderr redirected to files (so
// neither is a terminal) and returns the exit status and both streams.
inline RunResult RunDuet(const std::vector<std::string>& args) {
  static std::atomic<int> counter{0};
  const fs::path base = fs::temp_directory_path() / ("duet_e2e_run_" + std::to_string(::getpid()) +
                                                     "_" + std::to_string(counter++));
  const std::string out_path = base.string() + ".out", err_path = base.string() + ".err";
  RunResult r;
  r.command = ShellQuote(DuetBinary());
  for (const std::string& a : args) {
    r.command += ' ';  // appended, not `" " + ...`: GCC 12 warns falsely (-Wrestrict) on that
    r.command += ShellQuote(a);
  }
  const std::string shell = "cd " + ShellQuote(SourceDir()) + " && " + r.command + " >" +
                            ShellQuote(out_path) + " 2>" + ShellQuote(err_path) + " </dev/null";
  const int status = std::system(shell.c_str());
  if (status != -1 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  std::error_code ignored;
  if (fs::exists(out_path)) r.out = ReadFile(out_path);
  if (fs::exists(err_path)) r.err = ReadFile(err_path);
  fs::remove(out_path, ignored);
  fs::remove(err_path, ignored);
  return r;
}

// Starts `duet args...` from the source root with stderr into `stderr_path`, and does not wait:
// its pid (-1 when fork failed). For tests that signal a run in progress, then WaitForExit.
inline pid_t SpawnDuet(const std::vector<std::string>& args, const std::string& stderr_path) {
  std::vector<std::string> argv_s = {DuetBinary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(SourceDir().c_str()) != 0) ::_exit(127);
    if (!std::freopen(stderr_path.c_str(), "w", stderr)) ::_exit(127);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// The wait status of `pid` once it exits, within `timeout`; nullopt when it did not (it is
// then killed and reaped).
inline std::optional<int> WaitForExit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

// Runs `duet simulate` with `args` plus --out `out_dir`; fails the current test (with the
// whole output) unless it exits 0.
inline RunResult Simulate(const std::string& out_dir, std::vector<std::string> args) {
  args.insert(args.begin(), "simulate");
  args.push_back("--out");
  args.push_back(out_dir);
  RunResult r = RunDuet(args);
  EXPECT_EQ(r.exit_code, 0) << r;
  return r;
}

// Passes when `text` contains every one of `parts`; the failure shows the whole text.
inline ::testing::AssertionResult ContainsAll(const std::string& text,
                                              std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    if (text.find(part) == std::string::npos)
      return ::testing::AssertionFailure() << "output lacks '" << part << "':\n" << text;
  }
  return ::testing::AssertionSuccess();
}

// A parsed CSV file with a header row (RFC 4180 quoting: "a,b" and "" inside quotes).
class Csv {
 public:
  static Csv Parse(const std::string& text) {
    Csv csv;
    std::vector<std::string> row;
    std::string field;
    bool quoted = false, any = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (quoted) {
        if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else if (c == '"') {
          quoted = false;
        } else {
          field += c;
        }
        continue;
      }
      any = true;
      if (c == '"') {
        quoted = true;
      } else if (c == ',') {
        row.push_back(std::move(field));
        field.clear();
      } else if (c == '\n') {
        row.push_back(std::move(field));
        field.clear();
        csv.AddRow(std::move(row));
        row.clear();
        any = false;
      } else if (c != '\r') {
        field += c;
      }
    }
    if (any) {
      row.push_back(std::move(field));
      csv.AddRow(std::move(row));
    }
    return csv;
  }
  static Csv Read(const std::string& path) { return Parse(ReadFile(path)); }

  const std::vector<std::string>& header() const { return header_; }
  std::size_t size() const { return rows_.size(); }
  const std::vector<std::string>& row(std::size_t i) const { return rows_.at(i); }
  // Index of column `name`; throws when there is none.
  std::size_t Column(const std::string& name) const {
    for (std::size_t i = 0; i < header_.size(); ++i) {
      if (header_[i] == name) return i;
    }
    throw std::runtime_error("no column '" + name + "'");
  }
  const std::string& Get(std::size_t row, const std::string& column) const {
    return rows_.at(row).at(Column(column));
  }
  double Number(std::size_t row, const std::string& column) const {
    const std::string& s = Get(row, column);
    std::size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size()) throw std::runtime_error("'" + s + "' in " + column + " is not a number");
    return v;
  }

 private:
  void AddRow(std::vector<std::string> row) {
    if (header_.empty()) {
      header_ = std::move(row);
    } else {
      rows_.push_back(std::move(row));
    }
  }
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// summary.json without the one key that varies between identical runs (sim.wall_s).
inline nlohmann::json StableSummary(nlohmann::json summary) {
  if (summary.contains("sim") && summary["sim"].is_object()) summary["sim"].erase("wall_s");
  return summary;
}

}  // namespace duet::e2e
