// The layering of ARCHITECTURE.md, checked on every source under each layer's directory
// (recursively): common/, traces/, models/, policies/ and deploy/ include only the C++ standard
// library, nlohmann/json.hpp and the Duet layers below them (models/ also Eigen, in .cpp files
// only: the fits' least squares, never in a header its users include); sim/ is the only place that
// includes SimGrid; backend/ the only one that includes UCX, NCCL, HTTP (Beast/Asio) or metrics
// exposition headers; backend/ and kernels/cuda/ the only ones with CUDA headers; no layer
// includes one above it; inside backend/, the runtime (engine, cpu, cuda, model, transport,
// tiers, tokenizer, calibrate) includes no HTTP and nothing of the control plane (frontend,
// cluster, discovery), the control plane nothing of the HTTP edge (serve), and the replay client
// and discovery's etcd client no server code; of cli/, only the commands that run simulations
// include sim/. Also checks that the checker itself rejects such includes.
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
    {"eigen", {"Eigen/", "unsupported/Eigen/"}},
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
  // Duet directories it may include from: a top-level layer ("policies", "backend": all of
  // it), or a sub-layer of backend/ ("backend/engine"; "backend/": the files directly in it).
  std::set<std::string> layers;
  std::set<std::string> families;  // restricted libraries it may include
  bool pure = false;               // only the standard library and nlohmann/json.hpp
  // Restricted libraries its .cpp and .cu files may include, but not its headers: a library
  // kept private to the layer's implementation, which never reaches the layer's users.
  std::set<std::string> source_families = {};
};

std::set<std::string> Union(std::set<std::string> a, const std::set<std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

const std::set<std::string> kBelowBackend = {"common",   "models", "traces",
                                             "policies", "deploy", "kernels"};
// backend/'s sub-layers, each including only itself and those before it.
// The runtime: what executes steps and moves KV (no HTTP, no control plane).
const std::set<std::string> kRuntime =
    Union(kBelowBackend,
          {"backend/", "backend/engine", "backend/cpu", "backend/cuda", "backend/model",
           "backend/transport", "backend/tiers", "backend/tokenizer", "backend/calibrate"});
// The control plane: the live frontend and the worker processes with their link.
const std::set<std::string> kControlPlane =
    Union(kRuntime, {"backend/cluster", "backend/frontend", "backend/discovery"});
// The HTTP edge: the OpenAI API, the server, /metrics.
const std::set<std::string> kHttpEdge = Union(kControlPlane, {"backend/serve"});

// Keyed by directory relative to the source root; the longest matching key applies.
const std::map<std::string, Rule> kRules = {
    {"common", {{"common"}, {}, true}},
    {"traces", {{"common", "traces"}, {}, true}},
    // models: Eigen in its .cpp files only (the fits' least squares, models/step_fit.cpp).
    {"models", {{"common", "models"}, {}, true, {"eigen"}}},
    {"policies", {{"common", "models", "traces", "policies"}, {}, true}},
    // deploy: the deployment description both worlds read (cluster files' instances, roles,
    // engine settings).
    {"deploy", {{"common", "models", "traces", "policies", "deploy"}, {}, true}},
    {"sim", {{"common", "models", "traces", "policies", "deploy", "sim"}, {"simgrid"}, false}},
    // plan: the capacity search; runs simulations as processes, so no SimGrid of its own.
    {"plan", {{"common", "models", "traces", "policies", "deploy", "sim", "plan"}, {}, false}},
    {"kernels", {{"common", "kernels"}, {}, false}},
    {"kernels/cuda", {{"common", "kernels"}, {"cuda"}, false}},
    // backend/ and every sub-directory not named below: the runtime.
    {"backend", {kRuntime, {"cuda", "ucx", "nccl"}, false}},
    {"backend/cluster", {kControlPlane, {"cuda", "ucx", "nccl"}, false}},
    {"backend/frontend", {kControlPlane, {"cuda", "ucx", "nccl"}, false}},
    {"backend/serve", {kHttpEdge, {"cuda", "ucx", "nccl", "http"}, false}},
    // Discovery: an etcd client (HTTP) that depends on nothing else of Duet's.
    {"backend/discovery", {{"common", "backend/discovery"}, {"http"}, false}},
    // The replay client: an HTTP client that depends on no server code.
    {"backend/replay",
     {{"common", "models", "traces", "policies", "backend/replay"}, {"http"}, false}},
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

bool IsHeader(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext != ".cpp" && ext != ".cu";
}

bool Allowed(const Rule& rule, const std::string& target, bool angle, bool header) {
  const std::string family = FamilyOf(target);
  if (!family.empty())
    return rule.families.count(family) != 0 || (!header && rule.source_families.count(family) != 0);
  const auto slash = target.find('/');
  const std::string top = slash == std::string::npos ? "" : target.substr(0, slash);
  if (!angle || kRules.count(top)) {
    if (top.empty()) return false;
    if (rule.layers.count(top)) return true;
    if (top != "backend") return false;
    // A sub-layer of backend/: its directory, or "backend/" for a file directly in it.
    const auto second = target.find('/', slash + 1);
    return rule.layers.count(second == std::string::npos ? "backend/" : target.substr(0, second)) !=
           0;
  }
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
    if (std::regex_search(line, m, include_re) && !Allowed(rule, m[2], m[1] == "<", IsHeader(path)))
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
           "#include \"backend/frontend/frontend.h\"\n#include <prometheus/registry.h>\n";
  }
  EXPECT_EQ(Violations("policies", path).size(), 8u);
  EXPECT_EQ(Violations("models", path).size(), 9u);        // models may not include policies/
  EXPECT_EQ(Violations("policies/sub", path).size(), 8u);  // the rule covers subdirectories
  EXPECT_EQ(Violations("deploy", path).size(), 8u);        // as pure as policies/
  // sim: SimGrid and the layers below, but no GPU, network or HTTP library and not backend/.
  EXPECT_EQ(Violations("sim", path).size(), 6u);
  // backend's HTTP edge: everything but SimGrid and sim/.
  EXPECT_EQ(Violations("backend/serve", path).size(), 2u);
  // The runtime (and files directly in backend/): no HTTP, Prometheus or control plane.
  EXPECT_EQ(Violations("backend/engine", path).size(), 5u);
  EXPECT_EQ(Violations("backend/transport", path).size(), 5u);
  EXPECT_EQ(Violations("backend", path).size(), 5u);
  // The control plane: the runtime and itself, no HTTP.
  EXPECT_EQ(Violations("backend/cluster", path).size(), 4u);
  EXPECT_EQ(Violations("backend/frontend", path).size(), 4u);
  // The replay client: HTTP, but no server code, GPU or network library.
  EXPECT_EQ(Violations("backend/replay", path).size(), 6u);
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

// The mutation the runtime's rule is there for: Beast, or the HTTP edge, from the engine.
TEST(Layering, TheRuntimeRefusesHttpAndTheLayersAboveIt) {
  const auto path = fs::temp_directory_path() / "duet_layering_runtime_probe.cpp";
  {
    std::ofstream out(path);
    out << "#include \"backend/engine/forward_model.h\"\n#include \"backend/registry.h\"\n"
           "#include <boost/beast/core.hpp>\n#include \"backend/serve/api.h\"\n"
           "#include \"backend/cluster/wire.h\"\n#include \"backend/replay/client.h\"\n";
  }
  for (const char* runtime : {"backend", "backend/engine", "backend/cpu", "backend/cuda",
                              "backend/model", "backend/transport", "backend/tokenizer"}) {
    const auto bad = Violations(runtime, path);
    ASSERT_EQ(bad.size(), 4u) << runtime;
    EXPECT_NE(bad[0].find("boost/beast"), std::string::npos) << bad[0];
  }
  // The control plane takes the worker link, not the HTTP edge; the edge takes both.
  EXPECT_EQ(Violations("backend/frontend", path).size(), 3u);
  EXPECT_EQ(Violations("backend/serve", path).size(), 1u);  // the replay client
  fs::remove(path);
}

// The mutation models/'s Eigen rule is there for: Eigen in a models/ header, where every user of
// models/ (the simulator, policies, the engine) would include it. Its .cpp files may; no other
// layer may, in any file.
TEST(Layering, OnlyModelsSourcesIncludeEigen) {
  const auto dir = fs::temp_directory_path();
  const auto header = dir / "duet_layering_eigen_probe.h";
  const auto source = dir / "duet_layering_eigen_probe.cpp";
  for (const fs::path& path : {header, source}) {
    std::ofstream out(path);
    out << "#include <vector>\n#include \"models/cost_model.h\"\n#include <Eigen/Dense>\n"
           "#include <unsupported/Eigen/NonLinearOptimization>\n";
  }
  const auto bad = Violations("models", header);
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_NE(bad[0].find("Eigen/Dense"), std::string::npos) << bad[0];
  EXPECT_TRUE(Violations("models", source).empty());
  for (const char* other :
       {"common", "policies", "deploy", "sim", "backend", "backend/calibrate", "cli"}) {
    EXPECT_EQ(Violations(other, source).size(), 2u + (std::string(other) == "common")) << other;
  }
  fs::remove(header);
  fs::remove(source);
}

// The live commands learn the deployment from deploy/, never from the simulator's layer: only
// the commands that run simulations include sim/.
TEST(Layering, OnlyTheSimulatorsCommandsIncludeSim) {
  const std::set<std::string> simulating = {
      "simulate.cpp",       "sweep.cpp",          "plan.cpp",         "plan_flags.cpp",
      "validate.cpp",       "validate_steps.cpp", "validate_steps.h", "validate_schedule.cpp",
      "validate_schedule.h"};
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
