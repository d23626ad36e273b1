// One valid value for every engine setting other than its default, with a check that it reached
// the struct's own member (not only the JSON that the codec writes back): the engine-settings
// codec's tests and the worker Welcome's round trip walk it, and a test fails when a setting has
// no sample here.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/units.h"
#include "deploy/engine_settings.h"

namespace duet::deploy::testing {

struct SettingSample {
  std::string key;
  nlohmann::json value;
  std::function<bool(const EngineSettings&)> arrived;
};

inline std::vector<SettingSample> SettingSamples() {
  using S = const EngineSettings&;
  return {
      {"block_tokens", 32, [](S s) { return s.block_tokens == 32 && s.memory.block_tokens == 32; }},
      {"max_num_batched_tokens", Tokens{1} << 30,
       [](S s) { return s.scheduler.max_num_batched_tokens == Tokens{1} << 30; }},
      {"max_num_seqs", 7, [](S s) { return s.scheduler.max_num_seqs == 7; }},
      {"watermark", 0.6, [](S s) { return s.scheduler.watermark == 0.6; }},
      {"overlap_tier_loads", false, [](S s) { return !s.scheduler.overlap_tier_loads; }},
      {"gpu_memory_utilization", 0.5, [](S s) { return s.memory.gpu_memory_utilization == 0.5; }},
      {"reserved_gib", 0.25, [](S s) { return s.memory.reserved_bytes_per_gpu == kGiB / 4; }},
      {"kv_cache_dtype", "float16",
       [](S s) { return s.memory.kv_cache_dtype == models::Dtype::kF16; }},
      {"enable_prefix_caching", false, [](S s) { return !s.enable_prefix_caching; }},
      {"coalesce_decode_steps", false, [](S s) { return !s.coalesce_decode_steps; }},
      {"async_steps", true, [](S s) { return s.async_steps; }},
      {"kv_lease_s", 30.5, [](S s) { return s.kv_lease_s == 30.5; }},
      {"kv_load_failure_policy", "recompute",
       [](S s) { return s.kv_load_failure_policy == policies::KvLoadFailurePolicy::kRecompute; }},
  };
}

}  // namespace duet::deploy::testing
