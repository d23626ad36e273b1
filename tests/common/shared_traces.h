// The real production traces in ../shared/traces, beside the checkout (never copied into the
// repository). Where they are absent, a test that needs one says so on stdout with the marker
// ctest's SKIP_REGULAR_EXPRESSION looks for (tests/CMakeLists.txt), so it counts as skipped with
// that message instead of failing.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

namespace duet::testing {

inline std::string SharedTrace(const std::string& name) {
  const std::string path = std::string(DUET_SHARED_DIR) + "/traces/" + name;
  if (!std::filesystem::exists(path)) {
    std::printf("duet-test-skip: needs %s (the shared traces beside the checkout)\n",
                path.c_str());
    std::fflush(stdout);
  }
  return path;
}

}  // namespace duet::testing
