// Fuzz target for the models/ parsers and everything downstream of a parsed spec: bytes are
// parsed as JSON; an object is read as both a model spec and a hardware spec (or from its
// "model" / "hardware" sub-objects), and when both parse, the memory plan and the roofline
// step cost run on small shapes. Any crash, sanitizer report or broken invariant is a bug.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/status.h"
#include "models/cost_model.h"
#include "models/model_spec.h"

namespace {

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

void CheckPlanAndCost(const ModelSpec& model, const HardwareSpec& hw, const nlohmann::json& doc) {
  duet::models::MemoryOptions memory;
  memory.tp = static_cast<int>(Option(doc, "tp", -2, 1 << 17, 1));
  memory.block_tokens = Option(doc, "block_tokens", -1, 1 << 20, 16);
  memory.reserved_bytes_per_gpu = Option(doc, "reserved_bytes", INT64_MIN, INT64_MAX, 1 << 20);
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
    DUET_CHECK(plan->weight_bytes_per_gpu * memory.tp >= model.WeightBytes());
  }

  duet::models::RooflineOptions options;
  options.tp = memory.tp >= 1 ? memory.tp : 1;
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
  if (doc.is_discarded() || !doc.is_object()) return 0;
  duet::Result<ModelSpec> model = duet::models::ParseModelSpec(Section(doc, "model"), "fuzz");
  duet::Result<HardwareSpec> hw = duet::models::ParseHardwareSpec(Section(doc, "hardware"), "fuzz");
  if (model.ok()) {
    DUET_CHECK(model->ParamCount() > 0);
    DUET_CHECK(model->WeightBytes() >= model->ParamCount());
    DUET_CHECK(model->KvBytesPerToken() > 0);
  } else {
    DUET_CHECK(model.error().rfind("fuzz", 0) == 0);  // every error names its source
  }
  if (!hw.ok()) DUET_CHECK(hw.error().rfind("fuzz", 0) == 0);
  if (model.ok() && hw.ok()) CheckPlanAndCost(*model, *hw, doc);
  return 0;
}
