// Llama-family weight mapping: Hugging Face tensor names to LlamaWeights views, with every
// shape checked against the config, and whole-directory loading (config.json + safetensors +
// tokenizer file paths).
#include "backend/model/llama_weights.h"

#include <filesystem>

namespace duet::backend {
namespace {

// Looks tensors up in one checkpoint and checks their shapes; errors name the directory.
class TensorFinder {
 public:
  explicit TensorFinder(const SafetensorsCheckpoint& checkpoint) : checkpoint_(checkpoint) {}

  Result<TensorView> Get(const std::string& name, std::vector<std::int64_t> shape) const {
    const TensorView* view = checkpoint_.Find(name);
    if (view == nullptr) {
      return Status::Error("missing tensor " + name + " in " + checkpoint_.dir());
    }
    if (view->shape != shape) {
      return Status::Error(checkpoint_.FileOf(name) + ": tensor " + name + " has shape " +
                           ShapeString(view->shape) + ", expected " + ShapeString(shape) +
                           " from the config");
    }
    return *view;
  }

 private:
  const SafetensorsCheckpoint& checkpoint_;
};

// Sets `out` from `result` or returns its error from the enclosing function.
#define DUET_ASSIGN_TENSOR(out, result)         \
  do {                                          \
    Result<TensorView> _tensor = (result);      \
    if (!_tensor.ok()) return _tensor.status(); \
    (out) = std::move(*_tensor);                \
  } while (0)

}  // namespace

Result<LlamaWeights> LoadLlamaWeights(const models::ModelSpec& config,
                                      std::shared_ptr<const SafetensorsCheckpoint> checkpoint) {
  DUET_CHECK(checkpoint != nullptr);
  DUET_RETURN_IF_ERROR(models::CheckExecutable(config, checkpoint->dir() + "/config.json"));
  const TensorFinder find(*checkpoint);
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t vocab = config.vocab_size;
  const std::int64_t q_width = config.QWidth();
  const std::int64_t kv_width = config.KvWidth();
  const std::int64_t intermediate = config.intermediate_size;

  LlamaWeights weights;
  DUET_ASSIGN_TENSOR(weights.embed_tokens, find.Get("model.embed_tokens.weight", {vocab, hidden}));
  weights.layers.resize(std::size_t(config.num_hidden_layers));
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    LlamaLayerWeights& layer = weights.layers[std::size_t(i)];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    const std::string attn = prefix + "self_attn.";
    DUET_ASSIGN_TENSOR(layer.input_layernorm,
                       find.Get(prefix + "input_layernorm.weight", {hidden}));
    DUET_ASSIGN_TENSOR(layer.q_proj, find.Get(attn + "q_proj.weight", {q_width, hidden}));
    DUET_ASSIGN_TENSOR(layer.k_proj, find.Get(attn + "k_proj.weight", {kv_width, hidden}));
    DUET_ASSIGN_TENSOR(layer.v_proj, find.Get(attn + "v_proj.weight", {kv_width, hidden}));
    DUET_ASSIGN_TENSOR(layer.o_proj, find.Get(attn + "o_proj.weight", {hidden, q_width}));
    if (config.attention_qkv_bias) {
      DUET_ASSIGN_TENSOR(layer.q_bias, find.Get(attn + "q_proj.bias", {q_width}));
      DUET_ASSIGN_TENSOR(layer.k_bias, find.Get(attn + "k_proj.bias", {kv_width}));
      DUET_ASSIGN_TENSOR(layer.v_bias, find.Get(attn + "v_proj.bias", {kv_width}));
    }
    if (config.attention_o_bias) {
      DUET_ASSIGN_TENSOR(layer.o_bias, find.Get(attn + "o_proj.bias", {hidden}));
    }
    DUET_ASSIGN_TENSOR(layer.post_attention_layernorm,
                       find.Get(prefix + "post_attention_layernorm.weight", {hidden}));
    DUET_ASSIGN_TENSOR(layer.gate_proj,
                       find.Get(prefix + "mlp.gate_proj.weight", {intermediate, hidden}));
    DUET_ASSIGN_TENSOR(layer.up_proj,
                       find.Get(prefix + "mlp.up_proj.weight", {intermediate, hidden}));
    DUET_ASSIGN_TENSOR(layer.down_proj,
                       find.Get(prefix + "mlp.down_proj.weight", {hidden, intermediate}));
  }
  DUET_ASSIGN_TENSOR(weights.norm, find.Get("model.norm.weight", {hidden}));
  if (config.tie_word_embeddings) {
    weights.lm_head = weights.embed_tokens;
    weights.lm_head_tied = true;
  } else {
    DUET_ASSIGN_TENSOR(weights.lm_head, find.Get("lm_head.weight", {vocab, hidden}));
  }
  weights.checkpoint = std::move(checkpoint);
  return weights;
}

#undef DUET_ASSIGN_TENSOR

Result<LlamaWeights> LoadLlamaWeights(const models::ModelSpec& config,
                                      const std::string& model_dir) {
  // Before opening the checkpoint: an unsupported architecture is the more useful message.
  DUET_RETURN_IF_ERROR(
      models::CheckExecutable(config, (std::filesystem::path(model_dir) / "config.json").string()));
  Result<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::OpenDir(model_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  return LoadLlamaWeights(config,
                          std::make_shared<const SafetensorsCheckpoint>(std::move(*checkpoint)));
}

Result<LoadedModel> LoadModelDir(const std::string& dir) {
  namespace fs = std::filesystem;
  LoadedModel model;
  model.dir = dir;
  Result<models::ModelSpec> config =
      models::LoadModelSpec((fs::path(dir) / "config.json").string());
  if (!config.ok()) return config.status();
  model.config = std::move(*config);
  Result<LlamaWeights> weights = LoadLlamaWeights(model.config, dir);
  if (!weights.ok()) return weights.status();
  model.weights = std::move(*weights);
  std::error_code ec;
  for (auto [name, out] : {std::pair{"tokenizer.json", &model.tokenizer_json_path},
                           std::pair{"tokenizer_config.json", &model.tokenizer_config_path}}) {
    const fs::path path = fs::path(dir) / name;
    if (fs::is_regular_file(path, ec)) *out = path.string();
  }
  return model;
}

}  // namespace duet::backend
