// Parsing of Hugging Face config.json for Llama-family models, their parameter count, and the
// rotary inverse frequencies (default, linear and Llama 3 scaling as in transformers'
// modeling_rope_utils). Every dimension is bounded so that all int64 size arithmetic that
// follows from a config (parameter counts, tensor byte sizes) stays far from overflow.
#include "backend/model/model_config.h"

#include <cmath>
#include <numbers>
#include <string>

#include "common/json_util.h"

namespace duet::backend {
namespace {

using nlohmann::json;

// Bounds far above real models (hidden sizes near 2^14, vocabularies near 2^18): with them the
// largest product formed (layers * 3 * hidden * intermediate) is below 2^55.
constexpr std::int64_t kMaxLayers = 4096;
constexpr std::int64_t kMaxWidth = std::int64_t(1) << 20;  // hidden, intermediate, q/kv widths
constexpr std::int64_t kMaxHeads = std::int64_t(1) << 14;
constexpr std::int64_t kMaxVocab = std::int64_t(1) << 24;
constexpr std::int64_t kMaxPositions = std::int64_t(1) << 40;

struct Architecture {
  const char* class_name;
  const char* model_type;
  std::int64_t default_max_positions;  // the transformers config class's default
};
constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", 2048},
    {"Qwen2ForCausalLM", "qwen2", 32768},
    {"MistralForCausalLM", "mistral", 4096 * 32},
};

std::string SupportedList() {
  std::string list;
  for (const Architecture& arch : kArchitectures) {
    if (!list.empty()) list += ", ";
    list += std::string(arch.class_name) + " (" + arch.model_type + ")";
  }
  return list;
}

Status FieldError(const std::string& where, const std::string& key, const std::string& what) {
  return Status::Error(where + ": field '" + key + "' " + what);
}

// Present and not null: config.json writers emit null for unset optional fields.
bool Has(const json& doc, const std::string& key) {
  auto it = doc.find(key);
  return it != doc.end() && !it->is_null();
}

// An integer field in [lo, hi]; `fallback` when absent or null (nullopt: required).
Result<std::int64_t> BoundedInt(const json& doc, const std::string& key, std::int64_t lo,
                                std::int64_t hi, const std::string& where,
                                std::optional<std::int64_t> fallback = std::nullopt) {
  if (!Has(doc, key)) {
    if (fallback) return *fallback;
    return FieldError(where, key, "is missing");
  }
  const json& value = doc.at(key);
  if (!value.is_number_integer()) {
    return FieldError(where, key, "must be an integer (got " + DescribeJson(value) + ")");
  }
  // Unsigned values above INT64_MAX would wrap; compare them as unsigned first.
  if (value.is_number_unsigned() && value.get<std::uint64_t>() > std::uint64_t(hi)) {
    return FieldError(where, key,
                      "must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                          " (got " + DescribeJson(value) + ")");
  }
  const std::int64_t v = value.get<std::int64_t>();
  if (v < lo || v > hi) {
    return FieldError(where, key,
                      "must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                          " (got " + DescribeJson(value) + ")");
  }
  return v;
}

// A finite number field > 0 (and <= max); `fallback` when absent or null.
Result<double> PositiveNumber(const json& doc, const std::string& key, const std::string& where,
                              std::optional<double> fallback, double max = 1e300) {
  if (!Has(doc, key)) {
    if (fallback) return *fallback;
    return FieldError(where, key, "is missing");
  }
  const json& value = doc.at(key);
  if (!value.is_number()) return FieldError(where, key, "must be a number");
  const double v = value.get<double>();
  if (!std::isfinite(v) || v <= 0 || v > max) {
    return FieldError(
        where, key,
        "must be a number in (0, " + json(max).dump() + "] (got " + DescribeJson(value) + ")");
  }
  return v;
}

Result<bool> Bool(const json& doc, const std::string& key, bool fallback,
                  const std::string& where) {
  if (!Has(doc, key)) return fallback;
  if (!doc.at(key).is_boolean()) return FieldError(where, key, "must be true or false");
  return doc.at(key).get<bool>();
}

// Decides the architecture from "architectures" and "model_type"; an unsupported one is named.
Result<const Architecture*> FindArchitecture(const json& doc, const std::string& where) {
  const Architecture* by_class = nullptr;
  std::string class_name;
  if (Has(doc, "architectures")) {
    const json& list = doc.at("architectures");
    if (!list.is_array() || list.empty() || !list[0].is_string()) {
      return FieldError(where, "architectures", "must be a non-empty list of class names");
    }
    class_name = list[0].get<std::string>();
    for (const Architecture& arch : kArchitectures) {
      if (class_name == arch.class_name) by_class = &arch;
    }
  }
  const Architecture* by_type = nullptr;
  std::string model_type;
  if (Has(doc, "model_type")) {
    if (!doc.at("model_type").is_string()) {
      return FieldError(where, "model_type", "must be a string");
    }
    model_type = doc.at("model_type").get<std::string>();
    for (const Architecture& arch : kArchitectures) {
      if (model_type == arch.model_type) by_type = &arch;
    }
  }
  if (class_name.empty() && model_type.empty()) {
    return FieldError(where, "model_type",
                      "is missing (and so is 'architectures'); supported: " + SupportedList());
  }
  if ((!class_name.empty() && by_class == nullptr) || (!model_type.empty() && by_type == nullptr)) {
    std::string named = class_name.empty() ? "" : class_name;
    if (!model_type.empty()) {
      named += named.empty() ? "model_type " + model_type : " (model_type " + model_type + ")";
    }
    return Status::Error(where + ": unsupported architecture " + named +
                         "; supported: " + SupportedList());
  }
  if (by_class != nullptr && by_type != nullptr && by_class != by_type) {
    return FieldError(where, "model_type",
                      "'" + model_type + "' contradicts architectures[0] '" + class_name + "'");
  }
  return by_class != nullptr ? by_class : by_type;
}

Result<RopeScaling> ParseRopeScaling(const json& doc, const std::string& where) {
  RopeScaling scaling;
  if (!Has(doc, "rope_scaling")) return scaling;
  const json& rs = doc.at("rope_scaling");
  const std::string at = where + ": rope_scaling";
  if (!rs.is_object()) return FieldError(where, "rope_scaling", "must be an object or null");
  // transformers reads "rope_type" and falls back to the older "type".
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (Has(rs, key)) {
      if (!rs.at(key).is_string()) return FieldError(at, key, "must be a string");
      type = rs.at(key).get<std::string>();
      break;
    }
  }
  if (type.empty()) return FieldError(at, "rope_type", "is missing");
  if (type == "default") return scaling;
  if (type != "linear" && type != "llama3") {
    return Status::Error(where + ": unsupported rope_scaling type '" + type +
                         "' (supported: default, linear, llama3)");
  }
  Result<double> factor = PositiveNumber(rs, "factor", at, std::nullopt, 1e6);
  if (!factor.ok()) return factor.status();
  scaling.factor = *factor;
  if (type == "linear") {
    scaling.type = RopeScalingType::kLinear;
    return scaling;
  }
  scaling.type = RopeScalingType::kLlama3;
  Result<double> low = PositiveNumber(rs, "low_freq_factor", at, std::nullopt, 1e6);
  if (!low.ok()) return low.status();
  Result<double> high = PositiveNumber(rs, "high_freq_factor", at, std::nullopt, 1e6);
  if (!high.ok()) return high.status();
  if (!(*low < *high)) {
    // The smooth band divides by (high - low).
    return FieldError(at, "low_freq_factor",
                      "must be below high_freq_factor (got " + json(*low).dump() + " and " +
                          json(*high).dump() + ")");
  }
  Result<std::int64_t> original =
      BoundedInt(rs, "original_max_position_embeddings", 1, kMaxPositions, at);
  if (!original.ok()) return original.status();
  scaling.low_freq_factor = *low;
  scaling.high_freq_factor = *high;
  scaling.original_max_position_embeddings = *original;
  return scaling;
}

Status ParseTokenIds(const json& doc, int vocab_size, const std::string& where,
                     ModelConfig& config) {
  auto check_id = [&](const json& value, const std::string& key) -> Result<std::int64_t> {
    if (!value.is_number_integer()) {
      return FieldError(where, key,
                        "must be an integer token id (got " + DescribeJson(value) + ")");
    }
    const bool in_range =
        value.is_number_unsigned()
            ? value.get<std::uint64_t>() < std::uint64_t(vocab_size)
            : value.get<std::int64_t>() >= 0 && value.get<std::int64_t>() < vocab_size;
    if (!in_range) {
      return FieldError(where, key,
                        "must be a token id in [0, vocab_size=" + std::to_string(vocab_size) +
                            ") (got " + DescribeJson(value) + ")");
    }
    const std::int64_t id = value.get<std::int64_t>();
    return id;
  };
  if (Has(doc, "bos_token_id")) {
    Result<std::int64_t> bos = check_id(doc.at("bos_token_id"), "bos_token_id");
    if (!bos.ok()) return bos.status();
    config.bos_token_id = *bos;
  }
  if (Has(doc, "eos_token_id")) {
    const json& eos = doc.at("eos_token_id");
    if (eos.is_array()) {
      for (const json& item : eos) {
        Result<std::int64_t> id = check_id(item, "eos_token_id");
        if (!id.ok()) return id.status();
        config.eos_token_ids.push_back(*id);
      }
    } else {
      Result<std::int64_t> id = check_id(eos, "eos_token_id");
      if (!id.ok()) return id.status();
      config.eos_token_ids.push_back(*id);
    }
  }
  return Status::Ok();
}

// Rejects config switches that change the computation in ways Duet does not implement.
Status CheckUnsupportedSwitches(const json& doc, const std::string& where) {
  if (Has(doc, "hidden_act")) {
    const json& act = doc.at("hidden_act");
    if (!act.is_string() || act.get<std::string>() != "silu") {
      return FieldError(where, "hidden_act", "must be \"silu\" (got " + DescribeJson(act) + ")");
    }
  }
  Result<bool> mlp_bias = Bool(doc, "mlp_bias", false, where);
  if (!mlp_bias.ok()) return mlp_bias.status();
  if (*mlp_bias) return FieldError(where, "mlp_bias", "true is not supported");
  if (Has(doc, "partial_rotary_factor")) {
    const json& prf = doc.at("partial_rotary_factor");
    if (!prf.is_number() || prf.get<double>() != 1.0) {
      return FieldError(
          where, "partial_rotary_factor",
          "must be 1 (partial rotary embeddings are not supported; got " + DescribeJson(prf) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

std::int64_t ModelConfig::ParamCount() const {
  const std::int64_t hidden = hidden_size;
  const std::int64_t attention = hidden * QWidth() + 2 * hidden * KvWidth() + QWidth() * hidden +
                                 (attention_qkv_bias ? QWidth() + 2 * KvWidth() : 0) +
                                 (attention_o_bias ? hidden : 0);
  const std::int64_t mlp = 3 * hidden * intermediate_size;
  const std::int64_t per_layer = attention + mlp + 2 * hidden;  // + two RMSNorm weights
  const std::int64_t embeddings = std::int64_t(vocab_size) * hidden;
  return embeddings + (tie_word_embeddings ? 0 : embeddings) + num_hidden_layers * per_layer +
         hidden;
}

std::vector<float> ModelConfig::RopeInvFrequencies() const {
  const int pairs = head_dim / 2;
  std::vector<float> result(pairs);
  const double low_freq_wavelen =
      double(rope_scaling.original_max_position_embeddings) / rope_scaling.low_freq_factor;
  const double high_freq_wavelen =
      double(rope_scaling.original_max_position_embeddings) / rope_scaling.high_freq_factor;
  for (int i = 0; i < pairs; ++i) {
    // _compute_default_rope_parameters: 1 / base^(arange(0, dim, 2) / dim).
    const double inv_freq = 1.0 / std::pow(rope_theta, double(2 * i) / double(head_dim));
    double scaled = inv_freq;
    if (rope_scaling.type == RopeScalingType::kLinear) {
      scaled = inv_freq / rope_scaling.factor;
    } else if (rope_scaling.type == RopeScalingType::kLlama3) {
      // _compute_llama3_parameters: short wavelengths (high frequencies) stay, long ones are
      // divided by factor, and the band between is interpolated by the context ratio.
      const double wavelen = 2.0 * std::numbers::pi / inv_freq;
      if (wavelen < high_freq_wavelen) {
        scaled = inv_freq;
      } else if (wavelen > low_freq_wavelen) {
        scaled = inv_freq / rope_scaling.factor;
      } else {
        const double smooth = (double(rope_scaling.original_max_position_embeddings) / wavelen -
                               rope_scaling.low_freq_factor) /
                              (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
        scaled = (1.0 - smooth) * inv_freq / rope_scaling.factor + smooth * inv_freq;
      }
    }
    result[i] = static_cast<float>(scaled);
  }
  return result;
}

Result<ModelConfig> ParseModelConfig(const json& doc, const std::string& where) {
  if (!doc.is_object()) return Status::Error(where + ": top level must be a JSON object");
  ModelConfig config;
  Result<const Architecture*> arch = FindArchitecture(doc, where);
  if (!arch.ok()) return arch.status();
  config.model_type = (*arch)->model_type;
  config.architecture = (*arch)->class_name;
  DUET_RETURN_IF_ERROR(CheckUnsupportedSwitches(doc, where));

  Result<std::int64_t> hidden = BoundedInt(doc, "hidden_size", 1, kMaxWidth, where);
  if (!hidden.ok()) return hidden.status();
  Result<std::int64_t> intermediate = BoundedInt(doc, "intermediate_size", 1, kMaxWidth, where);
  if (!intermediate.ok()) return intermediate.status();
  Result<std::int64_t> layers = BoundedInt(doc, "num_hidden_layers", 1, kMaxLayers, where);
  if (!layers.ok()) return layers.status();
  Result<std::int64_t> heads = BoundedInt(doc, "num_attention_heads", 1, kMaxHeads, where);
  if (!heads.ok()) return heads.status();
  Result<std::int64_t> kv_heads =
      BoundedInt(doc, "num_key_value_heads", 1, kMaxHeads, where, *heads);
  if (!kv_heads.ok()) return kv_heads.status();
  if (*heads % *kv_heads != 0) {
    return FieldError(where, "num_key_value_heads",
                      "(" + std::to_string(*kv_heads) + ") must divide num_attention_heads (" +
                          std::to_string(*heads) + ")");
  }
  std::int64_t head_dim = 0;
  if (Has(doc, "head_dim")) {
    Result<std::int64_t> value = BoundedInt(doc, "head_dim", 1, kMaxWidth, where);
    if (!value.ok()) return value.status();
    head_dim = *value;
  } else {
    if (*hidden % *heads != 0) {
      return FieldError(where, "head_dim",
                        "is missing and hidden_size (" + std::to_string(*hidden) +
                            ") is not a multiple of num_attention_heads (" +
                            std::to_string(*heads) + ")");
    }
    head_dim = *hidden / *heads;
  }
  if (head_dim % 2 != 0) {
    return FieldError(where, "head_dim",
                      "must be even for rotary embeddings (got " + std::to_string(head_dim) + ")");
  }
  if (*heads * head_dim > kMaxWidth) {
    return FieldError(where, "head_dim",
                      "times num_attention_heads must be at most " + std::to_string(kMaxWidth) +
                          " (got " + std::to_string(*heads) + " * " + std::to_string(head_dim) +
                          ")");
  }
  Result<std::int64_t> vocab = BoundedInt(doc, "vocab_size", 1, kMaxVocab, where);
  if (!vocab.ok()) return vocab.status();
  Result<double> eps = PositiveNumber(doc, "rms_norm_eps", where, 1e-6, 1.0);
  if (!eps.ok()) return eps.status();
  Result<double> theta = PositiveNumber(doc, "rope_theta", where, 10000.0);
  if (!theta.ok()) return theta.status();
  if (*theta < 1.0) {
    // Below 1 the "frequencies" would grow with the pair index past 1 rad/token (and
    // overflow float for tiny values); no model does this.
    return FieldError(where, "rope_theta", "must be at least 1 (got " + json(*theta).dump() + ")");
  }
  Result<RopeScaling> scaling = ParseRopeScaling(doc, where);
  if (!scaling.ok()) return scaling.status();
  Result<std::int64_t> max_positions = BoundedInt(doc, "max_position_embeddings", 1, kMaxPositions,
                                                  where, (*arch)->default_max_positions);
  if (!max_positions.ok()) return max_positions.status();
  Result<bool> tied = Bool(doc, "tie_word_embeddings", false, where);
  if (!tied.ok()) return tied.status();

  // Newer transformers write "dtype" instead of "torch_dtype".
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!Has(doc, key)) continue;
    const json& dtype = doc.at(key);
    if (!dtype.is_string() || (dtype != "bfloat16" && dtype != "float16" && dtype != "float32")) {
      return FieldError(
          where, key,
          "must be \"bfloat16\", \"float16\" or \"float32\" (got " + DescribeJson(dtype) + ")");
    }
    config.torch_dtype = dtype.get<std::string>();
    break;
  }

  if (config.model_type == "qwen2") {
    config.attention_qkv_bias = true;  // hard-wired in Qwen2Attention
    Result<bool> use_window = Bool(doc, "use_sliding_window", false, where);
    if (!use_window.ok()) return use_window.status();
    if (*use_window) {
      Result<std::int64_t> window =
          BoundedInt(doc, "sliding_window", 1, kMaxPositions, where, std::nullopt);
      if (!window.ok()) return window.status();
      config.sliding_window = *window;
    }
  } else if (config.model_type == "llama") {
    Result<bool> bias = Bool(doc, "attention_bias", false, where);
    if (!bias.ok()) return bias.status();
    config.attention_qkv_bias = *bias;
    config.attention_o_bias = *bias;
  } else {  // mistral
    if (Has(doc, "sliding_window")) {
      Result<std::int64_t> window = BoundedInt(doc, "sliding_window", 1, kMaxPositions, where);
      if (!window.ok()) return window.status();
      config.sliding_window = *window;
    }
  }

  config.hidden_size = int(*hidden);
  config.intermediate_size = int(*intermediate);
  config.num_hidden_layers = int(*layers);
  config.num_attention_heads = int(*heads);
  config.num_key_value_heads = int(*kv_heads);
  config.head_dim = int(head_dim);
  config.vocab_size = int(*vocab);
  config.rms_norm_eps = *eps;
  config.rope_theta = *theta;
  config.rope_scaling = *scaling;
  config.max_position_embeddings = *max_positions;
  config.tie_word_embeddings = *tied;
  DUET_RETURN_IF_ERROR(ParseTokenIds(doc, config.vocab_size, where, config));
  return config;
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  Result<json> doc = ReadJsonFile(path);
  if (!doc.ok()) return doc.status();
  return ParseModelConfig(*doc, path);
}

json ModelConfigToJson(const ModelConfig& config) {
  json doc = json::object();
  std::string class_name = config.architecture;
  if (class_name.empty()) {
    for (const Architecture& arch : kArchitectures) {
      if (config.model_type == arch.model_type) class_name = arch.class_name;
    }
  }
  doc["architectures"] = json::array({class_name});
  doc["model_type"] = config.model_type;
  doc["hidden_act"] = "silu";
  doc["hidden_size"] = config.hidden_size;
  doc["intermediate_size"] = config.intermediate_size;
  doc["num_hidden_layers"] = config.num_hidden_layers;
  doc["num_attention_heads"] = config.num_attention_heads;
  doc["num_key_value_heads"] = config.num_key_value_heads;
  doc["head_dim"] = config.head_dim;
  doc["vocab_size"] = config.vocab_size;
  doc["rms_norm_eps"] = config.rms_norm_eps;
  doc["rope_theta"] = config.rope_theta;
  switch (config.rope_scaling.type) {
    case RopeScalingType::kNone:
      doc["rope_scaling"] = nullptr;
      break;
    case RopeScalingType::kLinear:
      doc["rope_scaling"] = {{"rope_type", "linear"}, {"factor", config.rope_scaling.factor}};
      break;
    case RopeScalingType::kLlama3:
      doc["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", config.rope_scaling.factor},
                             {"low_freq_factor", config.rope_scaling.low_freq_factor},
                             {"high_freq_factor", config.rope_scaling.high_freq_factor},
                             {"original_max_position_embeddings",
                              config.rope_scaling.original_max_position_embeddings}};
      break;
  }
  doc["max_position_embeddings"] = config.max_position_embeddings;
  doc["tie_word_embeddings"] = config.tie_word_embeddings;
  if (!config.torch_dtype.empty()) doc["torch_dtype"] = config.torch_dtype;
  if (config.model_type == "llama") {
    doc["attention_bias"] = config.attention_qkv_bias;
    doc["mlp_bias"] = false;
  }
  if (config.sliding_window) {
    doc["sliding_window"] = *config.sliding_window;
    if (config.model_type == "qwen2") doc["use_sliding_window"] = true;
  } else if (config.model_type == "mistral") {
    doc["sliding_window"] = nullptr;
  }
  if (config.bos_token_id) doc["bos_token_id"] = *config.bos_token_id;
  if (config.eos_token_ids.size() == 1) {
    doc["eos_token_id"] = config.eos_token_ids[0];
  } else if (!config.eos_token_ids.empty()) {
    doc["eos_token_id"] = config.eos_token_ids;
  }
  return doc;
}

}  // namespace duet::backend
