// Parsing of Hugging Face config.json into the one ModelSpec (and of GPU specs), the sizes that
// follow from a spec (parameters, weight and KV bytes), the rotary inverse frequencies
// (default, linear and Llama 3 scaling as in transformers' modeling_rope_utils), and the
// backend's check of what it can execute. Every dimension is bounded so that all int64 size
// arithmetic here, in the memory plan and in the backend stays far from overflow.
#include "models/model_spec.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numbers>
#include <string>

#include "common/json_util.h"

namespace duet::models {
namespace {

using nlohmann::json;

// Upper bounds on model dimensions, the stricter of the two parsers this one replaced. Real
// models are far below them (hidden sizes near 2^14, vocabularies near 2^18, heads near 2^7,
// layers near 2^7); with them the largest product formed (layers * 3 * hidden * intermediate)
// is below 2^54, and weight bytes in fp32 below 2^57.
constexpr std::int64_t kMaxLayers = 4096;
constexpr std::int64_t kMaxWidth = std::int64_t(1) << 20;  // hidden, intermediate, q/kv widths
constexpr std::int64_t kMaxHeads = std::int64_t(1) << 14;
constexpr std::int64_t kMaxVocab = std::int64_t(1) << 24;
constexpr std::int64_t kMaxPositions = std::int64_t(1) << 40;
constexpr double kMaxFactor = 1e6;  // rope scaling factors

// Bounds on hardware numbers in their JSON units (TFLOP/s, GiB, GB/s). The lower bound keeps
// step times finite (a denormal bandwidth would make every time infinite).
constexpr double kMinHardwareValue = 1e-6;
constexpr double kMaxHardwareValue = 1e6;

// The decoder families whose config.json conventions (biases, defaults, experts, attention)
// the parser knows; the backend executes those marked so.
enum class Experts { kNone, kMixtral, kQwen3Moe, kDeepSeek };
struct Family {
  const char* class_name;
  const char* model_type;
  std::int64_t default_max_positions;  // the transformers config class's default
  bool executable;                     // by the backend's Llama forward pass
  Experts experts = Experts::kNone;    // how its config names a mixture of experts
  bool mla = false;                    // multi-head latent attention
  bool qk_norm = false;                // RMSNorm on each query and key head
};
constexpr Family kFamilies[] = {
    {"LlamaForCausalLM", "llama", 2048, true},
    {"Qwen2ForCausalLM", "qwen2", 32768, true},
    {"MistralForCausalLM", "mistral", 4096 * 32, true},
    {"Qwen3ForCausalLM", "qwen3", 32768, false, Experts::kNone, false, true},
    {"MixtralForCausalLM", "mixtral", 4096 * 32, false, Experts::kMixtral},
    {"Qwen3MoeForCausalLM", "qwen3_moe", 32768, false, Experts::kQwen3Moe, false, true},
    {"DeepseekV2ForCausalLM", "deepseek_v2", 2048, false, Experts::kDeepSeek, true},
    {"DeepseekV3ForCausalLM", "deepseek_v3", 4096, false, Experts::kDeepSeek, true},
};
// Any other model type gets Llama's conventions (attention_bias, mlp_bias) and default.
constexpr std::int64_t kOtherDefaultMaxPositions = 2048;

// Bounds on mixture-of-experts fields: real models have up to 256 routed experts, 8 to 10
// chosen per token and a few shared ones.
constexpr std::int64_t kMaxExperts = 4096;
constexpr std::int64_t kMaxSharedExperts = 64;
// No model that passes has more parameters than this (10^15; the largest today are near
// 2 * 10^12): int64 sums of weight bytes stay far from overflow.
constexpr double kMaxParams = 1e15;

const Family* FamilyOfType(const std::string& model_type) {
  for (const Family& family : kFamilies) {
    if (model_type == family.model_type) return &family;
  }
  return nullptr;
}

const Family* FamilyOfClass(const std::string& class_name) {
  for (const Family& family : kFamilies) {
    if (class_name == family.class_name) return &family;
  }
  return nullptr;
}

// The families `pick` chooses, as "Class (model_type), ..." for messages.
std::string SupportedList(bool (*pick)(const Family&)) {
  std::string list;
  for (const Family& family : kFamilies) {
    if (!pick(family)) continue;
    if (!list.empty()) list += ", ";
    list += std::string(family.class_name) + " (" + family.model_type + ")";
  }
  return list;
}

bool Executable(const Family& family) { return family.executable; }
bool HasExperts(const Family& family) { return family.experts != Experts::kNone; }

// Families with no biases at all: Mistral's attention, and Mixtral's experts too.
bool BiasFree(const std::string& model_type) {
  return model_type == "mistral" || model_type == "mixtral";
}

// The default name: the file stem ("models/specs/llama-3.1-8b.json" -> "llama-3.1-8b"), or the
// model directory's name for a Hugging Face config.json ("/m/Llama-3.2-1B/config.json").
std::string DefaultName(const std::string& where) {
  const std::filesystem::path path(where);
  if (path.filename() == "config.json") {
    const std::string dir = path.parent_path().filename().string();
    if (!dir.empty() && dir != "." && dir != "..") return dir;
  }
  std::string stem = path.stem().string();
  return stem.empty() ? where : stem;
}

Result<std::string> NameField(const json& doc, const std::string& where) {
  Result<std::string> name = JsonStringOr(doc, "name", DefaultName(where), where);
  if (!name.ok()) return name.status();
  if (name->empty()) return FieldError(where, "name", "must not be empty");
  return name;
}

// A finite number field in (0, max]; `fallback` when absent or null (nullopt: required).
Result<double> PositiveNumber(const json& doc, const std::string& key, const std::string& where,
                              std::optional<double> fallback, double max) {
  if (!JsonHas(doc, key)) {
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

// Reads "architectures" and "model_type" into the spec. Malformed or contradicting values are
// errors; unknown ones are recorded (the backend refuses them, the simulator does not care).
Status ParseArchitecture(const json& doc, const std::string& where, ModelSpec& spec) {
  if (JsonHas(doc, "architectures")) {
    const json& list = doc.at("architectures");
    if (!list.is_array() || list.empty() || !list[0].is_string()) {
      return FieldError(where, "architectures", "must be a non-empty list of class names");
    }
    spec.architecture = list[0].get<std::string>();
  }
  Result<std::string> model_type = JsonStringOr(doc, "model_type", "", where);
  if (!model_type.ok()) return model_type.status();
  spec.model_type = *model_type;
  const Family* by_class = FamilyOfClass(spec.architecture);
  const Family* by_type = FamilyOfType(spec.model_type);
  if (by_class != nullptr && by_type != nullptr && by_class != by_type) {
    return FieldError(
        where, "model_type",
        "'" + spec.model_type + "' contradicts architectures[0] '" + spec.architecture + "'");
  }
  // A known name fills in the other, as transformers would.
  if (spec.model_type.empty() && by_class != nullptr) spec.model_type = by_class->model_type;
  if (spec.architecture.empty() && by_type != nullptr) spec.architecture = by_type->class_name;
  return Status::Ok();
}

// The key a family's config.json counts its routed experts with.
const char* ExpertCountKey(Experts experts) {
  switch (experts) {
    case Experts::kMixtral:
      return "num_local_experts";
    case Experts::kQwen3Moe:
      return "num_experts";
    case Experts::kDeepSeek:
      return "n_routed_experts";
    case Experts::kNone:
      break;
  }
  return "";
}

// Which layers of `layers` have experts: Qwen3-MoE's every decoder_sparse_step-th layer not in
// mlp_only_layers; DeepSeek's every moe_layer_freq-th from first_k_dense_replace on; all of
// Mixtral's.
Result<int> CountMoeLayers(const json& doc, const std::string& where, Experts experts,
                           std::int64_t layers) {
  if (experts == Experts::kMixtral) return int(layers);
  std::int64_t count = 0;
  if (experts == Experts::kQwen3Moe) {
    Result<std::int64_t> step = JsonIntIn(doc, "decoder_sparse_step", 1, layers, where, 1);
    if (!step.ok()) return step.status();
    std::vector<bool> dense(std::size_t(layers), false);
    if (JsonHas(doc, "mlp_only_layers")) {
      const json& list = doc.at("mlp_only_layers");
      if (!list.is_array() || list.size() > std::size_t(layers)) {
        return FieldError(where, "mlp_only_layers",
                          "must be a list of at most num_hidden_layers layer indices");
      }
      for (const json& item : list) {
        if (!item.is_number_integer() || item.get<std::int64_t>() < 0 ||
            item.get<std::int64_t>() >= layers) {
          return FieldError(where, "mlp_only_layers",
                            "must hold layer indices in [0, " + std::to_string(layers) + ") (got " +
                                DescribeJson(item) + ")");
        }
        dense[std::size_t(item.get<std::int64_t>())] = true;
      }
    }
    for (std::int64_t i = 0; i < layers; ++i)
      count += !dense[std::size_t(i)] && (i + 1) % *step == 0;
    return int(count);
  }
  Result<std::int64_t> first = JsonIntIn(doc, "first_k_dense_replace", 0, layers, where, 0);
  if (!first.ok()) return first.status();
  Result<std::int64_t> freq = JsonIntIn(doc, "moe_layer_freq", 1, layers, where, 1);
  if (!freq.ok()) return freq.status();
  for (std::int64_t i = *first; i < layers; ++i) count += i % *freq == 0;
  return int(count);
}

// The experts of a mixture-of-experts family; an expert count above 1 in any other family is
// an error (one dense MLP per layer would be wrong).
Status ParseExperts(const json& doc, const std::string& where, const Family* family,
                    ModelSpec& spec) {
  const Experts experts = family != nullptr ? family->experts : Experts::kNone;
  if (experts == Experts::kNone) {
    for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
      if (!JsonHas(doc, key)) continue;
      const json& value = doc.at(key);
      if (value.is_number() && value.get<double>() > 1) {
        return FieldError(where, key,
                          "is " + DescribeJson(value) + ": mixture-of-experts models of type '" +
                              spec.model_type +
                              "' are not supported (supported: " + SupportedList(HasExperts) + ")");
      }
    }
    return Status::Ok();
  }
  MoeSpec moe;
  Result<std::int64_t> count = JsonIntIn(doc, ExpertCountKey(experts), 2, kMaxExperts, where);
  if (!count.ok()) return count.status();
  moe.experts = int(*count);
  Result<std::int64_t> top = JsonIntIn(doc, "num_experts_per_tok", 1, *count, where);
  if (!top.ok()) return top.status();
  moe.experts_per_token = int(*top);
  if (experts == Experts::kMixtral) {
    moe.expert_intermediate = spec.intermediate_size;
  } else {
    Result<std::int64_t> width = JsonIntIn(doc, "moe_intermediate_size", 1, kMaxWidth, where);
    if (!width.ok()) return width.status();
    moe.expert_intermediate = int(*width);
  }
  if (experts == Experts::kDeepSeek) {
    Result<std::int64_t> shared =
        JsonIntIn(doc, "n_shared_experts", 0, kMaxSharedExperts, where, 0);
    if (!shared.ok()) return shared.status();
    moe.shared_experts = int(*shared);
    moe.router_bias = spec.model_type == "deepseek_v3";
  }
  Result<int> moe_layers = CountMoeLayers(doc, where, experts, spec.num_hidden_layers);
  if (!moe_layers.ok()) return moe_layers.status();
  moe.moe_layers = *moe_layers;
  spec.moe = moe;
  return Status::Ok();
}

// DeepSeek's multi-head latent attention; head_dim becomes the query/key head width.
Status ParseMla(const json& doc, const std::string& where, ModelSpec& spec) {
  MlaSpec mla;
  Result<std::int64_t> q_rank = JsonIntIn(doc, "q_lora_rank", 1, kMaxWidth, where, 0);
  if (!q_rank.ok()) return q_rank.status();
  mla.q_lora_rank = int(*q_rank);
  int* fields[] = {&mla.kv_lora_rank, &mla.qk_nope_head_dim, &mla.qk_rope_head_dim,
                   &mla.v_head_dim};
  const char* keys[] = {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"};
  for (std::size_t i = 0; i < std::size(keys); ++i) {
    Result<std::int64_t> value = JsonIntIn(doc, keys[i], 1, kMaxWidth, where);
    if (!value.ok()) return value.status();
    *fields[i] = int(*value);
  }
  if (mla.qk_rope_head_dim % 2 != 0) {
    return FieldError(
        where, "qk_rope_head_dim",
        "must be even for rotary embeddings (got " + std::to_string(mla.qk_rope_head_dim) + ")");
  }
  const std::int64_t widest = std::max<std::int64_t>(mla.QkHeadDim(), mla.v_head_dim);
  if (std::int64_t(spec.num_attention_heads) * widest > kMaxWidth) {
    return FieldError(where, "num_attention_heads",
                      "times the head width must be at most " + std::to_string(kMaxWidth));
  }
  if (spec.attention_qkv_bias) {
    return FieldError(where, "attention_bias", "true is not supported with latent attention");
  }
  spec.head_dim = mla.QkHeadDim();
  spec.mla = mla;
  return Status::Ok();
}

// quantization_config: absent, or fp8 (block-wise or per tensor). Any other method stores
// weights in widths the sizes here would not know.
Status ParseQuantization(const json& doc, const std::string& where, ModelSpec& spec) {
  if (!JsonHas(doc, "quantization_config")) return Status::Ok();
  const json& q = doc.at("quantization_config");
  const std::string at = where + ": quantization_config";
  if (!q.is_object()) return FieldError(where, "quantization_config", "must be an object or null");
  Result<std::string> method = JsonString(q, "quant_method", at);
  if (!method.ok()) return method.status();
  if (*method != "fp8") {
    return FieldError(at, "quant_method",
                      "'" + *method + "' is not supported (supported: fp8; or none)");
  }
  Fp8Weights fp8;
  if (JsonHas(q, "weight_block_size")) {
    const json& block = q.at("weight_block_size");
    if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() ||
        !block[1].is_number_integer() || block[0].get<std::int64_t>() < 1 ||
        block[1].get<std::int64_t>() < 1 || block[0].get<std::int64_t>() > kMaxWidth ||
        block[1].get<std::int64_t>() > kMaxWidth) {
      return FieldError(at, "weight_block_size",
                        "must be [rows, columns], each in [1, " + std::to_string(kMaxWidth) +
                            "] (got " + DescribeJson(block) + ")");
    }
    fp8.block_rows = block[0].get<std::int64_t>();
    fp8.block_cols = block[1].get<std::int64_t>();
  }
  spec.fp8 = fp8;
  return Status::Ok();
}

Result<RopeScaling> ParseRopeScaling(const json& doc, const std::string& where) {
  RopeScaling scaling;
  if (!JsonHas(doc, "rope_scaling")) return scaling;
  const json& rs = doc.at("rope_scaling");
  const std::string at = where + ": rope_scaling";
  if (!rs.is_object()) return FieldError(where, "rope_scaling", "must be an object or null");
  // transformers reads "rope_type" and falls back to the older "type".
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (JsonHas(rs, key)) {
      Result<std::string> value = JsonString(rs, key, at);
      if (!value.ok()) return value.status();
      type = *value;
      break;
    }
  }
  if (type.empty()) return FieldError(at, "rope_type", "is missing");
  if (type == "default") return scaling;
  if (type != "linear" && type != "llama3") {
    scaling.type = RopeScalingType::kUnsupported;
    scaling.unsupported_type = type;
    return scaling;
  }
  Result<double> factor = PositiveNumber(rs, "factor", at, std::nullopt, kMaxFactor);
  if (!factor.ok()) return factor.status();
  scaling.factor = *factor;
  if (type == "linear") {
    scaling.type = RopeScalingType::kLinear;
    return scaling;
  }
  scaling.type = RopeScalingType::kLlama3;
  Result<double> low = PositiveNumber(rs, "low_freq_factor", at, std::nullopt, kMaxFactor);
  if (!low.ok()) return low.status();
  Result<double> high = PositiveNumber(rs, "high_freq_factor", at, std::nullopt, kMaxFactor);
  if (!high.ok()) return high.status();
  if (!(*low < *high)) {
    // The smooth band divides by (high - low).
    return FieldError(at, "low_freq_factor",
                      "must be below high_freq_factor (got " + json(*low).dump() + " and " +
                          json(*high).dump() + ")");
  }
  Result<std::int64_t> original =
      JsonIntIn(rs, "original_max_position_embeddings", 1, kMaxPositions, at);
  if (!original.ok()) return original.status();
  scaling.low_freq_factor = *low;
  scaling.high_freq_factor = *high;
  scaling.original_max_position_embeddings = *original;
  return scaling;
}

Status ParseTokenIds(const json& doc, const std::string& where, ModelSpec& spec) {
  auto read_id = [&](const json& value, const std::string& key) -> Result<std::int64_t> {
    if (!value.is_number_integer()) {
      return FieldError(where, key,
                        "must be an integer token id (got " + DescribeJson(value) + ")");
    }
    const bool in_range =
        value.is_number_unsigned()
            ? value.get<std::uint64_t>() < std::uint64_t(spec.vocab_size)
            : value.get<std::int64_t>() >= 0 && value.get<std::int64_t>() < spec.vocab_size;
    if (!in_range) {
      return FieldError(where, key,
                        "must be a token id in [0, vocab_size=" + std::to_string(spec.vocab_size) +
                            ") (got " + DescribeJson(value) + ")");
    }
    return value.get<std::int64_t>();
  };
  if (JsonHas(doc, "bos_token_id")) {
    Result<std::int64_t> bos = read_id(doc.at("bos_token_id"), "bos_token_id");
    if (!bos.ok()) return bos.status();
    spec.bos_token_id = *bos;
  }
  if (JsonHas(doc, "eos_token_id")) {
    const json& eos = doc.at("eos_token_id");
    if (eos.is_array()) {
      for (const json& item : eos) {
        Result<std::int64_t> id = read_id(item, "eos_token_id");
        if (!id.ok()) return id.status();
        spec.eos_token_ids.push_back(*id);
      }
    } else {
      Result<std::int64_t> id = read_id(eos, "eos_token_id");
      if (!id.ok()) return id.status();
      spec.eos_token_ids.push_back(*id);
    }
  }
  return Status::Ok();
}

// Biases and the attention window, by family: Qwen2 hard-wires q/k/v biases and windows only
// with use_sliding_window; Mistral and Mixtral have no biases; Llama (and any other type) reads
// attention_bias and mlp_bias, and Llama has no window.
Status ParseBiasesAndWindow(const json& doc, const std::string& where, ModelSpec& spec) {
  const bool qwen2 = spec.model_type == "qwen2", mistral = BiasFree(spec.model_type);
  const bool llama = spec.model_type == "llama";
  if (qwen2) {
    spec.attention_qkv_bias = true;  // hard-wired in Qwen2Attention
  } else if (!mistral) {
    Result<bool> bias = JsonBoolOr(doc, "attention_bias", false, where);
    if (!bias.ok()) return bias.status();
    spec.attention_qkv_bias = *bias;
    spec.attention_o_bias = *bias;
    Result<bool> mlp_bias = JsonBoolOr(doc, "mlp_bias", false, where);
    if (!mlp_bias.ok()) return mlp_bias.status();
    spec.mlp_bias = *mlp_bias;
  }
  if (llama) return Status::Ok();
  Result<bool> use_window = JsonBoolOr(doc, "use_sliding_window", !qwen2, where);
  if (!use_window.ok()) return use_window.status();
  if (!*use_window) return Status::Ok();
  // Qwen2 with use_sliding_window must say how wide; elsewhere the window is optional.
  Result<std::int64_t> window =
      qwen2 ? JsonIntIn(doc, "sliding_window", 1, kMaxPositions, where)
            : JsonIntIn(doc, "sliding_window", 1, kMaxPositions, where, std::int64_t(0));
  if (!window.ok()) return window.status();
  if (*window > 0) spec.sliding_window = *window;
  return Status::Ok();
}

// Reads a number field in [kMinHardwareValue, kMaxHardwareValue].
Result<double> HardwareNumber(const json& doc, const std::string& key, const std::string& where) {
  Result<double> value = JsonNumber(doc, key, where);
  if (!value.ok()) return value.status();
  if (!std::isfinite(*value) || *value <= 0) {
    return FieldError(where, key, "must be > 0 (got " + DescribeJson(doc.at(key)) + ")");
  }
  if (*value < kMinHardwareValue || *value > kMaxHardwareValue) {
    char range[96];
    std::snprintf(range, sizeof(range), "must be between %g and %g (got ", kMinHardwareValue,
                  kMaxHardwareValue);
    return FieldError(where, key, range + DescribeJson(doc.at(key)) + ")");
  }
  return *value;
}

}  // namespace

WeightPart WeightBreakdown::NonExpert() const {
  WeightPart sum = embedding;
  for (const WeightPart* part :
       {&lm_head, &attention, &dense_mlp, &shared_experts, &router, &norms})
    sum += *part;
  return sum;
}

WeightPart WeightBreakdown::Total() const {
  WeightPart sum = NonExpert();
  sum += routed_experts;
  return sum;
}

WeightBreakdown ModelSpec::Weights() const {
  const std::int64_t e = BytesPerElement();
  // A tensor in the model's dtype, and a linear layer's [out, in] weight (fp8 with its scales
  // in an fp8 checkpoint), each `times` over.
  auto plain = [&](std::int64_t params, std::int64_t times = 1) {
    return WeightPart{params * times, params * e * times};
  };
  auto linear = [&](std::int64_t in, std::int64_t out, std::int64_t times = 1) {
    if (!fp8) return plain(in * out, times);
    const std::int64_t scales = fp8->block_rows > 0
                                    ? ((out + fp8->block_rows - 1) / fp8->block_rows) *
                                          ((in + fp8->block_cols - 1) / fp8->block_cols)
                                    : 1;
    return WeightPart{in * out * times, (in * out + 4 * scales) * times};
  };
  auto mlp = [&](std::int64_t width, std::int64_t times) {  // gate, up, down
    WeightPart part = linear(hidden_size, width, 2 * times);
    part += linear(width, hidden_size, times);
    if (mlp_bias) part += plain(2 * width + hidden_size, times);
    return part;
  };
  const std::int64_t h = hidden_size, layers = num_hidden_layers, heads = num_attention_heads;
  WeightBreakdown w;
  w.embedding = plain(std::int64_t(vocab_size) * h);
  if (!tie_word_embeddings) w.lm_head = w.embedding;
  for (const MatrixShape& m : AttentionProjections()) w.attention += linear(m.in, m.out, layers);
  if (mla) {
    if (mla->q_lora_rank > 0) w.attention += plain(mla->q_lora_rank, layers);  // q_a_layernorm
    w.attention += plain(mla->kv_lora_rank, layers);                           // kv_a_layernorm
  } else {
    if (attention_qkv_bias) w.attention += plain(QWidth() + 2 * KvWidth(), layers);
    if (attention_o_bias) w.attention += plain(h, layers);
    if (qk_norm) w.attention += plain(2 * head_dim, layers);
  }
  w.dense_mlp = mlp(intermediate_size, DenseLayers());
  if (moe) {
    w.routed_experts = mlp(moe->expert_intermediate, std::int64_t(moe->experts) * moe->moe_layers);
    if (moe->shared_experts > 0) {
      // One MLP as wide as all the shared experts together, as DeepSeek stores them.
      w.shared_experts =
          mlp(std::int64_t(moe->shared_experts) * moe->expert_intermediate, moe->moe_layers);
    }
    w.router = plain(h * moe->experts + (moe->router_bias ? moe->experts : 0), moe->moe_layers);
  }
  w.norms = plain(2 * h * layers + h);
  return w;
}

std::vector<MatrixShape> ModelSpec::AttentionProjections() const {
  const std::int64_t h = hidden_size, heads = num_attention_heads;
  if (!mla) {
    return {{h, QWidth()}, {h, KvWidth()}, {h, KvWidth()}, {QWidth(), h}};  // q, k, v, o
  }
  std::vector<MatrixShape> m;
  if (mla->q_lora_rank > 0) {
    m.push_back({h, mla->q_lora_rank});                         // q_a_proj
    m.push_back({mla->q_lora_rank, heads * mla->QkHeadDim()});  // q_b_proj
  } else {
    m.push_back({h, heads * mla->QkHeadDim()});  // q_proj
  }
  m.push_back({h, mla->CachedWidth()});  // kv_a_proj_with_mqa
  m.push_back({mla->kv_lora_rank, heads * (mla->qk_nope_head_dim + mla->v_head_dim)});  // kv_b
  m.push_back({heads * mla->v_head_dim, h});                                            // o_proj
  return m;
}

std::int64_t ModelSpec::ActiveParamCount() const {
  const WeightBreakdown w = Weights();
  const std::int64_t routed = w.routed_experts.params;  // experts * moe_layers equal experts
  return w.Total().params - routed + (moe ? routed / moe->experts * moe->experts_per_token : 0);
}

Bytes ModelSpec::KvBytesPerToken(std::optional<Dtype> kv_cache_dtype) const {
  const Bytes bytes = Bytes(DtypeBytes(kv_cache_dtype.value_or(AutoKvCacheDtype())));
  if (mla) return std::int64_t(num_hidden_layers) * mla->CachedWidth() * bytes;
  return 2 * std::int64_t(num_hidden_layers) * KvWidth() * bytes;
}

int ModelSpec::KvShards(int tp) const {
  if (mla) return 1;
  if (tp <= num_key_value_heads) return num_key_value_heads % tp == 0 ? tp : 0;
  return tp % num_key_value_heads == 0 ? num_key_value_heads : 0;
}

std::vector<float> ModelSpec::RopeInvFrequencies() const {
  DUET_CHECK_MSG(rope_scaling.type != RopeScalingType::kUnsupported,
                 "rope_scaling type '" + rope_scaling.unsupported_type + "' (CheckExecutable)");
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

Result<ModelSpec> ParseModelSpec(const json& doc, const std::string& where) {
  if (!doc.is_object()) return Status::Error(where + ": top level must be a JSON object");
  ModelSpec spec;
  Result<std::string> name = NameField(doc, where);
  if (!name.ok()) return name.status();
  spec.name = *name;
  DUET_RETURN_IF_ERROR(ParseArchitecture(doc, where, spec));
  const Family* family = FamilyOfType(spec.model_type);
  const bool mla = family != nullptr && family->mla;

  Result<std::int64_t> layers = JsonIntIn(doc, "num_hidden_layers", 1, kMaxLayers, where);
  if (!layers.ok()) return layers.status();
  Result<std::int64_t> hidden = JsonIntIn(doc, "hidden_size", 1, kMaxWidth, where);
  if (!hidden.ok()) return hidden.status();
  Result<std::int64_t> heads = JsonIntIn(doc, "num_attention_heads", 1, kMaxHeads, where);
  if (!heads.ok()) return heads.status();
  Result<std::int64_t> kv_heads =
      JsonIntIn(doc, "num_key_value_heads", 1, kMaxHeads, where, *heads);
  if (!kv_heads.ok()) return kv_heads.status();
  Result<std::int64_t> intermediate = JsonIntIn(doc, "intermediate_size", 1, kMaxWidth, where);
  if (!intermediate.ok()) return intermediate.status();
  Result<std::int64_t> vocab = JsonIntIn(doc, "vocab_size", 1, kMaxVocab, where);
  if (!vocab.ok()) return vocab.status();
  if (*heads % *kv_heads != 0) {
    return FieldError(where, "num_key_value_heads",
                      "(" + std::to_string(*kv_heads) + ") must divide num_attention_heads (" +
                          std::to_string(*heads) + ")");
  }

  std::int64_t head_dim = 0;
  if (mla) {
    // ParseMla sets it from the latent attention's own widths.
  } else if (JsonHas(doc, "head_dim")) {
    Result<std::int64_t> value = JsonIntIn(doc, "head_dim", 1, kMaxWidth, where);
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
  if (!mla && head_dim % 2 != 0) {
    return FieldError(where, "head_dim",
                      "must be even for rotary embeddings (got " + std::to_string(head_dim) + ")");
  }
  if (*heads * head_dim > kMaxWidth) {
    return FieldError(where, "head_dim",
                      "times num_attention_heads must be at most " + std::to_string(kMaxWidth) +
                          " (got " + std::to_string(*heads) + " * " + std::to_string(head_dim) +
                          ")");
  }
  spec.num_hidden_layers = int(*layers);
  spec.hidden_size = int(*hidden);
  spec.num_attention_heads = int(*heads);
  spec.num_key_value_heads = int(*kv_heads);
  spec.head_dim = int(head_dim);
  spec.intermediate_size = int(*intermediate);
  spec.vocab_size = int(*vocab);

  Result<double> eps = PositiveNumber(doc, "rms_norm_eps", where, 1e-6, 1.0);
  if (!eps.ok()) return eps.status();
  spec.rms_norm_eps = *eps;
  Result<double> theta = PositiveNumber(doc, "rope_theta", where, 10000.0, 1e300);
  if (!theta.ok()) return theta.status();
  if (*theta < 1.0) {
    // Below 1 the "frequencies" would grow with the pair index past 1 rad/token (and
    // overflow float for tiny values); no model does this.
    return FieldError(where, "rope_theta", "must be at least 1 (got " + json(*theta).dump() + ")");
  }
  spec.rope_theta = *theta;
  Result<RopeScaling> scaling = ParseRopeScaling(doc, where);
  if (!scaling.ok()) return scaling.status();
  spec.rope_scaling = *scaling;
  Result<double> partial = PositiveNumber(doc, "partial_rotary_factor", where, 1.0, 1.0);
  if (!partial.ok()) return partial.status();
  spec.partial_rotary_factor = *partial;
  Result<std::int64_t> max_positions =
      JsonIntIn(doc, "max_position_embeddings", 1, kMaxPositions, where,
                family != nullptr ? family->default_max_positions : kOtherDefaultMaxPositions);
  if (!max_positions.ok()) return max_positions.status();
  spec.max_position_embeddings = *max_positions;
  Result<bool> tied = JsonBoolOr(doc, "tie_word_embeddings", false, where);
  if (!tied.ok()) return tied.status();
  spec.tie_word_embeddings = *tied;
  Result<std::string> act = JsonStringOr(doc, "hidden_act", "silu", where);
  if (!act.ok()) return act.status();
  spec.hidden_act = *act;

  // Newer transformers write "dtype" instead of "torch_dtype".
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!JsonHas(doc, key)) continue;
    const json& value = doc.at(key);
    const std::optional<Dtype> dtype =
        value.is_string() ? DtypeFromTorchName(value.get<std::string>()) : std::nullopt;
    if (!dtype) {
      return FieldError(
          where, key,
          "must be one of bfloat16, float16, float32 (got " + DescribeJson(value) + ")");
    }
    spec.torch_dtype = *dtype;
    break;
  }

  DUET_RETURN_IF_ERROR(ParseBiasesAndWindow(doc, where, spec));
  DUET_RETURN_IF_ERROR(ParseTokenIds(doc, where, spec));
  if (mla) DUET_RETURN_IF_ERROR(ParseMla(doc, where, spec));
  DUET_RETURN_IF_ERROR(ParseExperts(doc, where, family, spec));
  DUET_RETURN_IF_ERROR(ParseQuantization(doc, where, spec));
  spec.qk_norm = family != nullptr && family->qk_norm;
  Result<std::int64_t> mtp = JsonIntIn(doc, "num_nextn_predict_layers", 0, kMaxLayers, where, 0);
  if (!mtp.ok()) return mtp.status();
  spec.mtp_layers = int(*mtp);
  double params = double(spec.hidden_size) * spec.intermediate_size * 3 * spec.num_hidden_layers;
  if (spec.moe) {
    params += double(spec.moe->ExpertParams(spec.hidden_size)) *
              (spec.moe->experts + spec.moe->shared_experts) * spec.moe->moe_layers;
  }
  if (params > kMaxParams) {
    return Status::Error(where + ": the MLPs alone would hold " + json(params).dump() +
                         " parameters, more than the " + json(kMaxParams).dump() +
                         " any model has");
  }
  return spec;
}

ModelSpec ModelSpec::MtpDrafter() const {
  DUET_CHECK(mtp_layers > 0);
  ModelSpec drafter = *this;
  drafter.name = name + "-mtp";
  drafter.num_hidden_layers = mtp_layers;
  drafter.mtp_layers = 0;
  if (drafter.moe) drafter.moe->moe_layers = mtp_layers;
  return drafter;
}

Result<ModelSpec> LoadModelSpec(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string file =
      fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  Result<json> doc = ReadJsonFile(file);
  if (!doc.ok()) return doc.status();
  return ParseModelSpec(*doc, file);
}

json ModelSpecToJson(const ModelSpec& spec) {
  json doc = json::object();
  if (!spec.architecture.empty()) doc["architectures"] = json::array({spec.architecture});
  if (!spec.model_type.empty()) doc["model_type"] = spec.model_type;
  doc["hidden_act"] = spec.hidden_act;
  doc["hidden_size"] = spec.hidden_size;
  doc["intermediate_size"] = spec.intermediate_size;
  doc["num_hidden_layers"] = spec.num_hidden_layers;
  doc["num_attention_heads"] = spec.num_attention_heads;
  doc["num_key_value_heads"] = spec.num_key_value_heads;
  doc["head_dim"] = spec.head_dim;
  doc["vocab_size"] = spec.vocab_size;
  doc["rms_norm_eps"] = spec.rms_norm_eps;
  doc["rope_theta"] = spec.rope_theta;
  const RopeScaling& rs = spec.rope_scaling;
  switch (rs.type) {
    case RopeScalingType::kNone:
      doc["rope_scaling"] = nullptr;
      break;
    case RopeScalingType::kLinear:
      doc["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rs.factor}};
      break;
    case RopeScalingType::kLlama3:
      doc["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", rs.factor},
          {"low_freq_factor", rs.low_freq_factor},
          {"high_freq_factor", rs.high_freq_factor},
          {"original_max_position_embeddings", rs.original_max_position_embeddings}};
      break;
    case RopeScalingType::kUnsupported:
      doc["rope_scaling"] = {{"rope_type", rs.unsupported_type}};
      break;
  }
  if (spec.partial_rotary_factor != 1.0) doc["partial_rotary_factor"] = spec.partial_rotary_factor;
  if (spec.mtp_layers > 0) doc["num_nextn_predict_layers"] = spec.mtp_layers;
  doc["max_position_embeddings"] = spec.max_position_embeddings;
  doc["tie_word_embeddings"] = spec.tie_word_embeddings;
  if (spec.torch_dtype) doc["torch_dtype"] = TorchDtypeName(*spec.torch_dtype);
  if (spec.model_type != "qwen2" && !BiasFree(spec.model_type)) {
    doc["attention_bias"] = spec.attention_qkv_bias;
    doc["mlp_bias"] = spec.mlp_bias;
  }
  if (spec.sliding_window) {
    doc["sliding_window"] = *spec.sliding_window;
    if (spec.model_type == "qwen2") doc["use_sliding_window"] = true;
  } else if (spec.model_type == "mistral") {
    doc["sliding_window"] = nullptr;
  }
  const Family* family = FamilyOfType(spec.model_type);
  if (spec.moe && family != nullptr) {
    const MoeSpec& moe = *spec.moe;
    doc[ExpertCountKey(family->experts)] = moe.experts;
    doc["num_experts_per_tok"] = moe.experts_per_token;
    const int dense = spec.DenseLayers();
    if (family->experts != Experts::kMixtral)
      doc["moe_intermediate_size"] = moe.expert_intermediate;
    if (family->experts == Experts::kQwen3Moe) {
      json dense_layers = json::array();
      for (int i = 0; i < dense; ++i) dense_layers.push_back(i);
      doc["decoder_sparse_step"] = 1;
      doc["mlp_only_layers"] = dense_layers;
    } else if (family->experts == Experts::kDeepSeek) {
      doc["first_k_dense_replace"] = dense;
      doc["moe_layer_freq"] = 1;
      doc["n_shared_experts"] = moe.shared_experts;
    }
  }
  if (spec.mla) {
    doc["q_lora_rank"] = spec.mla->q_lora_rank > 0 ? json(spec.mla->q_lora_rank) : json(nullptr);
    doc["kv_lora_rank"] = spec.mla->kv_lora_rank;
    doc["qk_nope_head_dim"] = spec.mla->qk_nope_head_dim;
    doc["qk_rope_head_dim"] = spec.mla->qk_rope_head_dim;
    doc["v_head_dim"] = spec.mla->v_head_dim;
  }
  if (spec.fp8) {
    doc["quantization_config"] = {{"quant_method", "fp8"}};
    if (spec.fp8->block_rows > 0) {
      doc["quantization_config"]["weight_block_size"] = {spec.fp8->block_rows,
                                                         spec.fp8->block_cols};
    }
  }
  if (spec.bos_token_id) doc["bos_token_id"] = *spec.bos_token_id;
  if (spec.eos_token_ids.size() == 1) {
    doc["eos_token_id"] = spec.eos_token_ids[0];
  } else if (!spec.eos_token_ids.empty()) {
    doc["eos_token_id"] = spec.eos_token_ids;
  }
  return doc;
}

Status CheckExecutable(const ModelSpec& spec, const std::string& where) {
  const Family* family = FamilyOfType(spec.model_type);
  if (spec.model_type.empty() && spec.architecture.empty()) {
    return FieldError(
        where, "model_type",
        "is missing (and so is 'architectures'); supported: " + SupportedList(Executable));
  }
  if (family == nullptr || !family->executable ||
      (!spec.architecture.empty() && FamilyOfClass(spec.architecture) == nullptr)) {
    std::string named = spec.architecture;
    if (!spec.model_type.empty()) {
      named +=
          named.empty() ? "model_type " + spec.model_type : " (model_type " + spec.model_type + ")";
    }
    return Status::Error(where + ": unsupported architecture " + named +
                         "; supported: " + SupportedList(Executable));
  }
  if (spec.hidden_act != "silu") {
    return FieldError(where, "hidden_act",
                      "must be \"silu\" (got " + DescribeJson(json(spec.hidden_act)) + ")");
  }
  if (spec.mlp_bias) return FieldError(where, "mlp_bias", "true is not supported");
  if (spec.fp8) {
    return FieldError(where, "quantization_config", "fp8 weights are not supported by the backend");
  }
  if (spec.partial_rotary_factor != 1.0) {
    return FieldError(where, "partial_rotary_factor",
                      "must be 1 (partial rotary embeddings are not supported; got " +
                          json(spec.partial_rotary_factor).dump() + ")");
  }
  if (spec.rope_scaling.type == RopeScalingType::kUnsupported) {
    return Status::Error(where + ": unsupported rope_scaling type " +
                         DescribeJson(json(spec.rope_scaling.unsupported_type)) +
                         " (supported: default, linear, llama3)");
  }
  return Status::Ok();
}

Result<HardwareSpec> ParseHardwareSpec(const json& doc, const std::string& where) {
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
  Result<json> doc = ReadJsonFile(path);
  if (!doc.ok()) return doc.status();
  return ParseHardwareSpec(*doc, path);
}

}  // namespace duet::models
