// Helpers shared by the traces tests: substring assertions for error messages, paths to the
// real traces in ../shared, and a per-test temporary directory.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/shared_traces.h"
#include "traces/trace.h"

namespace duet::traces::testing {

inline std::string MooncakePath() {
  return duet::testing::SharedTrace("mooncake_conversation.jsonl");
}
inline std::string AzurePath() { return duet::testing::SharedTrace("azure_conv_2023.csv"); }
inline std::string BundledPath(const std::string& name) {
  return std::string(DUET_SOURCE_DIR) + "/traces/bundled/" + name;
}

// Passes when `text` contains every one of `parts`; the failure shows the whole text.
inline ::testing::AssertionResult ContainsAll(const std::string& text,
                                              std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    if (text.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << text << "' lacks '" << part << "'";
    }
  }
  return ::testing::AssertionSuccess();
}

// A fresh directory under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("duet_traces_" + std::string(info ? info->name() : "test") + "_" +
             std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(const std::string& name) const { return (path_ / name).string(); }
  std::string Write(const std::string& name, const std::string& contents) const {
    std::ofstream out(File(name), std::ios::binary);
    out << contents;
    return File(name);
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace duet::traces::testing
