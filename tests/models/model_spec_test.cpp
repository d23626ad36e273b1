// Tests for the one Hugging Face config.json parser (models::ParseModelSpec) and the GPU spec
// parser: bundled specs and published configs (Llama 3.1/3.2, Qwen2, Mistral) load with their
// numbers, derived sizes (parameters, weight and KV bytes) match hand counts, null means absent
// for every optional field, one set of bounds, each kind of bad input gives an error naming the
// file and the field, what the backend cannot execute is refused by CheckExecutable only, and
// the rotary inverse frequencies including the three bands of Llama 3 scaling.
#include "models/model_spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <set>
#include <string>
#include "common/json_util.h"

namespace duet::models {
namespace {

using nlohmann::json;

ModelSpec LoadModelOrDie(const std::string& path) {
  Result<ModelSpec> spec = LoadModelSpec(path);
  EXPECT_TRUE(spec.ok()) << spec.error();
  return spec.ok() ? *spec : ModelSpec{};
}

HardwareSpec LoadHardwareOrDie(const std::string& path) {
  Result<HardwareSpec> hw = LoadHardwareSpec(path);
  EXPECT_TRUE(hw.ok()) << hw.error();
  return hw.ok() ? *hw : HardwareSpec{};
}

json ReadJsonOrDie(const std::string& path) {
  Result<json> doc = ReadJsonFile(path);
  EXPECT_TRUE(doc.ok()) << doc.error();
  return doc.ok() ? *doc : json::object();
}

ModelSpec ParseOrDie(const json& doc) {
  Result<ModelSpec> spec = ParseModelSpec(doc, "dir/config.json");
  EXPECT_TRUE(spec.ok()) << spec.error();
  return spec.ok() ? *spec : ModelSpec{};
}

// A valid hand-written simulator spec (no model_type) to break one field at a time.
json GoodModelDoc() {
  return json{{"num_hidden_layers", 2},   {"hidden_size", 64},        {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"head_dim", 16},           {"intermediate_size", 128},
              {"vocab_size", 512},        {"torch_dtype", "bfloat16"}};
}

json GoodHardwareDoc() {
  return json{{"name", "x"},
              {"bf16_tflops", 1.0},
              {"hbm_gib", 1.0},
              {"hbm_bandwidth_gbps", 100.0},
              {"nvlink_bandwidth_gbps", 10.0},
              {"pcie_bandwidth_gbps", 5.0}};
}

// Llama 3.1 8B Instruct's config.json (the fields that matter).
json Llama31Config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 128256})");
}

// Qwen2.5 0.5B Instruct's config.json.
json Qwen25Config() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896,
    "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
}

// Mistral 7B Instruct v0.2's config.json.
json MistralConfig() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "vocab_size": 32000})");
}

// Pythia-70M's config.json (GPT-NeoX): not a model type the backend runs.
json GptNeoxConfig() {
  return json::parse(R"({
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
    "hidden_act": "gelu", "hidden_size": 512, "initializer_range": 0.02,
    "intermediate_size": 2048, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "gpt_neox", "num_attention_heads": 8, "num_hidden_layers": 6,
    "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": false,
    "torch_dtype": "float16", "use_cache": true, "use_parallel_residual": true,
    "vocab_size": 50304})");
}

// Expects a parse error naming `where` and every one of `parts`.
void ExpectError(const json& doc, std::initializer_list<std::string> parts,
                 const std::string& where = "dir/config.json") {
  Result<ModelSpec> spec = ParseModelSpec(doc, where);
  ASSERT_FALSE(spec.ok()) << "parsed: " << doc.dump();
  EXPECT_EQ(spec.error().rfind(where + ": ", 0), 0u) << spec.error();
  for (const std::string& part : parts) {
    EXPECT_NE(spec.error().find(part), std::string::npos) << spec.error() << " lacks " << part;
  }
}

// Expects `doc` to parse (the simulator takes it) and CheckExecutable to refuse it, naming the
// file and every one of `parts`.
void ExpectNotExecutable(const json& doc, std::initializer_list<std::string> parts) {
  const ModelSpec spec = ParseOrDie(doc);
  const Status status = CheckExecutable(spec, "dir/config.json");
  ASSERT_FALSE(status.ok()) << doc.dump();
  EXPECT_EQ(status.message().rfind("dir/config.json: ", 0), 0u) << status.message();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << status.message() << " lacks " << part;
  }
}

void ExpectHardwareError(const json& doc, std::initializer_list<std::string> parts) {
  Result<HardwareSpec> hw = ParseHardwareSpec(doc, "hardware/bad.json");
  ASSERT_FALSE(hw.ok());
  EXPECT_NE(hw.error().find("hardware/bad.json"), std::string::npos) << hw.error();
  for (const std::string& part : parts) {
    EXPECT_NE(hw.error().find(part), std::string::npos) << hw.error() << " lacks " << part;
  }
}

// ---- bundled specs and published configs ----

// The Llama-family specs run on the backend; Qwen3 (q/k norms), the mixtures of experts and
// DeepSeek's latent attention are for the simulator only, and the backend says so.
TEST(ModelSpecTest, EveryBundledSpecLoadsAndTheLlamaFamilyRuns) {
  const std::set<std::string> simulated = {"qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                                           "deepseek-v3"};
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("models/specs")) {
    if (entry.path().extension() != ".json") continue;
    Result<ModelSpec> spec = LoadModelSpec(entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.error();
    EXPECT_EQ(spec->name, entry.path().stem().string()) << "name should match the file name";
    const Status runs = CheckExecutable(*spec, entry.path().string());
    if (simulated.count(spec->name)) {
      ASSERT_FALSE(runs.ok()) << entry.path();
      EXPECT_NE(runs.message().find("unsupported architecture"), std::string::npos)
          << runs.message();
    } else {
      EXPECT_TRUE(runs.ok()) << entry.path() << ": " << runs.message();
    }
    ++count;
  }
  EXPECT_GE(count, 9);
}

TEST(ModelSpecTest, EveryBundledHardwareLoads) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("models/hardware")) {
    if (entry.path().extension() != ".json") continue;
    Result<HardwareSpec> hw = LoadHardwareSpec(entry.path().string());
    ASSERT_TRUE(hw.ok()) << hw.error();
    EXPECT_EQ(hw->name, entry.path().stem().string());
    ++count;
  }
  EXPECT_GE(count, 4);
}

TEST(ModelSpecTest, Llama31_8bFields) {
  ModelSpec spec = LoadModelOrDie("models/specs/llama-3.1-8b.json");
  EXPECT_EQ(spec.name, "llama-3.1-8b");
  EXPECT_EQ(spec.num_hidden_layers, 32);
  EXPECT_EQ(spec.hidden_size, 4096);
  EXPECT_EQ(spec.num_attention_heads, 32);
  EXPECT_EQ(spec.num_key_value_heads, 8);
  EXPECT_EQ(spec.head_dim, 128);
  EXPECT_EQ(spec.intermediate_size, 14336);
  EXPECT_EQ(spec.vocab_size, 128256);
  EXPECT_EQ(spec.torch_dtype, Dtype::kBF16);
  EXPECT_FALSE(spec.tie_word_embeddings);
  EXPECT_EQ(spec.BytesPerElement(), 2);
}

TEST(ModelSpecTest, ParsesLlama31) {
  const ModelSpec c = ParseOrDie(Llama31Config());
  EXPECT_EQ(c.name, "dir");  // a config.json is named after its directory
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, Dtype::kBF16);
  EXPECT_FALSE(c.attention_qkv_bias);
  EXPECT_FALSE(c.attention_o_bias);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.ParamCount(), 8030261248);  // Llama 3.1 8B's published parameter count
  EXPECT_TRUE(CheckExecutable(c, "dir/config.json").ok());
}

TEST(ModelSpecTest, ParsesQwen2WithQkvBiasAndTiedEmbeddings) {
  const ModelSpec c = ParseOrDie(Qwen25Config());
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.attention_qkv_bias);
  EXPECT_FALSE(c.attention_o_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window is false
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{151645}));
  EXPECT_EQ(c.ParamCount(), 494032768);  // Qwen2.5-0.5B's published count
  EXPECT_TRUE(CheckExecutable(c, "dir/config.json").ok());
  json windowed = Qwen25Config();
  windowed["use_sliding_window"] = true;
  EXPECT_EQ(ParseOrDie(windowed).sliding_window, 32768);
}

TEST(ModelSpecTest, ParsesMistralWithAndWithoutSlidingWindow) {
  ModelSpec c = ParseOrDie(MistralConfig());
  EXPECT_EQ(c.model_type, "mistral");
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_FALSE(c.attention_qkv_bias);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  json doc = MistralConfig();
  doc["sliding_window"] = 4096;
  c = ParseOrDie(doc);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.ParamCount(), 7241732096);  // Mistral 7B
  EXPECT_TRUE(CheckExecutable(c, "dir/config.json").ok());
}

TEST(ModelSpecTest, ParamCountsMatchPublishedSizes) {
  // Exact hand count for Llama-3.1-8B: 2 * 128256 * 4096 embeddings + lm_head, 32 layers of
  // 218112000, final norm 4096.
  EXPECT_EQ(LoadModelOrDie("models/specs/llama-3.1-8b.json").ParamCount(), 8030261248);
  EXPECT_EQ(LoadModelOrDie("models/specs/llama-3.1-70b.json").ParamCount(), 70553706496);
  // Qwen2.5-7B's published 7,615,616,512 includes its q/k/v biases: 28 * (3584 + 2 * 512).
  ModelSpec qwen = LoadModelOrDie("models/specs/qwen2.5-7b.json");
  EXPECT_EQ(qwen.head_dim, 128) << "defaults to hidden_size / num_attention_heads";
  EXPECT_EQ(qwen.ParamCount(), 7615616512);
  ModelSpec small = LoadModelOrDie("models/specs/llama-3.2-1b.json");
  EXPECT_TRUE(small.tie_word_embeddings);
  EXPECT_EQ(small.ParamCount(), 1235814400);
}

TEST(ModelSpecTest, BiasesAreCounted) {
  json doc = GoodModelDoc();  // hidden 64, q width 64, kv width 32, intermediate 128, 2 layers
  const std::int64_t plain = ParseOrDie(doc).ParamCount();
  doc["attention_bias"] = true;  // q/k/v + o biases: 64 + 32 + 32 + 64 per layer
  EXPECT_EQ(ParseOrDie(doc).ParamCount(), plain + 2 * 192);
  doc["mlp_bias"] = true;  // gate/up 128 each + down 64 per layer
  EXPECT_EQ(ParseOrDie(doc).ParamCount(), plain + 2 * 192 + 2 * 320);
  doc = GoodModelDoc();
  doc["model_type"] = "qwen2";  // q/k/v always; attention_bias and mlp_bias do not apply
  doc["attention_bias"] = true;
  doc["mlp_bias"] = true;
  EXPECT_EQ(ParseOrDie(doc).ParamCount(), plain + 2 * 128);
  doc["model_type"] = "mistral";  // none
  EXPECT_EQ(ParseOrDie(doc).ParamCount(), plain);
}

TEST(ModelSpecTest, WeightAndKvBytes) {
  ModelSpec spec = LoadModelOrDie("models/specs/llama-3.1-8b.json");
  EXPECT_EQ(spec.WeightBytes(), 2 * spec.ParamCount());
  EXPECT_EQ(spec.KvBytesPerToken(), 2 * 32 * 8 * 128 * 2);  // 131072
  EXPECT_EQ(LoadModelOrDie("models/specs/llama-3.1-70b.json").KvBytesPerToken(), 327680);
  EXPECT_EQ(LoadModelOrDie("models/specs/llama-3.2-1b.json").KvBytesPerToken(), 32768);
  EXPECT_EQ(LoadModelOrDie("models/specs/qwen2.5-7b.json").KvBytesPerToken(), 57344);

  ModelSpec tiny = LoadModelOrDie("models/specs/tiny-test.json");
  EXPECT_EQ(tiny.KvBytesPerToken(), 256);
  EXPECT_EQ(tiny.WeightBytes(), 279168);
}

TEST(ModelSpecTest, KvBytesFollowTheCacheDtype) {
  ModelSpec spec = LoadModelOrDie("models/specs/llama-3.1-8b.json");
  EXPECT_EQ(spec.AutoKvCacheDtype(), Dtype::kBF16);
  EXPECT_EQ(spec.KvBytesPerToken(Dtype::kBF16), 131072);
  EXPECT_EQ(spec.KvBytesPerToken(Dtype::kF16), 131072);
  EXPECT_EQ(spec.KvBytesPerToken(Dtype::kF32), 262144);  // the CPU backend's cache
  spec.torch_dtype = Dtype::kF32;
  EXPECT_EQ(spec.AutoKvCacheDtype(), Dtype::kF32);
  EXPECT_EQ(spec.KvBytesPerToken(), 262144);
  EXPECT_EQ(spec.KvBytesPerToken(Dtype::kBF16), 131072);
  spec.torch_dtype.reset();  // absent: bf16, as the simulator always assumed
  EXPECT_EQ(spec.KvBytesPerToken(), 131072);
}

TEST(ModelSpecTest, Float32DoublesBytes) {
  json doc = GoodModelDoc();
  doc["torch_dtype"] = "float32";
  Result<ModelSpec> spec = ParseModelSpec(doc, "specs/f32.json");
  ASSERT_TRUE(spec.ok()) << spec.error();
  EXPECT_EQ(spec->BytesPerElement(), 4);
  EXPECT_EQ(spec->KvBytesPerToken(), 512);
  EXPECT_EQ(spec->WeightBytes(), 4 * spec->ParamCount());
  doc.erase("torch_dtype");
  doc["dtype"] = "float16";  // newer transformers' spelling
  EXPECT_EQ(ParseOrDie(doc).torch_dtype, Dtype::kF16);
}

TEST(ModelSpecTest, DefaultsForOptionalFields) {
  json doc = GoodModelDoc();
  doc.erase("num_key_value_heads");
  doc.erase("head_dim");
  doc.erase("torch_dtype");
  Result<ModelSpec> spec = ParseModelSpec(doc, "some/dir/my-model.json");
  ASSERT_TRUE(spec.ok()) << spec.error();
  EXPECT_EQ(spec->name, "my-model");
  EXPECT_EQ(spec->model_type, "");
  EXPECT_EQ(spec->num_key_value_heads, 4);
  EXPECT_EQ(spec->head_dim, 16);
  EXPECT_FALSE(spec->torch_dtype.has_value());
  EXPECT_EQ(spec->BytesPerElement(), 2);
  EXPECT_FALSE(spec->tie_word_embeddings);
}

TEST(ModelSpecTest, AppliesHuggingFaceDefaults) {
  const ModelSpec c = ParseOrDie(json{{"model_type", "llama"},
                                      {"hidden_size", 64},
                                      {"intermediate_size", 128},
                                      {"num_hidden_layers", 2},
                                      {"num_attention_heads", 4},
                                      {"vocab_size", 100},
                                      {"head_dim", nullptr},
                                      {"rope_scaling", nullptr}});
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_FALSE(c.torch_dtype.has_value());
  EXPECT_EQ(c.hidden_act, "silu");
}

TEST(ModelSpecTest, NullMeansAbsentForEveryOptionalField) {
  // Each optional field set to null parses exactly as if it were not there.
  json base = Llama31Config();
  base["use_sliding_window"] = false;
  base["partial_rotary_factor"] = 1.0;
  for (const char* key :
       {"name", "architectures", "model_type", "num_key_value_heads", "head_dim", "rms_norm_eps",
        "rope_theta", "rope_scaling", "partial_rotary_factor", "max_position_embeddings",
        "torch_dtype", "tie_word_embeddings", "hidden_act", "attention_bias", "mlp_bias",
        "bos_token_id", "eos_token_id", "sliding_window", "use_sliding_window"}) {
    for (const json& config : {base, Qwen25Config(), MistralConfig()}) {
      json without = config, with_null = config;
      without.erase(key);
      with_null[key] = nullptr;
      const ModelSpec a = ParseOrDie(without);
      const ModelSpec b = ParseOrDie(with_null);
      EXPECT_EQ(ModelSpecToJson(a), ModelSpecToJson(b)) << key;
      EXPECT_EQ(a.name, b.name) << key;
    }
  }
  // "dtype" too, and rope_scaling's own fields.
  json doc = GoodModelDoc();
  doc.erase("torch_dtype");
  doc["dtype"] = nullptr;
  EXPECT_FALSE(ParseOrDie(doc).torch_dtype.has_value());
  doc = Llama31Config();
  doc["rope_scaling"]["type"] = nullptr;  // rope_type is used
  EXPECT_EQ(ParseOrDie(doc).rope_scaling.type, RopeScalingType::kLlama3);
  doc["rope_scaling"]["original_max_position_embeddings"] = nullptr;
  ExpectError(doc, {"rope_scaling", "original_max_position_embeddings", "missing"});
  // A required field that is null is missing.
  doc = GoodModelDoc();
  doc["hidden_size"] = nullptr;
  ExpectError(doc, {"field 'hidden_size' is missing"});
}

TEST(ModelSpecTest, LlamaAttentionBiasCoversQkvAndO) {
  json doc = Llama31Config();
  doc["attention_bias"] = true;
  const ModelSpec c = ParseOrDie(doc);
  EXPECT_TRUE(c.attention_qkv_bias);
  EXPECT_TRUE(c.attention_o_bias);
}

TEST(ModelSpecTest, RoundTripsThroughJson) {
  json llama_bias = Llama31Config();
  llama_bias["attention_bias"] = true;
  json linear = Llama31Config();
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  json yarn = Llama31Config();
  yarn["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  json qwen_window = Qwen25Config();
  qwen_window["use_sliding_window"] = true;
  json mistral_window = MistralConfig();
  mistral_window["sliding_window"] = 4096;
  json fp8 = GoodModelDoc();
  fp8["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {32, 16}}};
  json sparse_qwen = ReadJsonOrDie("models/specs/qwen3-30b-a3b.json");
  sparse_qwen["decoder_sparse_step"] = 3;
  std::vector<json> docs = {Llama31Config(),
                            Qwen25Config(),
                            MistralConfig(),
                            GptNeoxConfig(),
                            GoodModelDoc(),
                            llama_bias,
                            linear,
                            yarn,
                            qwen_window,
                            mistral_window,
                            fp8,
                            sparse_qwen};
  for (const char* name : {"qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"}) {
    docs.push_back(ReadJsonOrDie(std::string("models/specs/") + name + ".json"));
  }
  for (const json& doc : docs) {
    const ModelSpec a = ParseOrDie(doc);
    const ModelSpec b = ParseOrDie(ModelSpecToJson(a));
    EXPECT_EQ(ModelSpecToJson(a), ModelSpecToJson(b));
    EXPECT_FALSE(ModelSpecToJson(a).contains("name")) << "not a config.json field";
    EXPECT_EQ(a.ParamCount(), b.ParamCount());
    EXPECT_EQ(a.ActiveParamCount(), b.ActiveParamCount());
    EXPECT_EQ(a.WeightBytes(), b.WeightBytes());
    EXPECT_EQ(a.KvBytesPerToken(), b.KvBytesPerToken());
    EXPECT_EQ(a.DenseLayers(), b.DenseLayers());
    EXPECT_EQ(a.qk_norm, b.qk_norm);
    EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
    EXPECT_EQ(a.attention_qkv_bias, b.attention_qkv_bias);
    EXPECT_EQ(a.sliding_window, b.sliding_window);
    EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
    EXPECT_EQ(a.rope_scaling.unsupported_type, b.rope_scaling.unsupported_type);
  }
}

// ---- what the simulator takes and the backend refuses ----

TEST(ModelSpecTest, UnsupportedArchitecturesParseButDoNotExecute) {
  // GPT-NeoX: the simulator sizes it as a Llama-shaped decoder; the backend refuses it.
  const ModelSpec neox = ParseOrDie(GptNeoxConfig());
  EXPECT_EQ(neox.model_type, "gpt_neox");
  EXPECT_EQ(neox.num_key_value_heads, 8);
  EXPECT_EQ(neox.torch_dtype, Dtype::kF16);
  ExpectNotExecutable(GptNeoxConfig(),
                      {"unsupported architecture", "GPTNeoXForCausalLM", "gpt_neox",
                       "LlamaForCausalLM (llama)", "Qwen2ForCausalLM (qwen2)", "mistral"});
  json doc = GptNeoxConfig();
  doc.erase("architectures");
  ExpectNotExecutable(doc, {"unsupported architecture", "gpt_neox", "LlamaForCausalLM"});
  doc = Llama31Config();
  doc["architectures"] = {"LlamaForSequenceClassification"};
  ExpectNotExecutable(doc, {"unsupported architecture", "LlamaForSequenceClassification"});
  // A hand-written simulator spec names no architecture at all.
  ExpectNotExecutable(GoodModelDoc(), {"model_type", "missing", "architectures"});
  // Contradicting names are malformed for both worlds.
  doc = Llama31Config();
  doc["model_type"] = "qwen2";
  ExpectError(doc, {"model_type", "contradicts"});
}

TEST(ModelSpecTest, UnsupportedSwitchesParseButDoNotExecute) {
  auto with = [](const std::string& key, json value) {
    json doc = Llama31Config();
    doc[key] = std::move(value);
    return doc;
  };
  ExpectNotExecutable(with("hidden_act", "gelu"), {"hidden_act", "silu", "gelu"});
  ExpectNotExecutable(with("mlp_bias", true), {"mlp_bias"});
  ExpectNotExecutable(with("partial_rotary_factor", 0.5), {"partial_rotary_factor"});
  ExpectNotExecutable(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}),
                      {"unsupported rope_scaling type", "yarn"});
  ExpectNotExecutable(with("rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}),
                      {"unsupported rope_scaling type", "dynamic"});
  EXPECT_EQ(ParseOrDie(with("rope_scaling", {{"rope_type", "yarn"}})).rope_scaling.type,
            RopeScalingType::kUnsupported);
}

TEST(ModelSpecTest, ExpertsOfOtherFamiliesAreRefused) {
  json doc = MistralConfig();  // a family whose config has no experts: one dense MLP is wrong
  doc["num_local_experts"] = 8;
  ExpectError(doc, {"field 'num_local_experts'", "mixture-of-experts", "'mistral'", "qwen3_moe"});
  doc.erase("num_local_experts");
  doc["model_type"] = "qwen2_moe";  // shared-expert widths of its own, not described
  doc["architectures"] = {"Qwen2MoeForCausalLM"};
  doc["num_experts"] = 60;
  ExpectError(doc, {"field 'num_experts'", "mixture-of-experts", "'qwen2_moe'"});
  doc["num_experts"] = 1;  // one expert is a dense MLP
  EXPECT_TRUE(ParseModelSpec(doc, "x.json").ok());
}

// Hand counts, each matching the published size: Qwen3-32B 32.8B; Qwen3-30B-A3B 30.5B with
// 3.3B active; Qwen3-235B-A22B 235B with 22B active; DeepSeek-V3 671B with 37B active (its
// 14B multi-token-prediction layer is not counted).
TEST(ModelSpecTest, MixturesOfExpertsAndLatentAttentionMatchPublishedSizes) {
  // Qwen3-32B: 2 * 151936 * 5120 embeddings + head; 64 layers of q 5120*8192, k and v
  // 5120*1024 each, o 8192*5120, q/k norms 2*128, MLP 3*5120*25600, two norms 2*5120; final norm.
  const ModelSpec dense = LoadModelOrDie("models/specs/qwen3-32b.json");
  EXPECT_TRUE(dense.qk_norm);
  EXPECT_FALSE(dense.moe);
  EXPECT_EQ(dense.ParamCount(),
            2LL * 151936 * 5120 +
                64LL * (2 * 5120 * 8192 + 2 * 5120 * 1024 + 256 + 3LL * 5120 * 25600 + 2 * 5120) +
                5120);  // 32762123264
  EXPECT_EQ(dense.ActiveParamCount(), dense.ParamCount());
  EXPECT_EQ(dense.KvBytesPerToken(), 2 * 64 * 8 * 128 * 2);  // GQA: K and V of 8 heads

  // Qwen3-MoE: per layer attention (q, o: h*H*128; k, v: h*kv*128; q/k norms), 128 experts of
  // 3*h*I_e, the router h*128, two norms.
  auto qwen_moe = [](std::int64_t h, std::int64_t heads, std::int64_t kv, std::int64_t ie,
                     std::int64_t layers, std::int64_t experts_used) {
    const std::int64_t attention = 2 * h * heads * 128 + 2 * h * kv * 128 + 256;
    return 2 * 151936 * h + layers * (attention + experts_used * 3 * h * ie + h * 128 + 2 * h) + h;
  };
  const ModelSpec small = LoadModelOrDie("models/specs/qwen3-30b-a3b.json");
  ASSERT_TRUE(small.moe);
  EXPECT_EQ(small.moe->experts, 128);
  EXPECT_EQ(small.moe->experts_per_token, 8);
  EXPECT_EQ(small.moe->moe_layers, 48);
  EXPECT_EQ(small.DenseLayers(), 0);
  EXPECT_EQ(small.ParamCount(), qwen_moe(2048, 32, 4, 768, 48, 128));      // 30532122624
  EXPECT_EQ(small.ActiveParamCount(), qwen_moe(2048, 32, 4, 768, 48, 8));  // 3353032704
  EXPECT_EQ(small.KvBytesPerToken(), 2 * 48 * 4 * 128 * 2);                // 98304
  const ModelSpec large = LoadModelOrDie("models/specs/qwen3-235b-a22b.json");
  EXPECT_EQ(large.ParamCount(), qwen_moe(4096, 64, 4, 1536, 94, 128));      // 235093634560
  EXPECT_EQ(large.ActiveParamCount(), qwen_moe(4096, 64, 4, 1536, 94, 8));  // 22190763520
  EXPECT_EQ(large.KvBytesPerToken(), 2 * 94 * 4 * 128 * 2);                 // 192512
  EXPECT_EQ(large.WeightBytes(), 2 * large.ParamCount());

  // DeepSeek-V3: per layer MLA (q_a 7168*1536 and its norm 1536, q_b 1536*128*192, kv_a
  // 7168*576 and its norm 512, kv_b 512*128*256, o 128*128*7168); 3 dense layers with an MLP
  // of 18432; 58 MoE layers of 256 experts and 1 shared one of 3*7168*2048, a router
  // 7168*256 and its 256 score biases; two norms per layer; final norm.
  const ModelSpec ds = LoadModelOrDie("models/specs/deepseek-v3.json");
  ASSERT_TRUE(ds.moe && ds.mla && ds.fp8);
  EXPECT_EQ(ds.DenseLayers(), 3);
  EXPECT_EQ(ds.moe->shared_experts, 1);
  EXPECT_TRUE(ds.moe->router_bias);
  EXPECT_EQ(ds.head_dim, 192);
  const std::int64_t mla = 7168LL * 1536 + 1536 + 1536LL * 128 * 192 + 7168LL * 576 + 512 +
                           512LL * 128 * 256 + 128LL * 128 * 7168;
  const std::int64_t expert = 3LL * 7168 * 2048;
  auto deepseek = [&](std::int64_t experts_used) {
    return 2LL * 129280 * 7168 + 61 * (mla + 2 * 7168) + 3 * (3LL * 7168 * 18432) +
           58 * ((experts_used + 1) * expert + 7168LL * 256 + 256) + 7168;
  };
  EXPECT_EQ(ds.ParamCount(), deepseek(256));      // 671026419200
  EXPECT_EQ(ds.ActiveParamCount(), deepseek(8));  // 37552297472
  // The latent and the rotary key, not K and V per head: 61 * (512 + 64) * 2 bytes.
  EXPECT_EQ(ds.KvBytesPerToken(), 61 * 576 * 2);
  EXPECT_EQ(ds.KvBytesPerToken(Dtype::kF32), 61 * 576 * 4);
  // FP8: one byte per linear weight plus a float scale per 128x128 block; embeddings, head,
  // norms and routers in bf16. Computed the same way in Python from the config: 673150582112.
  EXPECT_EQ(ds.WeightBytes(), 673150582112);
  const WeightBreakdown w = ds.Weights();
  EXPECT_EQ(w.routed_experts.params, 58 * 256 * expert);
  EXPECT_EQ(w.routed_experts.bytes,
            58 * 256 * (expert + 4 * 3 * (2048 / 128) * (7168 / 128)));  // scales of 3 matrices
  EXPECT_EQ(w.embedding.bytes, 2LL * 129280 * 7168);
  EXPECT_EQ(w.Total().params, ds.ParamCount());
  EXPECT_EQ(w.NonExpert().params + w.routed_experts.params, ds.ParamCount());
}

// Mixtral 8x7B's config.json: experts as wide as intermediate_size, every layer MoE, 46.7B.
TEST(ModelSpecTest, ParsesMixtral) {
  json doc = MistralConfig();
  doc["model_type"] = "mixtral";
  doc["architectures"] = {"MixtralForCausalLM"};
  doc["num_local_experts"] = 8;
  doc["num_experts_per_tok"] = 2;
  const ModelSpec spec = ParseOrDie(doc);
  ASSERT_TRUE(spec.moe);
  EXPECT_EQ(spec.moe->expert_intermediate, 14336);
  EXPECT_EQ(spec.DenseLayers(), 0);
  const std::int64_t attention = 2LL * 4096 * 4096 + 2LL * 4096 * 1024;
  auto count = [&](std::int64_t experts) {
    return 2LL * 32000 * 4096 +
           32 * (attention + experts * 3LL * 4096 * 14336 + 4096 * 8 + 2 * 4096) + 4096;
  };
  EXPECT_EQ(spec.ParamCount(), count(8));  // 46702792704
  EXPECT_EQ(spec.ActiveParamCount(), count(2));
  doc["num_experts_per_tok"] = 9;
  ExpectError(doc, {"num_experts_per_tok", "between 1 and 8"});
}

TEST(ModelSpecTest, FamilyFieldsChooseTheMoeLayers) {
  json qwen = ReadJsonOrDie("models/specs/qwen3-30b-a3b.json");
  qwen["decoder_sparse_step"] = 2;  // layers 1, 3, 5, ... of 48
  qwen["mlp_only_layers"] = {1, 2};
  ModelSpec spec = ParseOrDie(qwen);
  EXPECT_EQ(spec.moe->moe_layers, 23);
  EXPECT_EQ(spec.DenseLayers(), 25);
  // The dense layers have an MLP of intermediate_size.
  EXPECT_EQ(spec.Weights().dense_mlp.params, 25LL * 3 * 2048 * 6144);
  qwen["mlp_only_layers"] = {48};
  ExpectError(qwen, {"mlp_only_layers", "[0, 48)"});
  qwen["mlp_only_layers"] = "all";
  ExpectError(qwen, {"mlp_only_layers", "list"});

  json ds = ReadJsonOrDie("models/specs/deepseek-v3.json");
  ds["first_k_dense_replace"] = 1;
  ds["moe_layer_freq"] = 2;  // layers 2, 4, ..., 60
  EXPECT_EQ(ParseOrDie(ds).moe->moe_layers, 30);
  ds["first_k_dense_replace"] = 62;
  ExpectError(ds, {"first_k_dense_replace", "between 0 and 61"});
  ds["first_k_dense_replace"] = 3;
  ds.erase("moe_intermediate_size");
  ExpectError(ds, {"moe_intermediate_size", "missing"});
}

TEST(ModelSpecTest, LatentAttentionFields) {
  json doc = ReadJsonOrDie("models/specs/deepseek-v3.json");
  // DeepSeek-V2-Lite projects queries directly: q_proj hidden -> heads * 192.
  doc["q_lora_rank"] = nullptr;
  const ModelSpec direct = ParseOrDie(doc);
  EXPECT_EQ(direct.mla->q_lora_rank, 0);
  const ModelSpec v3 = LoadModelOrDie("models/specs/deepseek-v3.json");
  EXPECT_EQ(v3.Weights().attention.params - direct.Weights().attention.params,
            61 * (7168LL * 1536 + 1536 + 1536LL * 128 * 192 - 7168LL * 128 * 192));
  doc["qk_rope_head_dim"] = 63;
  ExpectError(doc, {"qk_rope_head_dim", "even"});
  doc["qk_rope_head_dim"] = 64;
  doc.erase("kv_lora_rank");
  ExpectError(doc, {"kv_lora_rank", "missing"});
  doc["kv_lora_rank"] = 512;
  doc["attention_bias"] = true;
  ExpectError(doc, {"attention_bias", "latent attention"});
}

TEST(ModelSpecTest, Fp8WeightsAndTheirScales) {
  json doc = GoodModelDoc();  // hidden 64, q 64, kv 32, intermediate 128, 2 layers, vocab 512
  const ModelSpec plain = ParseOrDie(doc);
  doc["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {32, 32}}};
  const ModelSpec fp8 = ParseOrDie(doc);
  EXPECT_EQ(fp8.ParamCount(), plain.ParamCount());
  // Linear weights: 1 byte each plus a 4-byte scale per 32x32 block: q 64x64 (4 blocks), k and
  // v 32x64 (2 each), o (4), gate and up 128x64 (8 each), down (8): 36 blocks a layer.
  const std::int64_t linear = 2 * (64 * 64 * 2 + 32 * 64 * 2 + 3 * 64 * 128);
  const std::int64_t scales = 2 * 36 * 4;
  EXPECT_EQ(fp8.WeightBytes(), plain.WeightBytes() - 2 * linear + linear + scales);
  doc["quantization_config"] = {{"quant_method", "fp8"}};  // one scale per matrix: 7 a layer
  EXPECT_EQ(ParseOrDie(doc).WeightBytes(), plain.WeightBytes() - linear + 2 * 7 * 4);
  EXPECT_FALSE(CheckExecutable(ParseOrDie(doc), "x.json").ok());
  doc["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  ExpectError(doc, {"quantization_config", "quant_method", "'gptq'", "not supported"});
  doc["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128}}};
  ExpectError(doc, {"weight_block_size", "[rows, columns]"});
  doc["quantization_config"] = "fp8";
  ExpectError(doc, {"quantization_config", "object"});
  doc["quantization_config"] = nullptr;
  EXPECT_EQ(ParseOrDie(doc).WeightBytes(), plain.WeightBytes());
}

TEST(ModelSpecTest, ExpertsBeyondAnyModelAreRefused) {
  json doc = ReadJsonOrDie("models/specs/qwen3-30b-a3b.json");
  doc["num_experts"] = 4096;
  doc["moe_intermediate_size"] = 1 << 20;
  doc["hidden_size"] = 1 << 20;
  ExpectError(doc, {"parameters", "more than"});
  doc["num_experts"] = 4097;
  ExpectError(doc, {"num_experts", "between 2 and 4096"});
}

TEST(ModelSpecTest, RopeScalingTypes) {
  json doc = Llama31Config();
  doc["rope_scaling"] = {{"factor", 2.0}};
  ExpectError(doc, {"rope_scaling", "rope_type", "missing"});
  doc["rope_scaling"] = {{"rope_type", 7}};
  ExpectError(doc, {"rope_scaling", "rope_type", "string"});
  doc["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}};
  ExpectError(doc, {"original_max_position_embeddings", "missing"});
  doc["rope_scaling"]["original_max_position_embeddings"] = 8192;
  doc["rope_scaling"]["high_freq_factor"] = 1.0;
  ExpectError(doc, {"low_freq_factor", "below high_freq_factor"});
  doc["rope_scaling"] = {{"rope_type", "linear"}};
  ExpectError(doc, {"rope_scaling", "factor", "missing"});
  doc["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(ParseOrDie(doc).rope_scaling.type, RopeScalingType::kLinear);
  doc["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(ParseOrDie(doc).rope_scaling.type, RopeScalingType::kNone);
}

// ---- bad input: errors name the file and the field ----

TEST(ModelSpecTest, RejectsBadFieldsNamingThem) {
  auto with = [](const std::string& key, json value) {
    json doc = Llama31Config();
    doc[key] = std::move(value);
    return doc;
  };
  auto without = [](const std::string& key) {
    json doc = Llama31Config();
    doc.erase(key);
    return doc;
  };
  ExpectError(without("hidden_size"), {"field 'hidden_size' is missing"});
  ExpectError(without("vocab_size"), {"field 'vocab_size' is missing"});
  ExpectError(without("num_hidden_layers"), {"field 'num_hidden_layers' is missing"});
  ExpectError(without("num_attention_heads"), {"field 'num_attention_heads' is missing"});
  ExpectError(without("intermediate_size"), {"field 'intermediate_size' is missing"});
  ExpectError(with("hidden_size", -4096), {"field 'hidden_size'", "between 1 and", "-4096"});
  ExpectError(with("hidden_size", "4096"), {"field 'hidden_size'", "integer"});
  ExpectError(with("hidden_size", 64.5), {"field 'hidden_size'", "integer"});
  ExpectError(with("num_hidden_layers", 0), {"field 'num_hidden_layers'"});
  ExpectError(with("num_hidden_layers", "32"), {"field 'num_hidden_layers'", "integer"});
  ExpectError(with("intermediate_size", -5), {"field 'intermediate_size'", "between 1 and", "-5"});
  ExpectError(with("vocab_size", 0), {"field 'vocab_size'"});
  ExpectError(with("num_key_value_heads", 5), {"field 'num_key_value_heads'", "(5)", "divide"});
  ExpectError(with("head_dim", 33), {"field 'head_dim'", "even"});
  ExpectError(with("head_dim", 0), {"field 'head_dim'", "between 1 and"});
  ExpectError(with("rms_norm_eps", 0), {"field 'rms_norm_eps'"});
  ExpectError(with("rms_norm_eps", 2.0), {"field 'rms_norm_eps'"});
  ExpectError(with("rope_theta", -1.0), {"field 'rope_theta'"});
  ExpectError(with("rope_theta", 0.5), {"field 'rope_theta'", "at least 1"});
  ExpectError(with("vocab_size", 1e30), {"field 'vocab_size'"});
  ExpectError(with("hidden_size", json::parse("18446744073709551615")), {"field 'hidden_size'"});
  ExpectError(with("torch_dtype", "float64"),
              {"field 'torch_dtype'", "float64", "bfloat16, float16, float32"});
  ExpectError(with("torch_dtype", "float8"),
              {"field 'torch_dtype'", "float8", "bfloat16, float16, float32"});
  json dtype_only = without("torch_dtype");
  dtype_only["dtype"] = 16;
  ExpectError(dtype_only, {"field 'dtype'"});
  ExpectError(with("tie_word_embeddings", "no"), {"field 'tie_word_embeddings'"});
  ExpectError(with("attention_bias", 1), {"field 'attention_bias'"});
  ExpectError(with("hidden_act", 3), {"field 'hidden_act'", "string"});
  ExpectError(with("partial_rotary_factor", 0), {"field 'partial_rotary_factor'"});
  ExpectError(with("max_position_embeddings", 0), {"field 'max_position_embeddings'"});
  ExpectError(with("eos_token_id", json::array({128001, "x"})), {"field 'eos_token_id'"});
  ExpectError(with("eos_token_id", -1), {"field 'eos_token_id'", "vocab_size"});
  ExpectError(with("bos_token_id", 128256), {"field 'bos_token_id'", "vocab_size"});
  ExpectError(with("architectures", json::array()), {"field 'architectures'"});
  ExpectError(with("architectures", "LlamaForCausalLM"), {"field 'architectures'"});
  ExpectError(with("model_type", 1), {"field 'model_type'", "string"});
  ExpectError(with("rope_scaling", 8), {"field 'rope_scaling'"});
  ExpectError(with("name", 7), {"field 'name'", "string"});
  ExpectError(with("name", ""), {"field 'name'", "empty"});
  ExpectError(with("hidden_size", json::parse("[[[[[[[[1]]]]]]]]")), {"hidden_size", "array"});
  json qwen = Qwen25Config();
  qwen["use_sliding_window"] = true;
  qwen.erase("sliding_window");
  ExpectError(qwen, {"field 'sliding_window' is missing"});
  qwen["use_sliding_window"] = "yes";
  ExpectError(qwen, {"field 'use_sliding_window'"});
  json mistral = MistralConfig();
  mistral["sliding_window"] = 0;
  ExpectError(mistral, {"field 'sliding_window'"});
  ExpectError(json::array({1, 2}), {"object"});
}

TEST(ModelSpecTest, OneSetOfBounds) {
  // Each dimension accepts its documented maximum and refuses one more, naming the bound.
  struct Bound {
    const char* key;
    std::int64_t max;
  };
  for (const Bound& b : {Bound{"num_hidden_layers", 4096}, Bound{"hidden_size", 1 << 20},
                         Bound{"intermediate_size", 1 << 20}, Bound{"vocab_size", 1 << 24}}) {
    json doc = GoodModelDoc();
    doc[b.key] = b.max;
    EXPECT_TRUE(ParseModelSpec(doc, "x.json").ok()) << b.key;
    doc[b.key] = b.max + 1;
    ExpectError(doc, {std::string("field '") + b.key + "'", std::to_string(b.max)});
  }
  json doc = GoodModelDoc();
  doc["num_attention_heads"] = 1 << 14;
  doc["num_key_value_heads"] = 1;
  doc["head_dim"] = 64;  // 2^20 wide: the limit
  EXPECT_TRUE(ParseModelSpec(doc, "x.json").ok());
  doc["head_dim"] = 128;
  ExpectError(doc, {"field 'head_dim'", "1048576", "16384 * 128"});
  doc["num_attention_heads"] = (1 << 14) + 1;
  ExpectError(doc, {"field 'num_attention_heads'", "16384"});
  doc = GoodModelDoc();
  doc["num_key_value_heads"] = (1 << 14) + 1;
  ExpectError(doc, {"field 'num_key_value_heads'", "16384"});
  doc = Llama31Config();
  doc["max_position_embeddings"] = std::int64_t(1) << 40;
  EXPECT_TRUE(ParseModelSpec(doc, "x.json").ok());
  doc["max_position_embeddings"] = (std::int64_t(1) << 40) + 1;
  ExpectError(doc, {"field 'max_position_embeddings'"});
  doc = Llama31Config();
  doc["rope_scaling"]["factor"] = 1e7;
  ExpectError(doc, {"rope_scaling", "field 'factor'"});
}

TEST(ModelSpecTest, HeadDimDefaultNeedsEvenSplit) {
  json doc = GoodModelDoc();
  doc.erase("head_dim");
  doc["hidden_size"] = 66;
  ExpectError(doc, {"field 'head_dim'", "missing"});
}

TEST(ModelSpecTest, UnknownKeysAreIgnored) {
  json doc = GoodModelDoc();
  doc["initializer_range"] = 0.02;
  doc["quirk"] = {{"a", 1}};
  doc["architectures"] = json::array({"LlamaForCausalLM"});
  EXPECT_TRUE(ParseModelSpec(doc, "x.json").ok());
}

// Writes `text` to a fresh temporary file and returns its path.
std::string WriteTemp(const std::string& file_name, const std::string& text) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "duet_models_test";
  std::filesystem::create_directories(dir / std::filesystem::path(file_name).parent_path());
  std::filesystem::path path = dir / file_name;
  std::ofstream(path) << text;
  return path.string();
}

TEST(ModelSpecTest, BrokenJsonFileNamesPath) {
  std::string path = WriteTemp("broken-model.json", "{\"hidden_size\": 64,");
  Result<ModelSpec> spec = LoadModelSpec(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().find(path), std::string::npos) << spec.error();
  EXPECT_NE(spec.error().find("invalid JSON"), std::string::npos) << spec.error();

  Result<HardwareSpec> hw = LoadHardwareSpec(path);
  ASSERT_FALSE(hw.ok());
  EXPECT_NE(hw.error().find(path), std::string::npos) << hw.error();
}

TEST(ModelSpecTest, MissingFileNamesPath) {
  Result<ModelSpec> spec = LoadModelSpec("models/specs/no-such-model.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().find("models/specs/no-such-model.json"), std::string::npos);
  spec = LoadModelSpec("/nonexistent/config.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().find("/nonexistent/config.json"), std::string::npos);
}

TEST(ModelSpecTest, FieldErrorFromFileNamesPath) {
  json doc = GoodModelDoc();
  doc["num_key_value_heads"] = 3;
  std::string path = WriteTemp("bad-heads.json", doc.dump());
  Result<ModelSpec> spec = LoadModelSpec(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().find(path + ": field 'num_key_value_heads'"), std::string::npos)
      << spec.error();
}

TEST(ModelSpecTest, LoadsAModelDirectoryNamedAfterIt) {
  const std::string path = WriteTemp("Llama-3.1-8B-Instruct/config.json", Llama31Config().dump());
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const ModelSpec from_dir = LoadModelOrDie(dir);
  EXPECT_EQ(from_dir.name, "Llama-3.1-8B-Instruct");
  EXPECT_EQ(from_dir.ParamCount(), 8030261248);
  EXPECT_EQ(LoadModelOrDie(path).name, "Llama-3.1-8B-Instruct");
  json named = Llama31Config();
  named["name"] = "mine";
  EXPECT_EQ(ParseOrDie(named).name, "mine");
  // A directory without config.json names the file it looked for.
  const std::string empty = WriteTemp("empty-model/README", "");
  Result<ModelSpec> missing = LoadModelSpec(std::filesystem::path(empty).parent_path().string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("empty-model/config.json"), std::string::npos) << missing.error();
}

// ---- GPU specs ----

TEST(HardwareSpecTest, H100Numbers) {
  HardwareSpec hw = LoadHardwareOrDie("models/hardware/h100-sxm.json");
  EXPECT_EQ(hw.name, "h100-sxm");
  EXPECT_DOUBLE_EQ(hw.bf16_flops, 989e12);
  EXPECT_EQ(hw.hbm_bytes, 80LL * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(hw.hbm_bw, 3350e9);
  EXPECT_DOUBLE_EQ(hw.nvlink_bw, 450e9);
  EXPECT_DOUBLE_EQ(hw.pcie_bw, 64e9);
}

TEST(HardwareSpecTest, OtherBundledNumbers) {
  HardwareSpec h200 = LoadHardwareOrDie("models/hardware/h200.json");
  EXPECT_DOUBLE_EQ(h200.hbm_bw, 4800e9);
  EXPECT_GT(h200.hbm_bytes, 140e9);
  HardwareSpec a100 = LoadHardwareOrDie("models/hardware/a100-80gb.json");
  EXPECT_DOUBLE_EQ(a100.bf16_flops, 312e12);
  EXPECT_DOUBLE_EQ(a100.hbm_bw, 2039e9);
  EXPECT_DOUBLE_EQ(a100.nvlink_bw, 300e9);
  HardwareSpec tiny = LoadHardwareOrDie("models/hardware/tiny-gpu.json");
  EXPECT_EQ(tiny.hbm_bytes, 1LL << 30);
}

TEST(HardwareSpecTest, MissingField) {
  json doc = GoodHardwareDoc();
  doc.erase("hbm_bandwidth_gbps");
  ExpectHardwareError(doc, {"field 'hbm_bandwidth_gbps' is missing"});
  doc = GoodHardwareDoc();
  doc["hbm_gib"] = nullptr;
  ExpectHardwareError(doc, {"field 'hbm_gib' is missing"});
}

TEST(HardwareSpecTest, WrongType) {
  json doc = GoodHardwareDoc();
  doc["bf16_tflops"] = "989";
  ExpectHardwareError(doc, {"field 'bf16_tflops'", "number"});
}

TEST(HardwareSpecTest, NonPositive) {
  json doc = GoodHardwareDoc();
  doc["hbm_gib"] = -80;
  ExpectHardwareError(doc, {"field 'hbm_gib'", "> 0"});
  doc = GoodHardwareDoc();
  doc["pcie_bandwidth_gbps"] = 0;
  ExpectHardwareError(doc, {"field 'pcie_bandwidth_gbps'", "> 0"});
}

TEST(HardwareSpecTest, OutOfRange) {
  json doc = GoodHardwareDoc();
  doc["nvlink_bandwidth_gbps"] = 1e300;
  ExpectHardwareError(doc, {"field 'nvlink_bandwidth_gbps'", "between"});
  doc = GoodHardwareDoc();
  doc["hbm_bandwidth_gbps"] = 1e-300;
  ExpectHardwareError(doc, {"field 'hbm_bandwidth_gbps'", "between"});
}

TEST(HardwareSpecTest, NameDefaultsToStem) {
  json doc = GoodHardwareDoc();
  doc.erase("name");
  Result<HardwareSpec> hw = ParseHardwareSpec(doc, "models/hardware/my-gpu.json");
  ASSERT_TRUE(hw.ok()) << hw.error();
  EXPECT_EQ(hw->name, "my-gpu");
}

// ---- rotary inverse frequencies ----

ModelSpec RopeSpec(int head_dim, double theta) {
  ModelSpec c;
  c.head_dim = head_dim;
  c.rope_theta = theta;
  return c;
}

// Expects `actual` within 2 float ulps of `expected` (the library computes in double and
// rounds once; the formulas here do the same, possibly in a different order).
void ExpectNearUlps(float actual, double expected) {
  EXPECT_NEAR(actual, expected, 2 * std::abs(expected) * 0x1p-23) << expected;
}

TEST(RopeTest, DefaultFrequenciesAreThetaPowers) {
  const ModelSpec c = RopeSpec(8, 10000.0);
  const std::vector<float> inv = c.RopeInvFrequencies();
  ASSERT_EQ(inv.size(), 4u);
  // 10000^(-2i/8) = 1, 0.1, 0.01, 0.001.
  ExpectNearUlps(inv[0], 1.0);
  ExpectNearUlps(inv[1], 0.1);
  ExpectNearUlps(inv[2], 0.01);
  ExpectNearUlps(inv[3], 0.001);
}

TEST(RopeTest, LinearScalingDividesEveryFrequency) {
  ModelSpec c = RopeSpec(8, 10000.0);
  c.rope_scaling.type = RopeScalingType::kLinear;
  c.rope_scaling.factor = 4.0;
  const std::vector<float> inv = c.RopeInvFrequencies();
  ExpectNearUlps(inv[0], 0.25);
  ExpectNearUlps(inv[1], 0.025);
  ExpectNearUlps(inv[3], 0.00025);
}

TEST(RopeTest, Llama3ScalingHasThreeBands) {
  // The test model's settings: head_dim 16, theta 5e5, factor 8, low 1, high 4, original 64.
  // Wavelength thresholds: 64 / 4 = 16 and 64 / 1 = 64 positions. Pair 0's wavelength is
  // 2*pi (high frequency: kept), pair 1's is 2*pi * 5e5^(1/8) ~ 32.4 (between: smoothed),
  // pairs 2..7 have wavelengths from ~167 up (low frequency: divided by 8).
  ModelSpec c = RopeSpec(16, 500000.0);
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 64, ""};
  const std::vector<float> inv = c.RopeInvFrequencies();
  ASSERT_EQ(inv.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const double base = std::pow(500000.0, -double(2 * i) / 16.0);
    const double wavelen = 2 * std::numbers::pi / base;
    if (i == 0) {
      EXPECT_LT(wavelen, 16.0);
      ExpectNearUlps(inv[i], base);
    } else if (i == 1) {
      EXPECT_GT(wavelen, 16.0);
      EXPECT_LT(wavelen, 64.0);
      // smooth = (original / wavelen - low) / (high - low);
      // inv = (1 - smooth) * base / factor + smooth * base.
      const double smooth = (64.0 / wavelen - 1.0) / (4.0 - 1.0);
      ExpectNearUlps(inv[i], (1 - smooth) * base / 8.0 + smooth * base);
      EXPECT_LT(inv[i], base);
      EXPECT_GT(inv[i], base / 8.0);
    } else {
      EXPECT_GT(wavelen, 64.0);
      ExpectNearUlps(inv[i], base / 8.0);
    }
  }
  // Hand-computed pair 1: base = 5e5^(-1/8) = 0.193923, wavelen = 32.4005,
  // smooth = (64 / 32.4005 - 1) / 3 = 0.325094, inv = 0.193923 * (0.674906 / 8 + 0.325094).
  EXPECT_NEAR(inv[1], 0.0794030, 1e-6);
}

TEST(RopeTest, Llama31ConfigBands) {
  // Llama 3.1's real settings: of 64 pairs, wavelengths below 2048 stay (pairs 0..28),
  // above 8192 are divided by 8 (pairs 35..63), and pairs 29..34 are smoothed. The scaled
  // frequencies still fall with the pair index (the bands join continuously).
  const ModelSpec c = ParseOrDie(Llama31Config());
  const std::vector<float> inv = c.RopeInvFrequencies();
  ASSERT_EQ(inv.size(), 64u);
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -double(2 * i) / 128.0);
    if (std::abs(inv[i] - base) <= 2 * base * 0x1p-23) {
      ++kept;
    } else if (std::abs(inv[i] - base / 8) <= 2 * base / 8 * 0x1p-23) {
      ++divided;
    } else {
      ++smoothed;
    }
    if (i > 0) {
      EXPECT_LT(inv[i], inv[i - 1]);
    }
  }
  EXPECT_EQ(kept, 29);
  EXPECT_EQ(smoothed, 6);
  EXPECT_EQ(divided, 29);
  // Hand-computed with the formula in double: pair 30 (wavelength 2948.3) is smoothed to
  // 1.3718936e-3, pair 40 (wavelength 22910.6) is 2.7424818e-4 / 8.
  EXPECT_NEAR(inv[30], 1.3718936e-3, 1.3718936e-3 * 1e-6);
  EXPECT_NEAR(inv[40], 3.4281022e-5, 3.4281022e-5 * 1e-6);
}

}  // namespace
}  // namespace duet::models
