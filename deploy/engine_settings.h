// The engine settings of a deployment ("engine" in a cluster file): one struct and one codec,
// written once as a table of fields. The cluster-file parser and the worker Welcome message
// both read them with ParseEngineSettings and write them with EngineSettingsToJson, so every
// setting travels to a worker process and the bounds are the same in both worlds.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "models/model_spec.h"
#include "policies/engine.h"
#include "policies/scheduler.h"

namespace duet::deploy {

// Bounds of the settings, in the units of the struct.
inline constexpr Tokens kMaxBlockTokens = Tokens{1} << 16;
inline constexpr Tokens kMaxBatchedTokens = Tokens{1} << 30;
inline constexpr std::int64_t kMaxNumSeqs = std::int64_t{1} << 20;
// A KV lease from a millisecond (tests) to a day.
inline constexpr Seconds kMinLeaseSeconds = 1e-3, kMaxLeaseSeconds = 86400;
inline constexpr double kMaxReservedGiB = 1e6;  // the largest HBM a hardware spec may have

struct EngineSettings {
  Tokens block_tokens = 16;
  policies::SchedulerConfig scheduler;  // token budget, batch cap, watermark, tier-load overlap
  // The simulator's memory plan: utilization, reserve and KV dtype ("auto": nullopt). tp is
  // per instance and block_tokens mirrors the field above.
  models::MemoryOptions memory;
  bool enable_prefix_caching = true;
  bool coalesce_decode_steps = true;
  // Plan step i+1 while step i runs (policies::EngineConfig::async_steps). Served live only.
  bool async_steps = false;
  // PD: how long a prefill instance holds a request's KV for the decode instance's pull (vLLM's
  // NIXL connector holds 480 s too), and what a failed pull leads to.
  Seconds kv_lease_s = 480;
  policies::KvLoadFailurePolicy kv_load_failure_policy = policies::KvLoadFailurePolicy::kFail;
};

// Every setting's key, in the order the codec writes them.
std::vector<std::string> EngineSettingKeys();

// Reads the settings an object gives over `base` (a missing or null key keeps base's value),
// checking every bound; an unknown key is an error naming it. `where` names the object for
// messages ("x.json: engine", "welcome: engine").
Result<EngineSettings> ParseEngineSettings(const nlohmann::json& object, const std::string& where,
                                           const EngineSettings& base = {});
// Every setting, as ParseEngineSettings reads it back.
nlohmann::json EngineSettingsToJson(const EngineSettings& settings);

// The engine loop's configuration of instance `id` in `role` under these settings; the
// model's and the instance's own fields (blocks, KV bytes, layers, tp) are the caller's.
policies::EngineConfig MakeEngineConfig(const EngineSettings& settings, policies::InstanceId id,
                                        policies::InstanceRole role);

}  // namespace duet::deploy
