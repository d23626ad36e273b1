// Cluster JSON parsing and validation (see cluster_spec.h).
#include "sim/cluster_spec.h"

#include <filesystem>

#include "common/json_util.h"

namespace duet::sim {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Bounds on the cluster file's numbers in their JSON units, like the hardware specs' (1e-6 to
// 1e6): outside them a simulated duration would be zero or hundreds of digits long.
using deploy::kMaxBandwidthGBps;
using deploy::kMaxLatencyUs;
using deploy::kMinBandwidthGBps;
constexpr double kMinEfficiency = 1e-3;  // of peak FLOP/s, HBM or NVLink bandwidth
constexpr double kMaxOverheadMs = 1e6;   // per step

// A link: {"bandwidth_GBps": B, "latency_us": L}. A node's "nvlink" (`cost_model` given) may
// instead name a transport that the fitted cost model's profile holds a link fit for
// ({"fitted": "ucx"}): `duet calibrate --transport` times KV transfers between two instances on
// one machine, so the fit describes the path between two of a node's devices, which crosses two
// NVLink hops; each hop gets the fitted bandwidth and half the fitted latency.
Result<LinkSpec> ParseLink(const json& parent, const std::string& key, const std::string& where,
                           bool required, LinkSpec fallback,
                           const CostModelSpec* cost_model = nullptr) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) {
    if (required) return FieldError(where, key, "is missing");
    return fallback;
  }
  const std::string here = where + "." + key;
  if (!it->is_object()) return Status::Error(here + ": must be an object");
  if (JsonHas(*it, "fitted")) {
    if (!cost_model)
      return FieldError(here, "fitted",
                        "only a node's nvlink may be fitted (duet calibrate times the path "
                        "between two devices of one machine)");
    if (JsonHas(*it, "bandwidth_GBps") || JsonHas(*it, "latency_us"))
      return FieldError(here, "fitted",
                        "excludes bandwidth_GBps and latency_us (the fit gives them)");
    auto name = JsonString(*it, "fitted", here);
    if (!name) return name.status();
    const models::StepProfile* profile = cost_model->profile.get();
    if (!profile)
      return FieldError(here, "fitted",
                        "needs cost_model kind 'fitted': its profile holds the links");
    const models::LinkFit* link = profile->LinkFor(*name);
    if (!link) {
      std::string have;
      for (const models::LinkFit& l : profile->links)
        have += (have.empty() ? "" : ", ") + l.transport;
      return FieldError(here, "fitted",
                        "profile " + cost_model->profile_path + " has no link for transport '" +
                            *name + "' (" +
                            (have.empty() ? "it has none: duet calibrate --transport times them"
                                          : "it has " + have) +
                            ")");
    }
    return LinkSpec{link->bandwidth, link->latency / 2};
  }
  auto bw = JsonNumberIn(*it, "bandwidth_GBps", kMinBandwidthGBps, kMaxBandwidthGBps, here);
  if (!bw) return bw.status();
  auto lat = JsonNumberIn(*it, "latency_us", 0, kMaxLatencyUs, here, 0.0);
  if (!lat) return lat.status();
  return LinkSpec{*bw * kGB, *lat * 1e-6};
}

// `fitted`: the profile the deployment read already, if it did.
Status ParseCostModel(const json& doc, const std::string& path, const std::string& data_dir,
                      const deploy::FittedProfile& fitted, CostModelSpec& spec) {
  auto it = doc.find("cost_model");
  if (it == doc.end() || it->is_null()) return Status::Ok();
  const std::string where = path + ": cost_model";
  if (!it->is_object()) return Status::Error(where + ": must be an object");
  auto kind = JsonStringOr(*it, "kind", "roofline", where);
  if (!kind) return kind.status();
  struct Field {
    const char* key;
    double* out;
    double scale;
  };
  models::RooflineOptions& r = spec.roofline;
  const Field fields[] = {{"compute_efficiency", &r.compute_efficiency, 1.0},
                          {"memory_efficiency", &r.memory_efficiency, 1.0},
                          {"comm_efficiency", &r.comm_efficiency, 1.0},
                          {"step_overhead_ms", &r.step_overhead, 1e-3},
                          {"allreduce_latency_us", &r.allreduce_latency, 1e-6}};
  if (*kind == "fitted") {
    for (const Field& f : fields) {
      if (JsonHas(*it, f.key))
        return FieldError(where, f.key, "applies to kind 'roofline' only (the profile fits it)");
    }
    if (auto profile = JsonString(*it, "profile", where); !profile) return profile.status();
    deploy::FittedProfile read = fitted;
    if (!read.profile) {
      auto loaded = deploy::LoadFittedProfile(doc, path, data_dir);
      if (!loaded) return loaded.status();
      read = std::move(*loaded);
    }
    spec.profile_path = std::move(read.path);
    spec.profile = std::move(read.profile);
    return Status::Ok();
  }
  if (*kind != "roofline")
    return FieldError(where, "kind", "must be 'roofline' or 'fitted', got '" + *kind + "'");
  if (JsonHas(*it, "profile")) return FieldError(where, "profile", "applies to kind 'fitted' only");
  for (const Field& f : fields) {
    const bool efficiency = f.scale == 1.0;
    auto v = efficiency
                 ? JsonNumberIn(*it, f.key, kMinEfficiency, 1, where, *f.out)
                 : JsonNumberIn(*it, f.key, 0, f.scale == 1e-3 ? kMaxOverheadMs : kMaxLatencyUs,
                                where, *f.out / f.scale);
    if (!v) return v.status();
    *f.out = *v * f.scale;
  }
  return Status::Ok();
}

// A fitted cost model prices the model it was measured on, at the TP degrees it was fitted for.
Status CheckProfileFits(const ClusterSpec& c, const std::string& path) {
  const models::StepProfile* profile = c.cost_model.profile.get();
  if (!profile) return Status::Ok();
  const std::string where = path + ": cost_model: profile " + c.cost_model.profile_path;
  if (auto mismatch = models::ArchitectureMismatch(profile->model, c.model))
    return Status::Error(where + " was measured on another model than '" + c.model.name + "' (" +
                         *mismatch + ")");
  if (c.speculative.enabled())
    return Status::Error(where +
                         " was measured without speculative decoding: its verify steps and "
                         "drafter are priced by the roofline only (\"cost_model\": {\"kind\": "
                         "\"roofline\"})");
  for (const deploy::InstanceSpec& inst : c.instances) {
    if (inst.dp > 1) {
      return Status::Error(where + " is fitted per TP degree; instance " + inst.name + " has dp " +
                           std::to_string(inst.dp) +
                           " (data-parallel attention is priced by the roofline only)");
    }
    if (profile->FitFor(inst.tp)) continue;
    std::string have;
    for (const models::StepFit& fit : profile->fits)
      have += (have.empty() ? "" : ", ") + std::to_string(fit.tp);
    return Status::Error(where + " has no fit for tp " + std::to_string(inst.tp) + " (instance " +
                         inst.name + "; it has tp " + have + ")");
  }
  return Status::Ok();
}

}  // namespace

int NodesSpanned(int tp, int gpus, int gpus_per_node) {
  if (gpus <= gpus_per_node) return 1;
  return gpus % gpus_per_node == 0 && tp <= gpus_per_node ? gpus / gpus_per_node : 0;
}

bool IsBundledName(const std::string& ref) {
  return ref.find('/') == std::string::npos && fs::path(ref).extension() != ".json";
}

void AbsolutizeClusterRefs(nlohmann::json& doc, const std::string& dir) {
  auto absolutize = [&](nlohmann::json& value) {
    if (!value.is_string()) return;
    const std::string ref = value.get<std::string>();
    if (IsBundledName(ref)) return;
    if (ref.empty() || fs::path(ref).is_absolute()) return;
    value = fs::absolute(fs::path(dir) / ref).lexically_normal().string();
  };
  if (!doc.is_object()) return;
  if (doc.contains("model")) absolutize(doc["model"]);
  if (auto nodes = doc.find("nodes"); nodes != doc.end() && nodes->is_array()) {
    for (auto& group : *nodes)
      if (group.is_object() && group.contains("gpu")) absolutize(group["gpu"]);
  }
  if (auto cm = doc.find("cost_model");
      cm != doc.end() && cm->is_object() && cm->contains("profile"))
    absolutize((*cm)["profile"]);
}

Result<ClusterSpec> LoadClusterSpec(const std::string& path, const std::string& data_dir) {
  auto doc = ReadJsonFile(path);
  if (!doc) return doc.status();
  return ParseClusterSpec(*doc, path, data_dir);
}

Result<ClusterSpec> ParseClusterSpec(const json& doc, const std::string& path,
                                     const std::string& data_dir) {
  auto deployment = deploy::ParseDeployment(doc, path, data_dir);
  if (!deployment) return deployment.status();
  ClusterSpec c;
  static_cast<deploy::Deployment&>(c) = std::move(*deployment);

  // Before the nodes: their nvlink may name a link the profile fitted.
  DUET_RETURN_IF_ERROR(ParseCostModel(doc, path, data_dir, c.fitted_profile, c.cost_model));

  // Nodes: a list of groups, each {"count": n, "gpus": g, "gpu": name, links...}.
  auto nodes_it = doc.find("nodes");
  if (nodes_it == doc.end() || nodes_it->is_null()) return FieldError(path, "nodes", "is missing");
  if (!nodes_it->is_array() || nodes_it->empty())
    return FieldError(path, "nodes", "must be a non-empty array");
  for (std::size_t g = 0; g < nodes_it->size(); ++g) {
    const json& group = (*nodes_it)[g];
    const std::string where = path + ": nodes[" + std::to_string(g) + "]";
    if (!group.is_object()) return Status::Error(where + ": must be an object");
    auto count = JsonIntOr(group, "count", 1, where);
    auto gpus = JsonInt(group, "gpus", where);
    auto gpu = JsonString(group, "gpu", where);
    if (!count) return count.status();
    if (!gpus) return gpus.status();
    if (!gpu) return gpu.status();
    if (*count < 1 || *count > 4096) return FieldError(where, "count", "must be in [1, 4096]");
    if (*gpus < 1 || *gpus > 64) return FieldError(where, "gpus", "must be in [1, 64]");
    auto hw = models::LoadHardwareSpec(
        ResolveRef(*gpu, path, (fs::path(data_dir) / "models" / "hardware").string()));
    if (!hw) return Status::Error(where + ": field 'gpu': " + hw.error());
    NodeSpec node;
    node.gpus = static_cast<int>(*gpus);
    node.gpu = *hw;
    auto nvlink = ParseLink(group, "nvlink", where, false, {hw->nvlink_bw, 1e-6}, &c.cost_model);
    auto pcie = ParseLink(group, "pcie", where, false, {hw->pcie_bw, 1e-6});
    auto nic = ParseLink(group, "nic", where, true, {});
    if (!nvlink) return nvlink.status();
    if (!pcie) return pcie.status();
    if (!nic) return nic.status();
    auto host_nic = ParseLink(group, "host_nic", where, false, *nic);
    if (!host_nic) return host_nic.status();
    node.nvlink = *nvlink;
    node.pcie = *pcie;
    node.nic = *nic;
    node.host_nic = *host_nic;
    for (std::int64_t i = 0; i < *count; ++i) {
      node.name = "node" + std::to_string(c.nodes.size());
      c.nodes.push_back(node);
    }
  }

  const std::string net_where = path + ": network";
  const json empty = json::object();
  const json& net = JsonHas(doc, "network") ? doc["network"] : empty;
  if (!net.is_object()) return Status::Error(net_where + ": must be an object");
  auto sw = ParseLink(net, "switch", net_where, c.nodes.size() > 1, {1e15, 0});
  auto fe = ParseLink(net, "frontend", net_where, false, {100 * kGB, 10e-6});
  if (!sw) return sw.status();
  if (!fe) return fe.status();
  c.switch_link = *sw;
  c.frontend_link = *fe;

  c.cost_model.roofline.kv_cache_dtype = c.engine.memory.kv_cache_dtype;
  // Placement: the node the file asks for, else the first node with tp * dp free GPUs; an
  // instance larger than a node takes the first run of wholly free nodes of its kind.
  std::vector<int> next_gpu(c.nodes.size(), 0);
  for (const deploy::InstanceSpec& inst : c.instances) {
    const std::string where = path + ": instances[" + std::to_string(inst.group) + "]";
    if (inst.node >= static_cast<std::int64_t>(c.nodes.size()) || inst.node < -1)
      return FieldError(where, "node",
                        "is " + std::to_string(inst.node) + " but there are " +
                            std::to_string(c.nodes.size()) + " nodes");
    auto fits = [&](std::size_t n) -> int {  // the nodes it would span from n, 0: it does not fit
      const NodeSpec& first = c.nodes[n];
      const int span = NodesSpanned(inst.tp, inst.Gpus(), first.gpus);
      if (span == 1) return first.gpus - next_gpu[n] >= inst.Gpus() ? 1 : 0;
      if (span == 0 || n + static_cast<std::size_t>(span) > c.nodes.size()) return 0;
      for (std::size_t k = n; k < n + static_cast<std::size_t>(span); ++k) {
        if (next_gpu[k] != 0 || c.nodes[k].gpus != first.gpus ||
            c.nodes[k].gpu.name != first.gpu.name)
          return 0;
      }
      return span;
    };
    int chosen = -1, span = 0;
    for (std::size_t n = 0; n < c.nodes.size() && chosen < 0; ++n) {
      if (inst.node >= 0 && static_cast<std::int64_t>(n) != inst.node) continue;
      if ((span = fits(n)) > 0) chosen = static_cast<int>(n);
    }
    if (chosen < 0)
      return Status::Error(where + ": not enough free GPUs for instance " +
                           std::to_string(inst.index) + " (tp=" + std::to_string(inst.tp) +
                           (inst.dp > 1 ? " dp=" + std::to_string(inst.dp) : "") + ")" +
                           (inst.node >= 0 ? " on node " + std::to_string(inst.node) : "") +
                           "; an instance larger than a node needs wholly free nodes of one "
                           "kind, a whole number of them, and tp at most a node's GPUs");
    if (span > 1 && c.tiers.any())
      return Status::Error(where + ": instance " + std::to_string(inst.index) + " spans " +
                           std::to_string(span) +
                           " nodes, and KV tiers serve instances within one node only");
    InstancePlacement placement;
    placement.node = chosen;
    placement.nodes = span;
    const int per_node = inst.Gpus() / span;
    for (int k = chosen; k < chosen + span; ++k) {
      for (int i = 0; i < per_node; ++i) placement.gpus.push_back({k, next_gpu[k]++});
    }
    models::MemoryOptions mem = c.engine.memory;
    mem.tp = inst.tp;
    mem.dp = inst.dp;
    auto plan =
        models::PlanInstanceMemory(c.model, c.nodes[chosen].gpu, mem,
                                   c.speculative.drafter ? &*c.speculative.drafter : nullptr);
    if (!plan) return Status::Error(where + ": " + plan.error());
    placement.memory = *plan;
    c.placements.push_back(std::move(placement));
  }
  DUET_RETURN_IF_ERROR(CheckProfileFits(c, path));
  return c;
}

std::vector<std::vector<policies::InstanceId>> NodeMates(
    const ClusterSpec& cluster, const std::vector<std::unique_ptr<models::StepCostModel>>& costs) {
  std::vector<std::vector<policies::InstanceId>> mates(cluster.instances.size());
  for (std::size_t i = 0; i < mates.size(); ++i) {
    for (std::size_t j = 0; j < mates.size(); ++j) {
      const InstancePlacement &a = cluster.placements[i], &b = cluster.placements[j];
      if (i != j && a.nodes == 1 && b.nodes == 1 && a.node == b.node &&
          (costs[i]->PricesBeside() || costs[j]->PricesBeside()))
        mates[i].push_back(static_cast<policies::InstanceId>(j));
    }
  }
  return mates;
}

std::unique_ptr<models::StepCostModel> MakeStepCostModel(const ClusterSpec& cluster,
                                                         std::size_t index) {
  const deploy::InstanceSpec& instance = cluster.instances[index];
  if (const models::StepProfile* profile = cluster.cost_model.profile.get()) {
    const models::StepFit* fit = profile->FitFor(instance.tp);
    DUET_CHECK(fit);  // CheckProfileFits
    return std::make_unique<models::FittedCostModel>(*fit, profile->host, profile->after_idle,
                                                     profile->after_step, profile->beside);
  }
  models::RooflineOptions roofline = cluster.cost_model.roofline;
  roofline.tp = instance.tp;
  roofline.dp = instance.dp;
  const InstancePlacement& at = cluster.placements[index];
  const NodeSpec& node = cluster.nodes[static_cast<std::size_t>(at.node)];
  roofline.nodes = at.nodes;
  roofline.nic_bw = node.nic.bandwidth;
  models::HardwareSpec gpu = node.gpu;
  gpu.nvlink_bw = node.nvlink.bandwidth;
  auto target = std::make_unique<models::RooflineCostModel>(cluster.model, gpu, roofline);
  const deploy::SpeculativeSpec& speculative = cluster.speculative;
  if (!speculative.enabled()) return target;
  // The drafter runs on the same GPUs, split the same way, within the target's step: the step's
  // fixed cost is paid once.
  roofline.step_overhead = 0;
  return std::make_unique<models::SpeculativeCostModel>(
      std::move(target),
      std::make_unique<models::RooflineCostModel>(speculative.drafter->model, gpu, roofline),
      speculative.config.tokens);
}

}  // namespace duet::sim
