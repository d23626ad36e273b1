// Cluster descriptions for `duet simulate`: the deployment (deploy/deployment.h: model,
// instances and roles, engine settings, router) and where it runs: nodes of GPUs with their
// NVLink, PCIe and NIC links, the switch between nodes, the instances' placement on them, KV
// tiers and the cost model. Parsed from JSON with errors that name the file and the field. No
// SimGrid here: sim/platform.cpp turns a spec into a platform.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "deploy/deployment.h"
#include "models/cost_model.h"
#include "models/model_spec.h"
#include "models/step_profile.h"
#include "policies/kv_tiers.h"

namespace duet::sim {

using deploy::LinkSpec;

struct NodeSpec {
  std::string name;  // node0, node1, ...
  int gpus = 0;
  models::HardwareSpec gpu;
  LinkSpec nvlink;    // each GPU to the node's NVSwitch
  LinkSpec pcie;      // each GPU to its PCIe switch (GPUDirect path to its NIC)
  LinkSpec nic;       // one NIC per GPU, to the cluster switch
  LinkSpec host_nic;  // the host's own NIC to the switch (DRAM/SSD <-> remote store traffic)
};

using deploy::TierSpec;
using deploy::TiersSpec;

// One GPU of the cluster.
struct GpuRef {
  int node = 0;
  int gpu = 0;
};

// Where an instance of the deployment runs: its tp * dp GPUs, first fit within one node, or,
// when they are more than a node holds, every GPU of `nodes` consecutive free nodes of the same
// kind (an expert-parallel instance across nodes; its TP groups stay within a node), node-major;
// and the memory plan on that node's GPU.
struct InstancePlacement {
  int node = 0;   // its (first) node, whose KV tiers it uses
  int nodes = 1;  // the nodes it spans
  std::vector<GpuRef> gpus;
  models::InstanceMemory memory;
};

// How steps are priced ("cost_model" in the cluster file): the roofline (default) or a fit
// from a step profile (`duet calibrate`), by name under sim/profiles/ or a path ending in .json.
struct CostModelSpec {
  models::RooflineOptions roofline;                    // kind "roofline"; tp is per instance
  std::string profile_path;                            // kind "fitted"
  std::shared_ptr<const models::StepProfile> profile;  // null: the roofline
};

// How many nodes of `gpus_per_node` GPUs an instance of `tp` x `dp` = `gpus` GPUs spans: 1
// within a node, gpus / gpus_per_node over whole nodes when it is larger (a whole number of
// them, its TP groups within one), 0 when it cannot be placed so.
int NodesSpanned(int tp, int gpus, int gpus_per_node);

// The deployment (deploy/deployment.h, tiers included) and where it runs: nodes, links, the
// cost model.
struct ClusterSpec : deploy::Deployment {
  std::vector<NodeSpec> nodes;
  LinkSpec switch_link;                       // shared by all inter-node traffic
  LinkSpec frontend_link;                     // frontend host to the switch
  std::vector<InstancePlacement> placements;  // one per instance, in order
  CostModelSpec cost_model;
};

using deploy::ResolveRef;

// Whether a model, GPU or profile reference names a bundled file (a bare name, as "h200") rather
// than a path: no '/' and no .json extension.
bool IsBundledName(const std::string& ref);

// A cluster document moved elsewhere (a candidate of `duet plan`, a patched setup of `duet
// sweep`): its file references (model, every node group's gpu, the cost model's profile) that
// are paths made absolute against `dir`, the directory of the file it came from; bundled names
// stay as they are.
void AbsolutizeClusterRefs(nlohmann::json& doc, const std::string& dir);

// The step-cost model of one instance: the roofline on its node's GPU (TP all-reduces over the
// node's NVLink as the file gives it; with speculative decoding, the drafter's too), or the
// profile's fit for its TP degree.
std::unique_ptr<models::StepCostModel> MakeStepCostModel(const ClusterSpec& cluster,
                                                         std::size_t instance);

// Per instance, the other instances on its node (each on that node alone), whose steps share its
// machine with its steps where the cost model of either prices a step beside another's
// (models::StepCostModel::Beside: a CPU profile calibrated --beside); empty otherwise. `costs`:
// MakeStepCostModel's, per instance.
std::vector<std::vector<policies::InstanceId>> NodeMates(
    const ClusterSpec& cluster, const std::vector<std::unique_ptr<models::StepCostModel>>& costs);

// Loads a cluster file. "model" and "gpu" name files under <data_dir>/models/specs and
// <data_dir>/models/hardware (or give a path ending in .json, relative to the cluster file);
// "model" may also be a Hugging Face model directory (a path with a '/').
// Errors: missing or mistyped fields, non-positive bandwidths, negative latencies, unknown
// roles, instances that cannot be placed (InstancePlacement's rule; one across nodes beside KV
// tiers), mixed colocated and PD roles, a model that does not fit in GPU memory, and a step
// profile measured on another model or lacking a fit for an instance's TP degree.
Result<ClusterSpec> LoadClusterSpec(const std::string& path, const std::string& data_dir);
Result<ClusterSpec> ParseClusterSpec(const nlohmann::json& doc, const std::string& path,
                                     const std::string& data_dir);

}  // namespace duet::sim
