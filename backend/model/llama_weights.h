// The weights of a Llama-family model as views into its memory-mapped safetensors files,
// named the way Hugging Face checkpoints name them and shape-checked against config.json,
// and LoadModelDir, which reads a whole model directory (config, weights, tokenizer paths).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/model/safetensors.h"
#include "common/status.h"
#include "models/model_spec.h"

namespace duet::backend {

// One decoder layer. Shapes are [out_features, in_features] as nn.Linear stores them:
// q [heads*head_dim, hidden], k/v [kv_heads*head_dim, hidden], o [hidden, heads*head_dim],
// gate/up [intermediate, hidden], down [hidden, intermediate], norms and biases 1-D.
struct LlamaLayerWeights {
  TensorView input_layernorm;
  TensorView q_proj, k_proj, v_proj, o_proj;
  std::optional<TensorView> q_bias, k_bias, v_bias;  // config.attention_qkv_bias
  std::optional<TensorView> o_bias;                  // config.attention_o_bias
  TensorView post_attention_layernorm;
  TensorView gate_proj, up_proj, down_proj;
};

// Every view stays valid as long as this struct (or a copy) lives: it shares ownership of the
// mapped files. Each tensor keeps the dtype it has on disk (BF16, F16 or F32, possibly mixed).
struct LlamaWeights {
  TensorView embed_tokens;  // [vocab, hidden]
  std::vector<LlamaLayerWeights> layers;
  TensorView norm;     // final RMSNorm [hidden]
  TensorView lm_head;  // [vocab, hidden]; the same view as embed_tokens when tied
  bool lm_head_tied = false;
  std::shared_ptr<const SafetensorsCheckpoint> checkpoint;
};

// Maps every tensor the config calls for, checking its shape. A config the forward pass does
// not implement (models::CheckExecutable: an unsupported architecture, activation, rope scaling)
// is refused first, naming DIR/config.json. Errors name the tensor and the directory ("missing
// tensor model.layers.3.mlp.up_proj.weight in DIR") or the expected and actual shapes. Tensors
// the model does not use (e.g. old rotary_emb.inv_freq buffers) are ignored; a tied model's
// lm_head.weight, if present, is ignored in favour of embed_tokens.
Result<LlamaWeights> LoadLlamaWeights(const models::ModelSpec& config,
                                      const std::string& model_dir);
Result<LlamaWeights> LoadLlamaWeights(const models::ModelSpec& config,
                                      std::shared_ptr<const SafetensorsCheckpoint> checkpoint);

// A model directory as Hugging Face lays it out.
struct LoadedModel {
  std::string dir;
  models::ModelSpec config;
  LlamaWeights weights;
  std::string tokenizer_json_path;    // dir/tokenizer.json, "" when absent (not parsed here)
  std::string tokenizer_config_path;  // dir/tokenizer_config.json, "" when absent
};

// Reads dir/config.json (models::LoadModelSpec, the parser the simulator uses too) and maps the
// weights.
Result<LoadedModel> LoadModelDir(const std::string& dir);

}  // namespace duet::backend
