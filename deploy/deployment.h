// The deployment description that the simulator and the live server both read from a cluster
// file: the model, the serving instances and their roles, the engine settings and the router.
// Where instances run (nodes, GPUs, links, cost models) is the simulator's part
// of the same file (sim/cluster_spec.h builds on this one); `duet serve --cluster` reads only
// this part, with the same parser, so a file the simulator accepts is served with the same
// settings, and a file it refuses is refused with the same message.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "deploy/engine_settings.h"
#include "deploy/tiers.h"
#include "models/model_spec.h"
#include "models/step_profile.h"
#include "policies/engine.h"
#include "policies/router.h"

namespace duet::deploy {

// Instances in all: a node group holds at most 4096 nodes of 64 GPUs.
inline constexpr std::int64_t kMaxInstances = std::int64_t{1} << 18;

struct InstanceSpec {
  std::string name;  // p0.. (prefill), d0.. (decode), c0.. (colocated)
  policies::InstanceRole role = policies::InstanceRole::kColocated;
  int tp = 1;
  // Attention data-parallel ranks, each of tp GPUs (models/model_spec.h's MemoryOptions): the
  // instance runs on tp * dp GPUs, its routed experts spread over all of them.
  int dp = 1;
  int Gpus() const { return tp * dp; }
  // The node the file asks for (-1: the first with tp * dp free GPUs); the simulator checks it.
  std::int64_t node = -1;
  std::size_t group = 0;   // its entry of "instances", for messages
  std::int64_t index = 0;  // its place within that entry
};

// "speculative": speculative decoding. "method" "mtp" (the model's own multi-token-prediction
// layers, DeepSeek-V3's) or "draft" (a "draft_model", named as "model" is); k
// "num_speculative_tokens" (1..16) drafts per decode row and step; "acceptance_rate" (each
// draft accepted with that probability when those before it were) or "acceptance_rates" (one
// per position), each in [0, 1]. The simulator draws each step's accepted drafts from them
// (policies/speculative.h) and prices verify steps and the drafter's passes with the roofline.
struct SpeculativeSpec {
  policies::SpeculativeConfig config;      // tokens 0: off
  std::optional<models::Drafter> drafter;  // when on
  bool enabled() const { return config.enabled(); }
};

// The profile a file's fitted cost model names ({"cost_model": {"kind": "fitted", "profile":
// REF}}): REF resolved (ResolveRef; bundled names under <data_dir>/sim/profiles) and read.
// Both empty when the file names none (sim/cluster_spec.cpp says what is wrong with its
// cost_model). Errors read "<file>: cost_model: field 'profile': ...".
struct FittedProfile {
  std::string path;
  std::shared_ptr<const models::StepProfile> profile;
};

struct Deployment {
  std::string name;
  std::string path;
  models::ModelSpec model;
  std::vector<InstanceSpec> instances;
  EngineSettings engine;
  // "router": the routing policy this deployment runs (what `duet plan` chose); a --router flag
  // overrides it. nullopt: the command's default.
  std::optional<policies::RouterKind> router;
  TiersSpec tiers;  // KV tiers below GPU memory (deploy/tiers.h)
  // Read only when a tier takes its numbers from it (the simulator's cost model reuses it).
  FittedProfile fitted_profile;
  SpeculativeSpec speculative;

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

Result<FittedProfile> LoadFittedProfile(const nlohmann::json& doc, const std::string& path,
                                        const std::string& data_dir);

// "prefill", "decode" or "colocated" (policies::ToString's names).
Result<policies::InstanceRole> ParseInstanceRole(const std::string& name);

// Reads the deployment part of a cluster file ("name", "router", "model", "engine",
// "instances", "tiers"): "model" names a file under <data_dir>/models/specs, a path ending in .json
// relative to the cluster file, or a Hugging Face model directory. Errors name the file and the
// field: missing or mistyped fields, settings out of bounds, unknown roles, colocated mixed
// with prefill/decode, PD without both.
Result<Deployment> ParseDeployment(const nlohmann::json& doc, const std::string& path,
                                   const std::string& data_dir);
Result<Deployment> LoadDeployment(const std::string& path, const std::string& data_dir);

}  // namespace duet::deploy
