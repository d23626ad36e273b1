// The layering of ARCHITECTURE.md, checked on the sources: common/, traces/, models/ and
// policies/ include only the C++ standard library, nlohmann/json.hpp and the Duet layers below
// them, so never SimGrid, CUDA, UCX, NCCL or HTTP headers. Also checks that the checker itself
// rejects such an include.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

// Duet directories each pure layer may include from.
const std::map<std::string, std::set<std::string>> kAllowedLayers = {
    {"common", {"common"}},
    {"traces", {"common", "traces"}},
    {"models", {"common", "models"}},
    {"policies", {"common", "models", "traces", "policies"}},
};

bool Allowed(const std::string& layer, const std::string& target, bool angle) {
  if (angle) {
    // Standard headers have neither a directory nor an extension; the one library allowed.
    if (target == "nlohmann/json.hpp") return true;
    return target.find('/') == std::string::npos && target.find('.') == std::string::npos;
  }
  const auto slash = target.find('/');
  return slash != std::string::npos && kAllowedLayers.at(layer).count(target.substr(0, slash));
}

// Returns "file:line: text" for every include of `path` that `layer` may not have.
std::vector<std::string> Violations(const std::string& layer, const std::filesystem::path& path) {
  static const std::regex include_re(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  std::vector<std::string> bad;
  std::ifstream in(path);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::smatch m;
    if (std::regex_search(line, m, include_re) && !Allowed(layer, m[2], m[1] == "<"))
      bad.push_back(path.string() + ":" + std::to_string(number) + ": " + line);
  }
  return bad;
}

TEST(Layering, PureLayersIncludeNoSimulatorGpuNetworkOrHttpHeaders) {
  for (const auto& [layer, allowed] : kAllowedLayers) {
    int files = 0;
    for (const auto& entry :
         std::filesystem::directory_iterator(std::filesystem::path(DUET_SOURCE_DIR) / layer)) {
      const std::string ext = entry.path().extension().string();
      if (ext != ".h" && ext != ".hpp" && ext != ".cpp" && ext != ".cu" && ext != ".cuh") continue;
      ++files;
      for (const std::string& v : Violations(layer, entry.path())) ADD_FAILURE() << v;
    }
    EXPECT_GE(files, 2) << layer << "/ has no sources: wrong directory?";
  }
}

TEST(Layering, TheCheckerRejectsForbiddenIncludes) {
  const auto path = std::filesystem::temp_directory_path() / "duet_layering_probe.cpp";
  {
    std::ofstream out(path);
    out << "#include <vector>\n#include \"policies/engine.h\"\n#include <simgrid/s4u.hpp>\n"
           "#include <cuda_runtime.h>\n#include <ucp/api/ucp.h>\n#include <nccl.h>\n"
           "#include <boost/beast/http.hpp>\n#include \"sim/simulation.h\"\n";
  }
  EXPECT_EQ(Violations("policies", path).size(), 6u);
  EXPECT_EQ(Violations("models", path).size(), 7u);  // models may not include policies/
  std::filesystem::remove(path);
}

}  // namespace
