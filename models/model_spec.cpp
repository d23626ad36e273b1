// Model and hardware spec parsing (Hugging Face config.json terms for models) and the sizes
// that follow from a model spec: parameter count, weight bytes, KV bytes per token.
// Parsers bound every dimension so that all int64 size arithmetic here and in the memory plan
// stays far from overflow, whatever the input file says.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "common/json_util.h"
#include "models/model_spec.h"

namespace duet::models {
namespace {

// Upper bounds on model dimensions. Real models are far below them (the largest dense models
// have hidden sizes near 2^14 and vocabularies near 2^18), and with them the largest product
// ParamCount forms (layers * 3 * hidden * intermediate) is ~3.3e16, well inside int64.
constexpr std::int64_t kMaxLayers = 10000;
constexpr std::int64_t kMaxWidth = std::int64_t(1) << 20;  // hidden, intermediate, heads*head_dim
constexpr std::int64_t kMaxHeads = std::int64_t(1) << 16;
constexpr std::int64_t kMaxVocab = std::int64_t(1) << 24;

// Bounds on hardware numbers in their JSON units (TFLOP/s, GiB, GB/s). The lower bound keeps
// step times finite (a denormal bandwidth would make every time infinite).
constexpr double kMinHardwareValue = 1e-6;
constexpr double kMaxHardwareValue = 1e6;

Status FieldError(const std::string& where, const std::string& key, const std::string& what) {
  return Status::Error(where + ": field '" + key + "' " + what);
}

// Reads an integer field in [1, max]; `fallback` < 0 means the field is required.
Result<int> BoundedInt(const nlohmann::json& doc, const std::string& key, std::int64_t max,
                       const std::string& where, std::int64_t fallback = -1) {
  Result<std::int64_t> value =
      fallback < 0 ? JsonInt(doc, key, where) : JsonIntOr(doc, key, fallback, where);
  if (!value.ok()) return value.status();
  // A JSON integer above INT64_MAX comes back wrapped to a negative value; either way the
  // range check below rejects it.
  if (*value < 1 || *value > max) {
    return FieldError(where, key,
                      "must be an integer between 1 and " + std::to_string(max) + " (got " +
                          doc.at(key).dump() + ")");
  }
  return static_cast<int>(*value);
}

// Reads a number field in [kMinHardwareValue, kMaxHardwareValue].
Result<double> HardwareNumber(const nlohmann::json& doc, const std::string& key,
                              const std::string& where) {
  Result<double> value = JsonNumber(doc, key, where);
  if (!value.ok()) return value.status();
  if (!std::isfinite(*value) || *value <= 0) {
    return FieldError(where, key, "must be > 0 (got " + doc.at(key).dump() + ")");
  }
  if (*value < kMinHardwareValue || *value > kMaxHardwareValue) {
    char range[96];
    std::snprintf(range, sizeof(range), "must be between %g and %g (got ", kMinHardwareValue,
                  kMaxHardwareValue);
    return FieldError(where, key, range + doc.at(key).dump() + ")");
  }
  return *value;
}

// The file stem of `where` ("models/specs/llama-3.1-8b.json" -> "llama-3.1-8b"), the default
// name when a spec has no "name" field.
std::string StemOf(const std::string& where) {
  std::string stem = std::filesystem::path(where).stem().string();
  return stem.empty() ? where : stem;
}

Result<std::string> NameField(const nlohmann::json& doc, const std::string& where) {
  Result<std::string> name = JsonStringOr(doc, "name", StemOf(where), where);
  if (!name.ok()) return name.status();
  if (name->empty()) return FieldError(where, "name", "must not be empty");
  return name;
}

}  // namespace

Bytes ModelSpec::BytesPerElement() const {
  if (torch_dtype == "bfloat16" || torch_dtype == "float16") return 2;
  if (torch_dtype == "float32") return 4;
  DUET_CHECK_MSG(false, "ModelSpec '" + name + "' has unknown torch_dtype '" + torch_dtype + "'");
  return 0;
}

std::int64_t ModelSpec::ParamCount() const {
  const std::int64_t hidden = hidden_size;
  const std::int64_t q_width = std::int64_t(num_attention_heads) * head_dim;
  const std::int64_t kv_width = std::int64_t(num_key_value_heads) * head_dim;
  const std::int64_t intermediate = intermediate_size;
  const std::int64_t attention = hidden * q_width         // q_proj
                                 + 2 * hidden * kv_width  // k_proj, v_proj
                                 + q_width * hidden;      // o_proj
  const std::int64_t mlp = 3 * hidden * intermediate;     // gate_proj, up_proj, down_proj
  const std::int64_t norms = 2 * hidden;                  // input and post-attention RMSNorm
  const std::int64_t per_layer = attention + mlp + norms;
  const std::int64_t embeddings = std::int64_t(vocab_size) * hidden;
  const std::int64_t lm_head = tie_word_embeddings ? 0 : embeddings;
  return embeddings + lm_head + std::int64_t(num_hidden_layers) * per_layer + hidden;
}

Bytes ModelSpec::WeightBytes() const { return ParamCount() * BytesPerElement(); }

Bytes ModelSpec::KvBytesPerToken() const {
  return 2 * std::int64_t(num_hidden_layers) * num_key_value_heads * head_dim * BytesPerElement();
}

Result<ModelSpec> ParseModelSpec(const nlohmann::json& doc, const std::string& where) {
  if (!doc.is_object()) return Status::Error(where + ": top level must be a JSON object");
  ModelSpec spec;

  Result<std::string> name = NameField(doc, where);
  if (!name.ok()) return name.status();
  spec.name = *name;

  Result<int> layers = BoundedInt(doc, "num_hidden_layers", kMaxLayers, where);
  if (!layers.ok()) return layers.status();
  Result<int> hidden = BoundedInt(doc, "hidden_size", kMaxWidth, where);
  if (!hidden.ok()) return hidden.status();
  Result<int> heads = BoundedInt(doc, "num_attention_heads", kMaxHeads, where);
  if (!heads.ok()) return heads.status();
  Result<int> kv_heads = BoundedInt(doc, "num_key_value_heads", kMaxHeads, where, *heads);
  if (!kv_heads.ok()) return kv_heads.status();
  Result<int> intermediate = BoundedInt(doc, "intermediate_size", kMaxWidth, where);
  if (!intermediate.ok()) return intermediate.status();
  Result<int> vocab = BoundedInt(doc, "vocab_size", kMaxVocab, where);
  if (!vocab.ok()) return vocab.status();

  if (*heads % *kv_heads != 0) {
    return FieldError(where, "num_attention_heads",
                      "(" + std::to_string(*heads) +
                          ") must be a multiple of num_key_value_heads (" +
                          std::to_string(*kv_heads) + ")");
  }

  int head_dim = 0;
  if (doc.contains("head_dim")) {
    Result<int> value = BoundedInt(doc, "head_dim", kMaxWidth, where);
    if (!value.ok()) return value.status();
    head_dim = *value;
  } else {
    // Hugging Face's default; an uneven split would silently drop columns, so refuse it.
    if (*hidden % *heads != 0) {
      return FieldError(where, "head_dim",
                        "is missing and hidden_size (" + std::to_string(*hidden) +
                            ") is not a multiple of num_attention_heads (" +
                            std::to_string(*heads) + ")");
    }
    head_dim = *hidden / *heads;
  }
  if (std::int64_t(*heads) * head_dim > kMaxWidth) {
    return FieldError(where, "head_dim",
                      "times num_attention_heads (" + std::to_string(*heads) + " * " +
                          std::to_string(head_dim) + ") must be at most " +
                          std::to_string(kMaxWidth));
  }

  Result<std::string> dtype = JsonStringOr(doc, "torch_dtype", "bfloat16", where);
  if (!dtype.ok()) return dtype.status();
  if (*dtype != "bfloat16" && *dtype != "float16" && *dtype != "float32") {
    return FieldError(where, "torch_dtype",
                      "is '" + *dtype + "'; accepted: bfloat16, float16, float32");
  }

  Result<bool> tied = JsonBoolOr(doc, "tie_word_embeddings", false, where);
  if (!tied.ok()) return tied.status();

  spec.num_hidden_layers = *layers;
  spec.hidden_size = *hidden;
  spec.num_attention_heads = *heads;
  spec.num_key_value_heads = *kv_heads;
  spec.head_dim = head_dim;
  spec.intermediate_size = *intermediate;
  spec.vocab_size = *vocab;
  spec.torch_dtype = *dtype;
  spec.tie_word_embeddings = *tied;
  return spec;
}

Result<ModelSpec> LoadModelSpec(const std::string& path) {
  Result<nlohmann::json> doc = ReadJsonFile(path);
  if (!doc.ok()) return doc.status();
  return ParseModelSpec(*doc, path);
}

Result<HardwareSpec> ParseHardwareSpec(const nlohmann::json& doc, const std::string& where) {
  if (!doc.is_object()) return Status::Error(where + ": top level must be a JSON object");
  HardwareSpec hw;

  Result<std::string> name = NameField(doc, where);
  if (!name.ok()) return name.status();
  hw.name = *name;

  Result<double> tflops = HardwareNumber(doc, "bf16_tflops", where);
  if (!tflops.ok()) return tflops.status();
  Result<double> hbm_gib = HardwareNumber(doc, "hbm_gib", where);
  if (!hbm_gib.ok()) return hbm_gib.status();
  Result<double> hbm_gbps = HardwareNumber(doc, "hbm_bandwidth_gbps", where);
  if (!hbm_gbps.ok()) return hbm_gbps.status();
  Result<double> nvlink_gbps = HardwareNumber(doc, "nvlink_bandwidth_gbps", where);
  if (!nvlink_gbps.ok()) return nvlink_gbps.status();
  Result<double> pcie_gbps = HardwareNumber(doc, "pcie_bandwidth_gbps", where);
  if (!pcie_gbps.ok()) return pcie_gbps.status();

  hw.bf16_flops = *tflops * 1e12;
  hw.hbm_bytes = static_cast<Bytes>(std::llround(*hbm_gib * kGiB));
  hw.hbm_bw = *hbm_gbps * kGB;
  hw.nvlink_bw = *nvlink_gbps * kGB;
  hw.pcie_bw = *pcie_gbps * kGB;
  return hw;
}

Result<HardwareSpec> LoadHardwareSpec(const std::string& path) {
  Result<nlohmann::json> doc = ReadJsonFile(path);
  if (!doc.ok()) return doc.status();
  return ParseHardwareSpec(*doc, path);
}

}  // namespace duet::models
