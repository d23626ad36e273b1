// The engine settings' codec (see engine_settings.h): one table of fields, each with its key,
// its reader (bounds included) and its writer.
#include "deploy/engine_settings.h"

#include "common/json_util.h"
#include "models/dtype.h"

namespace duet::deploy {
namespace {

using nlohmann::json;

// Sets `out` to the value read, or returns the error reading it.
template <typename T, typename Out>
Status Assign(const Result<T>& value, Out& out) {
  if (!value) return value.status();
  out = static_cast<Out>(*value);
  return Status::Ok();
}

struct Field {
  const char* key;
  // Reads the field from `j` (present and non-null) into `s`.
  Status (*read)(const json& j, const std::string& where, EngineSettings& s);
  void (*write)(const EngineSettings& s, json& j);
};

const Field kFields[] = {
    {"block_tokens",
     [](const json& j, const std::string& where, EngineSettings& s) {
       auto v = JsonIntIn(j, "block_tokens", 1, kMaxBlockTokens, where);
       if (!v) return v.status();
       s.block_tokens = *v;
       s.memory.block_tokens = *v;
       return Status::Ok();
     },
     [](const EngineSettings& s, json& j) { j["block_tokens"] = s.block_tokens; }},
    {"max_num_batched_tokens",
     [](const json& j, const std::string& where, EngineSettings& s) {
       return Assign(JsonIntIn(j, "max_num_batched_tokens", 1, kMaxBatchedTokens, where),
                     s.scheduler.max_num_batched_tokens);
     },
     [](const EngineSettings& s, json& j) {
       j["max_num_batched_tokens"] = s.scheduler.max_num_batched_tokens;
     }},
    {"max_num_seqs",
     [](const json& j, const std::string& where, EngineSettings& s) {
       return Assign(JsonIntIn(j, "max_num_seqs", 1, kMaxNumSeqs, where), s.scheduler.max_num_seqs);
     },
     [](const EngineSettings& s, json& j) { j["max_num_seqs"] = s.scheduler.max_num_seqs; }},
    {"watermark",
     [](const json& j, const std::string& where, EngineSettings& s) {
       auto v = JsonNumber(j, "watermark", where);
       if (!v) return v.status();
       if (!(*v >= 0 && *v < 1)) return FieldError(where, "watermark", "must be in [0, 1)");
       s.scheduler.watermark = *v;
       return Status::Ok();
     },
     [](const EngineSettings& s, json& j) { j["watermark"] = s.scheduler.watermark; }},
    {"overlap_tier_loads",
     [](const json& j, const std::string& where, EngineSettings& s) {
       return Assign(JsonBoolOr(j, "overlap_tier_loads", true, where),
                     s.scheduler.overlap_tier_loads);
     },
     [](const EngineSettings& s, json& j) {
       j["overlap_tier_loads"] = s.scheduler.overlap_tier_loads;
     }},
    {"gpu_memory_utilization",
     [](const json& j, const std::string& where, EngineSettings& s) {
       auto v = JsonNumber(j, "gpu_memory_utilization", where);
       if (!v) return v.status();
       if (!(*v > 0 && *v <= 1))
         return FieldError(where, "gpu_memory_utilization", "must be in (0, 1]");
       s.memory.gpu_memory_utilization = *v;
       return Status::Ok();
     },
     [](const EngineSettings& s, json& j) {
       j["gpu_memory_utilization"] = s.memory.gpu_memory_utilization;
     }},
    {"reserved_gib",
     [](const json& j, const std::string& where, EngineSettings& s) {
       auto v = JsonNumberIn(j, "reserved_gib", 0, kMaxReservedGiB, where);
       if (!v) return v.status();
       s.memory.reserved_bytes_per_gpu = static_cast<Bytes>(*v * kGiB);
       return Status::Ok();
     },
     [](const EngineSettings& s, json& j) {
       j["reserved_gib"] = static_cast<double>(s.memory.reserved_bytes_per_gpu) / kGiB;
     }},
    {"kv_cache_dtype",
     [](const json& j, const std::string& where, EngineSettings& s) {
       auto v = JsonString(j, "kv_cache_dtype", where);
       if (!v) return v.status();
       if (*v == "auto") {
         s.memory.kv_cache_dtype.reset();
         return Status::Ok();
       }
       const auto dtype = models::DtypeFromTorchName(*v);
       if (!dtype)
         return FieldError(where, "kv_cache_dtype",
                           "must be auto, bfloat16, float16 or float32, got '" + *v + "'");
       s.memory.kv_cache_dtype = *dtype;
       return Status::Ok();
     },
     [](const EngineSettings& s, json& j) {
       j["kv_cache_dtype"] =
           s.memory.kv_cache_dtype ? models::TorchDtypeName(*s.memory.kv_cache_dtype) : "auto";
     }},
    {"enable_prefix_caching",
     [](const json& j, const std::string& where, EngineSettings& s) {
       return Assign(JsonBoolOr(j, "enable_prefix_caching", true, where), s.enable_prefix_caching);
     },
     [](const EngineSettings& s, json& j) {
       j["enable_prefix_caching"] = s.enable_prefix_caching;
     }},
    {"coalesce_decode_steps",
     [](const json& j, const std::string& where, EngineSettings& s) {
       return Assign(JsonBoolOr(j, "coalesce_decode_steps", true, where), s.coalesce_decode_steps);
     },
     [](const EngineSettings& s, json& j) {
       j["coalesce_decode_steps"] = s.coalesce_decode_steps;
     }},
    {"async_steps",
     [](const json& j, const std::string& where, EngineSettings& s) {
       return Assign(JsonBoolOr(j, "async_steps", false, where), s.async_steps);
     },
     [](const EngineSettings& s, json& j) { j["async_steps"] = s.async_steps; }},
    {"kv_lease_s",
     [](const json& j, const std::string& where, EngineSettings& s) {
       return Assign(JsonNumberIn(j, "kv_lease_s", kMinLeaseSeconds, kMaxLeaseSeconds, where),
                     s.kv_lease_s);
     },
     [](const EngineSettings& s, json& j) { j["kv_lease_s"] = s.kv_lease_s; }},
    {"kv_load_failure_policy",
     [](const json& j, const std::string& where, EngineSettings& s) {
       auto v = JsonString(j, "kv_load_failure_policy", where);
       if (!v) return v.status();
       auto policy = policies::ParseKvLoadFailurePolicy(*v);
       if (!policy)
         return FieldError(where, "kv_load_failure_policy",
                           "must be fail or recompute, got '" + *v + "'");
       s.kv_load_failure_policy = *policy;
       return Status::Ok();
     },
     [](const EngineSettings& s, json& j) {
       j["kv_load_failure_policy"] = policies::ToString(s.kv_load_failure_policy);
     }},
};

}  // namespace

std::vector<std::string> EngineSettingKeys() {
  std::vector<std::string> keys;
  for (const Field& f : kFields) keys.emplace_back(f.key);
  return keys;
}

Result<EngineSettings> ParseEngineSettings(const json& object, const std::string& where,
                                           const EngineSettings& base) {
  if (!object.is_object()) return Status::Error(where + ": must be an object");
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (const Field& f : kFields) known = known || key == f.key;
    if (!known) {
      std::string keys;
      for (const Field& f : kFields) keys += std::string(keys.empty() ? "" : ", ") + f.key;
      return Status::Error(where + ": unknown setting " + DescribeJson(json(key)) +
                           " (known: " + keys + ")");
    }
  }
  EngineSettings s = base;
  for (const Field& f : kFields) {
    if (!JsonHas(object, f.key)) continue;
    DUET_RETURN_IF_ERROR(f.read(object, where, s));
  }
  return s;
}

json EngineSettingsToJson(const EngineSettings& settings) {
  json j = json::object();
  for (const Field& f : kFields) f.write(settings, j);
  return j;
}

policies::EngineConfig MakeEngineConfig(const EngineSettings& settings, policies::InstanceId id,
                                        policies::InstanceRole role) {
  policies::EngineConfig c;
  c.id = id;
  c.role = role;
  c.block_tokens = settings.block_tokens;
  c.enable_prefix_caching = settings.enable_prefix_caching;
  c.coalesce_decode_steps = settings.coalesce_decode_steps;
  c.async_steps = settings.async_steps;
  c.scheduler = settings.scheduler;
  c.kv_lease_s = settings.kv_lease_s;
  c.kv_load_failure_policy = settings.kv_load_failure_policy;
  return c;
}

}  // namespace duet::deploy
