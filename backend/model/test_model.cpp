// Generation of the deterministic tiny random Llama model: config and tokenizer files, and
// the weights streamed tensor by tensor into model.safetensors (so the ~125M preset never
// needs more memory than its largest tensor).
#include "backend/model/test_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <random>

#include "backend/tokenizer/test_tokenizer.h"

namespace duet::backend {
namespace {

using nlohmann::json;

constexpr const char* kBosToken = "<|begin_of_text|>";
constexpr const char* kEosToken = "<|eot_id|>";

// Llama 3 style chat template: every message framed by header ids and closed by <|eot_id|>,
// the BOS token first, and an open assistant header when a generation prompt is asked for.
constexpr const char* kChatTemplate =
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

struct TokenizerInfo {
  std::string json_text;
  int total_size = 0;  // highest id + 1 over the BPE vocabulary and the added tokens
  std::int64_t bos_id = -1;
  std::int64_t eos_id = -1;
};

Result<TokenizerInfo> MakeTokenizer(int bpe_vocab_size) {
  if (bpe_vocab_size < 256) {
    return Status::Error("test model: tokenizer_vocab_size must be at least 256");
  }
  TokenizerInfo info;
  info.json_text = MakeTestTokenizerJson(bpe_vocab_size);
  const json doc = json::parse(info.json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status::Error("test model: MakeTestTokenizerJson returned invalid JSON");
  }
  std::int64_t max_id = -1;
  auto model = doc.find("model");
  if (model != doc.end() && model->is_object() && model->contains("vocab") &&
      (*model)["vocab"].is_object()) {
    for (const json& id : (*model)["vocab"]) {
      if (id.is_number_integer()) max_id = std::max(max_id, id.get<std::int64_t>());
    }
  }
  auto added = doc.find("added_tokens");
  if (added != doc.end() && added->is_array()) {
    for (const json& token : *added) {
      if (!token.is_object() || !token.contains("id") || !token["id"].is_number_integer() ||
          !token.contains("content") || !token["content"].is_string()) {
        continue;
      }
      const std::int64_t id = token["id"].get<std::int64_t>();
      max_id = std::max(max_id, id);
      if (token["content"] == kBosToken) info.bos_id = id;
      if (token["content"] == kEosToken) info.eos_id = id;
    }
  }
  if (max_id < 0 || info.bos_id < 0 || info.eos_id < 0) {
    return Status::Error(std::string("test model: the test tokenizer lacks a vocabulary or ") +
                         kBosToken + " / " + kEosToken);
  }
  info.total_size = int(max_id + 1);
  return info;
}

// The options' checks that need the tokenizer: the vocabulary must cover its ids.
Status CheckVocab(const TestModelOptions& options, const TokenizerInfo& tokenizer) {
  if (options.vocab_size != 0 && options.vocab_size < tokenizer.total_size) {
    return Status::Error("test model: vocab_size " + std::to_string(options.vocab_size) +
                         " is below the tokenizer's " + std::to_string(tokenizer.total_size) +
                         " ids");
  }
  return Status::Ok();
}

models::ModelSpec ConfigFor(const TestModelOptions& options, const TokenizerInfo& tokenizer) {
  models::ModelSpec config;
  config.name = "test-model";
  config.model_type = "llama";
  config.architecture = "LlamaForCausalLM";
  config.hidden_size = options.hidden_size;
  config.intermediate_size = options.intermediate_size;
  config.num_hidden_layers = options.num_hidden_layers;
  config.num_attention_heads = options.num_attention_heads;
  config.num_key_value_heads = options.num_key_value_heads;
  config.head_dim = options.head_dim;
  config.vocab_size = options.vocab_size == 0 ? tokenizer.total_size : options.vocab_size;
  config.rms_norm_eps = options.rms_norm_eps;
  config.rope_theta = options.rope_theta;
  config.rope_scaling = options.rope_scaling;
  config.max_position_embeddings = options.max_position_embeddings;
  config.tie_word_embeddings = options.tie_word_embeddings;
  config.torch_dtype = options.dtype;
  config.attention_qkv_bias = options.attention_bias;
  config.attention_o_bias = options.attention_bias;
  config.bos_token_id = tokenizer.bos_id;
  config.eos_token_ids = {tokenizer.eos_id};
  return config;
}

// FNV-1a: a fixed, portable hash of the tensor name for its stream's seed.
std::uint64_t HashName(const std::string& name) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// Standard normals from mt19937_64 by the Box-Muller transform (both outputs used).
class NormalStream {
 public:
  explicit NormalStream(std::uint64_t seed) : engine_(seed) {}
  double Next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // 53-bit uniforms: u1 in (0, 1] so log(u1) is finite, u2 in [0, 1).
    const double u1 = double((engine_() >> 11) + 1) * 0x1p-53;
    const double u2 = double(engine_() >> 11) * 0x1p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0;
  bool has_spare_ = false;
};

bool IsNorm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

std::vector<std::byte> Encode(const std::vector<float>& values, Dtype dtype) {
  std::vector<std::byte> bytes(values.size() * DtypeBytes(dtype));
  if (dtype == Dtype::kF32) {
    if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint16_t bits =
        dtype == Dtype::kBF16 ? FloatToBf16(values[i]) : FloatToF16(values[i]);
    std::memcpy(bytes.data() + 2 * i, &bits, 2);  // little-endian hosts only, like the reader
  }
  return bytes;
}

Status WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return Status::Error(path.string() + ": cannot write");
  return Status::Ok();
}

Status CheckOptions(const TestModelOptions& o) {
  auto bad = [](const std::string& what) { return Status::Error("test model: " + what); };
  if (o.hidden_size < 1 || o.intermediate_size < 1 || o.num_hidden_layers < 1 ||
      o.num_attention_heads < 1 || o.num_key_value_heads < 1 || o.head_dim < 2 ||
      o.head_dim % 2 != 0) {
    return bad("dimensions must be positive and head_dim even");
  }
  if (o.num_attention_heads % o.num_key_value_heads != 0) {
    return bad("num_key_value_heads must divide num_attention_heads");
  }
  return Status::Ok();
}

}  // namespace

TestModelOptions TestModelOptions::Benchmark() {
  TestModelOptions options;
  options.dtype = Dtype::kBF16;
  options.hidden_size = 768;
  options.intermediate_size = 2048;
  options.num_hidden_layers = 12;
  options.num_attention_heads = 12;
  options.num_key_value_heads = 4;
  options.head_dim = 64;
  options.vocab_size = 32000;
  options.rope_scaling = {models::RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 2048, ""};
  options.max_position_embeddings = 8192;
  return options;
}

TestModelOptions TestModelOptions::Llama32_1B() {
  TestModelOptions options;
  options.dtype = Dtype::kBF16;
  options.hidden_size = 2048;
  options.intermediate_size = 8192;
  options.num_hidden_layers = 16;
  options.num_attention_heads = 32;
  options.num_key_value_heads = 8;
  options.head_dim = 64;
  options.vocab_size = 128256;
  options.tie_word_embeddings = true;
  options.rope_scaling = {models::RopeScalingType::kLlama3, 32.0, 1.0, 4.0, 8192, ""};
  options.max_position_embeddings = 131072;
  return options;
}

Result<models::ModelSpec> TestModelConfig(const TestModelOptions& options) {
  DUET_RETURN_IF_ERROR(CheckOptions(options));
  Result<TokenizerInfo> tokenizer = MakeTokenizer(options.tokenizer_vocab_size);
  if (!tokenizer.ok()) return tokenizer.status();
  DUET_RETURN_IF_ERROR(CheckVocab(options, *tokenizer));
  return ConfigFor(options, *tokenizer);
}

std::vector<TensorSpec> TestModelTensorSpecs(const models::ModelSpec& config, Dtype dtype) {
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t inter = config.intermediate_size;
  std::vector<TensorSpec> specs;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    specs.push_back({std::move(name), dtype, std::move(shape)});
  };
  add("model.embed_tokens.weight", {config.vocab_size, hidden});
  for (int i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {hidden});
    add(p + "self_attn.q_proj.weight", {config.QWidth(), hidden});
    add(p + "self_attn.k_proj.weight", {config.KvWidth(), hidden});
    add(p + "self_attn.v_proj.weight", {config.KvWidth(), hidden});
    add(p + "self_attn.o_proj.weight", {hidden, config.QWidth()});
    if (config.attention_qkv_bias) {
      add(p + "self_attn.q_proj.bias", {config.QWidth()});
      add(p + "self_attn.k_proj.bias", {config.KvWidth()});
      add(p + "self_attn.v_proj.bias", {config.KvWidth()});
    }
    if (config.attention_o_bias) add(p + "self_attn.o_proj.bias", {hidden});
    add(p + "post_attention_layernorm.weight", {hidden});
    add(p + "mlp.gate_proj.weight", {inter, hidden});
    add(p + "mlp.up_proj.weight", {inter, hidden});
    add(p + "mlp.down_proj.weight", {hidden, inter});
  }
  add("model.norm.weight", {hidden});
  if (!config.tie_word_embeddings) add("lm_head.weight", {config.vocab_size, hidden});
  return specs;
}

std::vector<float> TestModelTensorValues(const TestModelOptions& options, const TensorSpec& spec) {
  std::int64_t count = 1;
  for (std::int64_t d : spec.shape) count *= d;
  // The seed mixes the model seed with the name so each tensor has an independent stream.
  NormalStream normal(options.seed * 0x9e3779b97f4a7c15ull ^ HashName(spec.name));
  const bool norm = IsNorm(spec.name);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& v : values) {
    const double z = normal.Next();
    v = static_cast<float>(norm ? 1.0 + options.norm_noise_std * z : options.weight_std * z);
  }
  return values;
}

Status WriteTestModel(const std::string& dir, const TestModelOptions& options) {
  namespace fs = std::filesystem;
  DUET_RETURN_IF_ERROR(CheckOptions(options));
  Result<TokenizerInfo> tokenizer = MakeTokenizer(options.tokenizer_vocab_size);
  if (!tokenizer.ok()) return tokenizer.status();
  DUET_RETURN_IF_ERROR(CheckVocab(options, *tokenizer));
  const models::ModelSpec config = ConfigFor(options, *tokenizer);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::Error(dir + ": cannot create directory: " + ec.message());
  const fs::path root(dir);

  DUET_RETURN_IF_ERROR(
      WriteText(root / "config.json", models::ModelSpecToJson(config).dump(2) + "\n"));
  DUET_RETURN_IF_ERROR(WriteText(root / "tokenizer.json", tokenizer->json_text));
  const json tokenizer_config = {
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"bos_token", kBosToken},
      {"eos_token", kEosToken},
      {"chat_template", kChatTemplate},
      {"model_max_length", config.max_position_embeddings},
      {"clean_up_tokenization_spaces", true},
  };
  DUET_RETURN_IF_ERROR(WriteText(root / "tokenizer_config.json", tokenizer_config.dump(2) + "\n"));
  const json generation_config = {{"bos_token_id", tokenizer->bos_id},
                                  {"eos_token_id", tokenizer->eos_id},
                                  {"do_sample", false}};
  DUET_RETURN_IF_ERROR(
      WriteText(root / "generation_config.json", generation_config.dump(2) + "\n"));

  // transformers refuses safetensors files whose metadata lacks format "pt".
  std::vector<TensorSpec> specs = TestModelTensorSpecs(config, options.dtype);
  Result<SafetensorsWriter> writer =
      SafetensorsWriter::Create((root / "model.safetensors").string(), specs, {{"format", "pt"}});
  if (!writer.ok()) return writer.status();
  for (const TensorSpec& spec : specs) {
    DUET_RETURN_IF_ERROR(writer->Append(Encode(TestModelTensorValues(options, spec), spec.dtype)));
  }
  return writer->Finish();
}

}  // namespace duet::backend
