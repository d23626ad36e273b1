// Cluster descriptions for `duet simulate`: nodes of GPUs with their NVLink, PCIe and NIC
// links, the switch between nodes, the serving instances placed on them (colocated, or PD
// prefill/decode), engine limits and the cost model. Parsed from JSON with errors that name
// the file and the field. No SimGrid here: sim/platform.cpp turns a spec into a platform.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "models/cost_model.h"
#include "models/model_spec.h"
#include "models/step_profile.h"
#include "policies/engine.h"
#include "policies/kv_tiers.h"
#include "policies/router.h"

namespace duet::sim {

struct LinkSpec {
  BytesPerSecond bandwidth = 0;  // per direction
  Seconds latency = 0;
};

struct NodeSpec {
  std::string name;  // node0, node1, ...
  int gpus = 0;
  models::HardwareSpec gpu;
  LinkSpec nvlink;    // each GPU to the node's NVSwitch
  LinkSpec pcie;      // each GPU to its PCIe switch (GPUDirect path to its NIC)
  LinkSpec nic;       // one NIC per GPU, to the cluster switch
  LinkSpec host_nic;  // the host's own NIC to the switch (DRAM/SSD <-> remote store traffic)
};

// One KV tier below GPU memory (`tiers` in the cluster file). DRAM and SSD are per node.
struct TierSpec {
  bool enabled = false;
  Bytes capacity_bytes = 0;  // per node; the whole store for the remote tier
  policies::TierPlacement placement = policies::TierPlacement::kWriteThrough;
  policies::EvictionPolicy eviction = policies::EvictionPolicy::kLru;
  LinkSpec link;                // dram: host memory bandwidth; remote: the store's link
  BytesPerSecond read_bw = 0;   // ssd: the node's disk read bandwidth
  BytesPerSecond write_bw = 0;  // ssd: the node's disk write bandwidth
  bool prefetch = true;         // dram: promote queued requests' prefixes from SSD/remote
};

struct TiersSpec {
  TierSpec dram, ssd, remote;
  bool any() const { return dram.enabled || ssd.enabled || remote.enabled; }
  const TierSpec& operator[](policies::TierKind kind) const {
    return kind == policies::TierKind::kDram  ? dram
           : kind == policies::TierKind::kSsd ? ssd
                                              : remote;
  }
};

struct InstanceSpec {
  std::string name;  // p0.. (prefill), d0.. (decode), c0.. (colocated)
  policies::InstanceRole role = policies::InstanceRole::kColocated;
  int tp = 1;
  int node = 0;
  std::vector<int> gpus;  // GPU indices on the node, tp of them
  models::InstanceMemory memory;
};

struct EngineSpec {
  Tokens block_tokens = 16;
  policies::SchedulerConfig scheduler;
  models::MemoryOptions memory;  // tp is per instance; kv_cache_dtype ("auto": nullopt)
  bool enable_prefix_caching = true;
  bool coalesce_decode_steps = true;
  // PD: how long a prefill instance holds a request's KV for the decode instance's pull (vLLM's
  // NIXL connector holds 480 s too), and what a failed pull leads to.
  Seconds kv_lease_s = 480;
  policies::KvLoadFailurePolicy kv_load_failure_policy = policies::KvLoadFailurePolicy::kFail;
};

// How steps are priced ("cost_model" in the cluster file): the roofline (default) or a fit
// from a step profile (`duet calibrate`), by name under sim/profiles/ or a path ending in .json.
struct CostModelSpec {
  models::RooflineOptions roofline;                    // kind "roofline"; tp is per instance
  std::string profile_path;                            // kind "fitted"
  std::shared_ptr<const models::StepProfile> profile;  // null: the roofline
};

struct ClusterSpec {
  std::string name;
  std::string path;
  models::ModelSpec model;
  std::vector<NodeSpec> nodes;
  LinkSpec switch_link;    // shared by all inter-node traffic
  LinkSpec frontend_link;  // frontend host to the switch
  std::vector<InstanceSpec> instances;
  EngineSpec engine;
  TiersSpec tiers;
  CostModelSpec cost_model;
  // "router": the routing policy this deployment runs (what `duet plan` chose); a --router flag
  // overrides it. nullopt: the command's default.
  std::optional<policies::RouterKind> router;

  bool pd() const;
  int CountRole(policies::InstanceRole role) const;
  // KV bytes one token occupies in engine.kv_cache_dtype: what the simulator moves and stores.
  Bytes KvBytesPerToken() const { return model.KvBytesPerToken(engine.memory.kv_cache_dtype); }
};

// Resolves a model, hardware or profile reference: a bare name is looked up in the bundled
// directory (<bundled_dir>/<name>.json), a path ending in .json is taken relative to the file
// that names it (`referrer`; "" or a file in the current directory: relative to it); so is,
// with `directories`, any reference with a '/' (a Hugging Face model directory, whose
// config.json LoadModelSpec reads).
std::string ResolveRef(const std::string& ref, const std::string& referrer,
                       const std::string& bundled_dir, bool directories = false);

// A cluster document moved elsewhere (a candidate of `duet plan`, a patched setup of `duet
// sweep`): its file references (model, every node group's gpu, the cost model's profile) that
// are paths made absolute against `dir`, the directory of the file it came from; bundled names
// stay as they are.
void AbsolutizeClusterRefs(nlohmann::json& doc, const std::string& dir);

// The step-cost model of one instance: the roofline on its node's GPU (TP all-reduces over the
// node's NVLink as the file gives it), or the profile's fit for its TP degree.
std::unique_ptr<models::StepCostModel> MakeStepCostModel(const ClusterSpec& cluster,
                                                         const InstanceSpec& instance);

// Loads a cluster file. "model" and "gpu" name files under <data_dir>/models/specs and
// <data_dir>/models/hardware (or give a path ending in .json, relative to the cluster file);
// "model" may also be a Hugging Face model directory (a path with a '/').
// Errors: missing or mistyped fields, non-positive bandwidths, negative latencies, unknown
// roles, instances that do not fit on their node, mixed colocated and PD roles, a model that
// does not fit in GPU memory, and a step profile measured on another model or lacking a fit
// for an instance's TP degree.
Result<ClusterSpec> LoadClusterSpec(const std::string& path, const std::string& data_dir);
Result<ClusterSpec> ParseClusterSpec(const nlohmann::json& doc, const std::string& path,
                                     const std::string& data_dir);

}  // namespace duet::sim
