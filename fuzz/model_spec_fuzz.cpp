// Fuzz target for the one Hugging Face config.json parser (models::ParseModelSpec) and the GPU
// spec parser, and everything downstream of a parsed spec: bytes are parsed as JSON; an object
// is read as a model spec and a hardware spec (or from its "model" / "hardware" sub-objects).
// A spec that parses must satisfy the invariants the backend's weight loader and the memory
// plan rely on, survive a round trip through ModelSpecToJson, and give finite rotary
// frequencies; with a hardware spec, the memory plan and the roofline step cost run on small
// shapes. Any crash, sanitizer report or broken invariant is a bug.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "models/cost_model.h"
#include "models/model_spec.h"

namespace {

using duet::models::Dtype;
using duet::models::HardwareSpec;
using duet::models::ModelSpec;

// The sub-object `key` when present and an object, else the document itself, so one flat
// seed exercises both parsers and structured seeds keep them apart.
const nlohmann::json& Section(const nlohmann::json& doc, const char* key) {
  auto it = doc.find(key);
  return (it != doc.end() && it->is_object()) ? *it : doc;
}

// An integer option from the input, clamped to [lo, hi]; `fallback` when absent or mistyped.
std::int64_t Option(const nlohmann::json& doc, const char* key, std::int64_t lo, std::int64_t hi,
                    std::int64_t fallback) {
  auto it = doc.find(key);
  if (it == doc.end() || !it->is_number_integer()) return fallback;
  std::int64_t value = it->get<std::int64_t>();
  return value < lo ? lo : (value > hi ? hi : value);
}

void CheckSpec(const ModelSpec& c) {
  DUET_CHECK(c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0);
  DUET_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0);
  DUET_CHECK(c.head_dim > 0 && (c.mla || c.head_dim % 2 == 0));
  DUET_CHECK(c.vocab_size > 0 && c.max_position_embeddings > 0);
  DUET_CHECK(c.rms_norm_eps > 0 && c.rope_theta >= 1);
  DUET_CHECK(!c.name.empty());
  DUET_CHECK(c.ParamCount() > 0);
  DUET_CHECK(c.WeightBytes() >= c.ParamCount());
  DUET_CHECK(c.ActiveParamCount() > 0 && c.ActiveParamCount() <= c.ParamCount());
  DUET_CHECK(c.DenseLayers() >= 0 && c.DenseLayers() <= c.num_hidden_layers);
  if (c.moe) {
    DUET_CHECK(c.moe->experts_per_token >= 1 && c.moe->experts_per_token <= c.moe->experts);
  }
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16, Dtype::kF32}) {
    const std::int64_t width = c.mla ? c.mla->CachedWidth() : 2 * c.KvWidth();
    DUET_CHECK(c.KvBytesPerToken(dtype) ==
               c.num_hidden_layers * width * std::int64_t(DtypeBytes(dtype)));
  }
  DUET_CHECK(c.KvBytesPerToken() == c.KvBytesPerToken(c.AutoKvCacheDtype()));
  if (c.bos_token_id) DUET_CHECK(*c.bos_token_id >= 0 && *c.bos_token_id < c.vocab_size);
  for (std::int64_t id : c.eos_token_ids) DUET_CHECK(id >= 0 && id < c.vocab_size);

  // What is written back parses to the same spec.
  duet::Result<ModelSpec> again =
      duet::models::ParseModelSpec(duet::models::ModelSpecToJson(c), "fuzz/again/config.json");
  DUET_CHECK_MSG(again.ok(), again.ok() ? "" : again.error());
  DUET_CHECK(again->ParamCount() == c.ParamCount());
  DUET_CHECK(again->ActiveParamCount() == c.ActiveParamCount());
  DUET_CHECK(again->WeightBytes() == c.WeightBytes());
  DUET_CHECK(again->KvBytesPerToken() == c.KvBytesPerToken());
  DUET_CHECK(again->model_type == c.model_type && again->architecture == c.architecture);
  DUET_CHECK(again->rope_scaling.type == c.rope_scaling.type);
  DUET_CHECK(again->eos_token_ids == c.eos_token_ids);
  DUET_CHECK(again->bos_token_id == c.bos_token_id);
  DUET_CHECK(again->sliding_window == c.sliding_window);
  DUET_CHECK(again->torch_dtype == c.torch_dtype);
  DUET_CHECK(again->mtp_layers == c.mtp_layers);
  // The multi-token-prediction drafter is a model of those layers, sized as one.
  if (c.mtp_layers > 0) {
    const ModelSpec drafter = c.MtpDrafter();
    DUET_CHECK(drafter.num_hidden_layers == c.mtp_layers && drafter.DenseLayers() >= 0);
    DUET_CHECK(drafter.KvBytesPerToken() * c.num_hidden_layers ==
               c.KvBytesPerToken() * c.mtp_layers);
  }
  DUET_CHECK(duet::models::CheckExecutable(*again, "x").ok() ==
             duet::models::CheckExecutable(c, "x").ok());

  // Head dims beyond real models (a few hundred) only cost time here.
  if (c.head_dim <= 4096 && !c.mla &&
      c.rope_scaling.type != duet::models::RopeScalingType::kUnsupported) {
    const std::vector<float> inv = c.RopeInvFrequencies();
    DUET_CHECK(inv.size() == std::size_t(c.head_dim / 2));
    for (float f : inv) DUET_CHECK(std::isfinite(f) && f >= 0 && f <= 1);
  }
}

void CheckPlanAndCost(const ModelSpec& model, const HardwareSpec& hw, const nlohmann::json& doc) {
  duet::models::MemoryOptions memory;
  memory.tp = static_cast<int>(Option(doc, "tp", -2, 1 << 17, 1));
  memory.dp = static_cast<int>(Option(doc, "dp", -2, 1 << 17, 1));
  memory.block_tokens = Option(doc, "block_tokens", -1, 1 << 20, 16);
  memory.reserved_bytes_per_gpu = Option(doc, "reserved_bytes", INT64_MIN, INT64_MAX, 1 << 20);
  const std::int64_t kv_dtype = Option(doc, "kv_cache_dtype", -1, 2, -1);
  if (kv_dtype >= 0) memory.kv_cache_dtype = static_cast<Dtype>(kv_dtype);
  auto utilization = doc.find("gpu_memory_utilization");
  if (utilization != doc.end() && utilization->is_number()) {
    memory.gpu_memory_utilization = utilization->get<double>();
  }
  duet::Result<duet::models::InstanceMemory> plan =
      duet::models::PlanInstanceMemory(model, hw, memory);
  if (plan.ok()) {
    DUET_CHECK(plan->kv_bytes_per_gpu > 0);
    DUET_CHECK(plan->kv_blocks >= 1);
    DUET_CHECK(plan->kv_tokens >= plan->kv_blocks * memory.block_tokens);
    // Every weight is somewhere; every GPU holds its rank's tokens (MLA's whole, GQA's 1/tp).
    DUET_CHECK(double(plan->weight_bytes_per_gpu) * memory.tp * memory.dp >=
               double(model.WeightBytes()));
    DUET_CHECK(model.KvShards(memory.tp) >= 1 && model.KvShards(memory.tp) <= memory.tp);
    const std::int64_t per_gpu =
        model.KvBytesPerToken(memory.kv_cache_dtype) / model.KvShards(memory.tp);
    DUET_CHECK(plan->kv_tokens / memory.dp * per_gpu <= plan->kv_bytes_per_gpu);
  }

  duet::models::RooflineOptions options;
  options.tp = memory.tp >= 1 ? memory.tp : 1;
  options.dp = memory.dp >= 1 ? memory.dp : 1;
  options.kv_cache_dtype = memory.kv_cache_dtype;
  duet::models::RooflineCostModel cost(model, hw, options);
  duet::models::StepShape shape;
  shape.prefill = {{Option(doc, "prefill_tokens", 0, 1 << 20, 128), 64}, {16, 0}};
  shape.decode_tokens = Option(doc, "decode_tokens", 0, 1 << 12, 8);
  shape.decode_context_tokens = shape.decode_tokens * 4096;
  const duet::Seconds t = cost.StepTime(shape);
  DUET_CHECK(std::isfinite(t) && t > 0);
  duet::models::StepShape longer = shape;
  longer.decode_tokens += 1;
  longer.decode_context_tokens += 4096;
  DUET_CHECK(cost.StepTime(longer) >= t);
  DUET_CHECK(cost.StepTime(duet::models::StepShape{}) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nlohmann::json doc = nlohmann::json::parse(data, data + size, /*cb=*/nullptr,
                                             /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  duet::Result<ModelSpec> model =
      duet::models::ParseModelSpec(Section(doc, "model"), "fuzz/config.json");
  if (model.ok()) {
    CheckSpec(*model);
  } else {
    DUET_CHECK(model.error().rfind("fuzz/config.json", 0) == 0);  // every error names the file
  }
  if (!doc.is_object()) return 0;
  duet::Result<HardwareSpec> hw = duet::models::ParseHardwareSpec(Section(doc, "hardware"), "fuzz");
  if (!hw.ok()) DUET_CHECK(hw.error().rfind("fuzz", 0) == 0);
  if (model.ok() && hw.ok()) CheckPlanAndCost(*model, *hw, doc);
  return 0;
}
