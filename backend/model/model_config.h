// The architecture of a Llama-family checkpoint, read from its Hugging Face config.json:
// Llama 2/3/3.1/3.2 ("llama"), Qwen2 ("qwen2", biases on q/k/v) and Mistral ("mistral", run as
// Llama). Also the rotary-embedding inverse frequencies, including Llama 3's scaling, computed
// the way Hugging Face transformers computes them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace duet::backend {

enum class RopeScalingType {
  kNone,    // rope_scaling null/absent, or rope_type "default"
  kLinear,  // positions divided by `factor` (every inverse frequency divided by it)
  kLlama3,  // Llama 3.1 frequency-dependent scaling (_compute_llama3_parameters)
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  // Llama 3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string model_type;    // "llama", "qwen2" or "mistral"
  std::string architecture;  // architectures[0], e.g. "LlamaForCausalLM" ("" when absent)
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads
  int head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int vocab_size = 0;
  double rms_norm_eps = 1e-6;  // Hugging Face's default when absent
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  std::int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::string torch_dtype;  // "bfloat16", "float16", "float32" or "" when absent
  // Biases: Qwen2 always has q/k/v biases; Llama's attention_bias adds q/k/v *and* o biases
  // (as LlamaAttention does); Mistral has none.
  bool attention_qkv_bias = false;
  bool attention_o_bias = false;
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;  // one or more (Llama 3.1 lists three)
  // Mistral's (and Qwen2's, when use_sliding_window) attention window in tokens. Recorded
  // only: Duet's attention is always full, which equals sliding-window attention exactly as
  // long as every sequence fits in the window; longer sequences would diverge from the
  // reference model.
  std::optional<std::int64_t> sliding_window;

  std::int64_t QWidth() const { return std::int64_t(num_attention_heads) * head_dim; }
  std::int64_t KvWidth() const { return std::int64_t(num_key_value_heads) * head_dim; }
  // Every weight the checkpoint holds (embeddings, LM head unless tied, per-layer projections,
  // biases and norms, final norm).
  std::int64_t ParamCount() const;

  // head_dim / 2 rotary inverse frequencies theta^(-2i/head_dim), then the rope_scaling
  // adjustment with transformers' formulas. Computed in double and rounded to float once;
  // transformers computes in float32, so values agree with it to a few float32 ulps (at most
  // 2 seen, in Llama 3's smoothed band) rather than bit for bit.
  std::vector<float> RopeInvFrequencies() const;
};

// Parses a config.json document; `where` (the file name) starts every error, which also names
// the field.
Result<ModelConfig> ParseModelConfig(const nlohmann::json& doc, const std::string& where);
Result<ModelConfig> LoadModelConfig(const std::string& path);

// The config.json for `config` (Hugging Face field names), as written by the test-model
// generator; ParseModelConfig(ModelConfigToJson(c)) gives back c.
nlohmann::json ModelConfigToJson(const ModelConfig& config);

}  // namespace duet::backend
