// The layering of ARCHITECTURE.md, checked on every source under each layer's directory
// (recursively): common/, traces/, models/, policies/ and deploy/ include only the C++ standard
// library, nlohmann/json.hpp and the Duet layers below them; sim/ is the only place that includes
// SimGrid; backend/ the only one that includes UCX, NCCL, HTTP (Beast/Asio) or metrics
// exposition headers; backend/ and kernels/cuda/ the only ones with CUDA headers; no layer
// includes one above it; and of cli/, only the commands that run simulations include sim/. Also
// checks that the checker itself rejects such includes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// Libraries whose headers only some layers may include, by the start of the include path.
const std::map<std::string, std::vector<std::string>> kFamilies = {
    {"simgrid", {"simgrid/", "xbt/", "xbt.h"}},
    {"cuda", {"cuda", "cublas", "cub/", "thrust/", "cuda_runtime", "curand", "nvrtc"}},
    {"ucx", {"ucp/", "uct/", "ucs/"}},
    {"nccl", {"nccl"}},
    {"http", {"boost/beast", "boost/asio", "prometheus/"}},
};

std::string FamilyOf(const std::string& target) {
  for (const auto& [family, prefixes] : kFamilies) {
    for (const auto& p : prefixes) {
      if (target.rfind(p, 0) == 0) return family;
    }
  }
  return "";
}

struct Rule {
  std::set<std::string> layers;    // Duet directories it may include from
  std::set<std::string> families;  // restricted libraries it may include
  bool pure = false;               // only the standard library and nlohmann/json.hpp
};

// Keyed by directory relative to the source root; the longest matching key applies.
const std::map<std::string, Rule> kRules = {
    {"common", {{"common"}, {}, true}},
    {"traces", {{"common", "traces"}, {}, true}},
    {"models", {{"common", "models"}, {}, true}},
    {"policies", {{"common", "models", "traces", "policies"}, {}, true}},
    // deploy: the deployment description both worlds read (cluster files' instances, roles,
    // engine settings).
    {"deploy", {{"common", "models", "traces", "policies", "deploy"}, {}, true}},
    {"sim", {{"common", "models", "traces", "policies", "deploy", "sim"}, {"simgrid"}, false}},
    // plan: the capacity search; runs simulations as processes, so no SimGrid of its own.
    {"plan", {{"common", "models", "traces", "policies", "deploy", "sim", "plan"}, {}, false}},
    {"kernels", {{"common", "kernels"}, {}, false}},
    {"kernels/cuda", {{"common", "kernels"}, {"cuda"}, false}},
    {"backend",
     {{"common", "models", "traces", "policies", "deploy", "kernels", "backend"},
      {"cuda", "ucx", "nccl", "http"},
      false}},
    {"cli",
     {{"common", "models", "traces", "policies", "deploy", "kernels", "sim", "plan", "backend",
       "cli"},
      {},
      false}},
};

const Rule& RuleFor(const std::string& dir) {
  const Rule* best = nullptr;
  std::size_t best_len = 0;
  for (const auto& [key, rule] : kRules) {
    if ((dir == key || dir.rfind(key + "/", 0) == 0) && key.size() >= best_len) {
      best = &rule;
      best_len = key.size();
    }
  }
  return *best;
}

bool Allowed(const Rule& rule, const std::string& target, bool angle) {
  const std::string family = FamilyOf(target);
  if (!family.empty()) return rule.families.count(family) != 0;
  const auto slash = target.find('/');
  const std::string top = slash == std::string::npos ? "" : target.substr(0, slash);
  if (!angle || kRules.count(top)) return !top.empty() && rule.layers.count(top) != 0;
  if (!rule.pure) return true;
  // Standard headers have neither a directory nor an extension; the one library allowed.
  if (target == "nlohmann/json.hpp") return true;
  return slash == std::string::npos && target.find('.') == std::string::npos;
}

// Returns "file:line: text" for every include of `path` that `dir`'s rule forbids.
std::vector<std::string> Violations(const std::string& dir, const fs::path& path) {
  static const std::regex include_re(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  const Rule& rule = RuleFor(dir);
  std::vector<std::string> bad;
  std::ifstream in(path);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::smatch m;
    if (std::regex_search(line, m, include_re) && !Allowed(rule, m[2], m[1] == "<"))
      bad.push_back(path.string() + ":" + std::to_string(number) + ": " + line);
  }
  return bad;
}

// "file:line: text" for every include of sim/ in `path`.
std::vector<std::string> SimIncludes(const fs::path& path) {
  static const std::regex sim_re(R"(^\s*#\s*include\s*[<"]sim/)");
  std::vector<std::string> found;
  std::ifstream in(path);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (std::regex_search(line, sim_re))
      found.push_back(path.string() + ":" + std::to_string(number) + ": " + line);
  }
  return found;
}

bool IsSource(const fs::path& p) {
  static const std::set<std::string> kExt = {".h", ".hpp", ".cpp", ".cu", ".cuh", ".inc"};
  return kExt.count(p.extension().string()) != 0;
}

TEST(Layering, EveryLayerIncludesOnlyWhatItsRuleAllows) {
  const fs::path root(DUET_SOURCE_DIR);
  for (const std::string top : {"common", "traces", "models", "policies", "deploy", "sim", "plan",
                                "kernels", "backend", "cli"}) {
    int files = 0;
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      if (!entry.is_regular_file() || !IsSource(entry.path())) continue;
      ++files;
      const std::string dir = fs::relative(entry.path().parent_path(), root).generic_string();
      for (const std::string& v : Violations(dir, entry.path())) ADD_FAILURE() << v;
    }
    EXPECT_GE(files, 2) << top << "/ has no sources: wrong directory?";
  }
}

TEST(Layering, TheCheckerRejectsForbiddenIncludes) {
  const auto path = fs::temp_directory_path() / "duet_layering_probe.cpp";
  {
    std::ofstream out(path);
    out << "#include <vector>\n#include \"policies/engine.h\"\n#include <simgrid/s4u.hpp>\n"
           "#include <cuda_runtime.h>\n#include <ucp/api/ucp.h>\n#include <nccl.h>\n"
           "#include <boost/beast/http.hpp>\n#include \"sim/simulation.h\"\n"
           "#include \"backend/serve/frontend.h\"\n#include <prometheus/registry.h>\n";
  }
  EXPECT_EQ(Violations("policies", path).size(), 8u);
  EXPECT_EQ(Violations("models", path).size(), 9u);        // models may not include policies/
  EXPECT_EQ(Violations("policies/sub", path).size(), 8u);  // the rule covers subdirectories
  EXPECT_EQ(Violations("deploy", path).size(), 8u);        // as pure as policies/
  // sim: SimGrid and the layers below, but no GPU, network or HTTP library and not backend/.
  EXPECT_EQ(Violations("sim", path).size(), 6u);
  // backend: everything but SimGrid and sim/.
  EXPECT_EQ(Violations("backend/serve", path).size(), 2u);
  // kernels: CUDA only under kernels/cuda; never policies/ or above.
  EXPECT_EQ(Violations("kernels/cpu", path).size(), 9u);
  EXPECT_EQ(Violations("kernels/cuda", path).size(), 8u);
  // plan: the layers up to sim/, no restricted library (SimGrid included), not backend/.
  EXPECT_EQ(Violations("plan", path).size(), 7u);
  // cli: any Duet layer, none of the restricted libraries directly.
  EXPECT_EQ(Violations("cli", path).size(), 6u);
  EXPECT_EQ(SimIncludes(path).size(), 1u);
  fs::remove(path);
}

// The live commands learn the deployment from deploy/, never from the simulator's layer: only
// the commands that run simulations include sim/.
TEST(Layering, OnlyTheSimulatorsCommandsIncludeSim) {
  const std::set<std::string> simulating = {"simulate.cpp", "sweep.cpp", "plan.cpp",
                                            "plan_flags.cpp", "validate.cpp"};
  int files = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(DUET_SOURCE_DIR) / "cli")) {
    if (!entry.is_regular_file() || !IsSource(entry.path())) continue;
    ++files;
    if (simulating.count(entry.path().filename().string())) continue;
    for (const std::string& v : SimIncludes(entry.path()))
      ADD_FAILURE() << v << " (a live command: read the deployment from deploy/)";
  }
  EXPECT_GE(files, 10);
}

}  // namespace
