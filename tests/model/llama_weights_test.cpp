// Tests for the generated test model and Llama weight loading: a written model loads back with
// its config and every tensor's shape and values (bit exact for f32, within rounding for
// bf16/f16), generation is deterministic, and missing or mis-shaped tensors are named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "backend/model/llama_weights.h"
#include "backend/model/test_model.h"
#include "backend/tokenizer/test_tokenizer.h"
#include "tests/model/temp_dir.h"

namespace duet::backend {
namespace {

using nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

LoadedModel LoadOrDie(const std::string& dir) {
  Result<LoadedModel> model = LoadModelDir(dir);
  EXPECT_TRUE(model.ok()) << model.error();
  return model.ok() ? std::move(*model) : LoadedModel{};
}

// Rewrites dir/model.safetensors through `edit`, which may drop or change tensors.
void RewriteWeights(const std::string& dir,
                    const std::function<void(std::vector<NamedTensor>&)>& edit) {
  const std::string path = dir + "/model.safetensors";
  std::vector<NamedTensor> tensors;
  {
    Result<SafetensorsFile> file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.error();
    for (const std::string& name : file->TensorNames()) {
      const TensorView* view = file->Find(name);
      tensors.push_back({{name, view->dtype, view->shape},
                         std::vector<std::byte>(view->data, view->data + view->bytes)});
    }
  }
  edit(tensors);
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
}

void ExpectShape(const TensorView& view, std::vector<std::int64_t> shape) {
  EXPECT_EQ(view.shape, shape);
}

TEST(TestModelTest, TinyModelLoadsBackBitExact) {
  TempDir tmp;
  const TestModelOptions options;
  ASSERT_TRUE(WriteTestModel(tmp.path(), options).ok());
  const LoadedModel model = LoadOrDie(tmp.path());
  const models::ModelSpec& c = model.config;
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 176);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, models::RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, Dtype::kF32);

  // The vocabulary is the tokenizer's: its BPE tokens plus the special tokens, and BOS/EOS
  // are its <|begin_of_text|> and <|eot_id|>.
  const json tokenizer = json::parse(ReadFile(model.tokenizer_json_path));
  std::map<std::string, std::int64_t> added;
  std::int64_t max_id = -1;
  for (const json& token : tokenizer["added_tokens"]) {
    added[token["content"]] = token["id"];
    max_id = std::max<std::int64_t>(max_id, token["id"]);
  }
  for (const auto& [text, id] : tokenizer["model"]["vocab"].items()) {
    max_id = std::max<std::int64_t>(max_id, id.get<std::int64_t>());
  }
  EXPECT_EQ(c.vocab_size, max_id + 1);
  EXPECT_GE(c.vocab_size, 512);
  EXPECT_EQ(c.bos_token_id, added.at("<|begin_of_text|>"));
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{added.at("<|eot_id|>")}));
  EXPECT_EQ(ReadFile(model.tokenizer_json_path), MakeTestTokenizerJson(512));
  const json tokenizer_config = json::parse(ReadFile(model.tokenizer_config_path));
  EXPECT_EQ(tokenizer_config["bos_token"], "<|begin_of_text|>");
  EXPECT_EQ(tokenizer_config["eos_token"], "<|eot_id|>");
  EXPECT_NE(tokenizer_config["chat_template"].get<std::string>().find("<|start_header_id|>"),
            std::string::npos);

  // The struct's views have the config's shapes.
  const LlamaWeights& w = model.weights;
  ExpectShape(w.embed_tokens, {c.vocab_size, 64});
  ExpectShape(w.lm_head, {c.vocab_size, 64});
  EXPECT_FALSE(w.lm_head_tied);
  EXPECT_NE(w.lm_head.data, w.embed_tokens.data);
  ExpectShape(w.norm, {64});
  ASSERT_EQ(w.layers.size(), 2u);
  for (const LlamaLayerWeights& layer : w.layers) {
    ExpectShape(layer.input_layernorm, {64});
    ExpectShape(layer.q_proj, {64, 64});
    ExpectShape(layer.k_proj, {32, 64});
    ExpectShape(layer.v_proj, {32, 64});
    ExpectShape(layer.o_proj, {64, 64});
    EXPECT_FALSE(layer.q_bias || layer.k_bias || layer.v_bias || layer.o_bias);
    ExpectShape(layer.post_attention_layernorm, {64});
    ExpectShape(layer.gate_proj, {176, 64});
    ExpectShape(layer.up_proj, {176, 64});
    ExpectShape(layer.down_proj, {64, 176});
  }

  // Every tensor in the file is one the generator meant, with its exact values.
  const std::vector<TensorSpec> specs = TestModelTensorSpecs(c, Dtype::kF32);
  EXPECT_EQ(w.checkpoint->TensorNames().size(), specs.size());
  std::int64_t params = 0;
  for (const TensorSpec& spec : specs) {
    const TensorView* view = w.checkpoint->Find(spec.name);
    ASSERT_NE(view, nullptr) << spec.name;
    EXPECT_EQ(view->dtype, Dtype::kF32);
    EXPECT_EQ(view->shape, spec.shape) << spec.name;
    const std::vector<float> expected = TestModelTensorValues(options, spec);
    ASSERT_EQ(view->bytes, expected.size() * 4);
    EXPECT_EQ(std::memcmp(view->data, expected.data(), view->bytes), 0) << spec.name;
    params += view->NumElements();
  }
  EXPECT_EQ(params, c.ParamCount());
  // The second layer's up_proj, element (5, 7), as an example.
  EXPECT_EQ(ToFloat32(w.layers[1].up_proj)[5 * 64 + 7],
            TestModelTensorValues(options, specs[specs.size() - 4])[5 * 64 + 7]);
}

TEST(TestModelTest, HalfPrecisionValuesAreRoundedOnce) {
  for (Dtype dtype : {Dtype::kBF16, Dtype::kF16}) {
    TempDir tmp;
    TestModelOptions options;
    options.dtype = dtype;
    ASSERT_TRUE(WriteTestModel(tmp.path(), options).ok());
    const LoadedModel model = LoadOrDie(tmp.path());
    EXPECT_EQ(model.config.torch_dtype, dtype);
    // bf16 keeps 8 significant bits, f16 11: relative error at most half an ulp.
    const double tolerance = dtype == Dtype::kBF16 ? 0x1p-8 : 0x1p-11;
    for (const TensorSpec& spec : TestModelTensorSpecs(model.config, dtype)) {
      const TensorView* view = model.weights.checkpoint->Find(spec.name);
      ASSERT_NE(view, nullptr);
      EXPECT_EQ(view->dtype, dtype);
      const std::vector<float> loaded = ToFloat32(*view);
      const std::vector<float> exact = TestModelTensorValues(options, spec);
      for (std::size_t i = 0; i < exact.size(); ++i) {
        const float rounded = dtype == Dtype::kBF16 ? Bf16ToFloat(FloatToBf16(exact[i]))
                                                    : F16ToFloat(FloatToF16(exact[i]));
        ASSERT_EQ(loaded[i], rounded) << spec.name << "[" << i << "]";
        // f16 subnormals (|x| < 2^-14) have an absolute, not relative, step of 2^-24.
        ASSERT_LE(std::abs(loaded[i] - exact[i]), std::abs(exact[i]) * tolerance + 0x1p-25)
            << spec.name << "[" << i << "]";
      }
    }
  }
}

TEST(TestModelTest, GenerationIsDeterministicAndLooksNormal) {
  TempDir a, b, c;
  TestModelOptions options;
  ASSERT_TRUE(WriteTestModel(a.path(), options).ok());
  ASSERT_TRUE(WriteTestModel(b.path(), options).ok());
  options.seed = 2;
  ASSERT_TRUE(WriteTestModel(c.path(), options).ok());
  const std::string weights_a = ReadFile(a.File("model.safetensors"));
  // (EXPECT_TRUE: a failure must not print megabytes of binary.)
  EXPECT_TRUE(weights_a == ReadFile(b.File("model.safetensors")));
  EXPECT_FALSE(weights_a == ReadFile(c.File("model.safetensors")));
  EXPECT_EQ(ReadFile(a.File("config.json")), ReadFile(c.File("config.json")));
  // The tiny model's file: 158912 f32 parameters plus a small header.
  EXPECT_GT(weights_a.size(), 158912u * 4);
  EXPECT_LT(weights_a.size(), 158912u * 4 + 8192);

  // Moments of a large tensor, and of a norm.
  const TestModelOptions defaults;
  const std::vector<float> up = TestModelTensorValues(
      defaults, {"model.layers.0.mlp.up_proj.weight", Dtype::kF32, {176, 64}});
  double sum = 0, sum_sq = 0;
  for (float v : up) {
    sum += v;
    sum_sq += double(v) * v;
  }
  const double mean = sum / up.size(), std_dev = std::sqrt(sum_sq / up.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(std_dev, 0.02, 0.001);
  const std::vector<float> norm =
      TestModelTensorValues(defaults, {"model.norm.weight", Dtype::kF32, {64}});
  for (float v : norm) EXPECT_NEAR(v, 1.0, 0.12);
  // Each tensor has its own stream: q and k of one layer differ.
  const std::vector<float> q =
      TestModelTensorValues(defaults, {"model.layers.0.self_attn.q_proj.weight", Dtype::kF32, {4}});
  const std::vector<float> k =
      TestModelTensorValues(defaults, {"model.layers.0.self_attn.k_proj.weight", Dtype::kF32, {4}});
  EXPECT_NE(q, k);
}

TEST(TestModelTest, TiedEmbeddingsAndAttentionBias) {
  TempDir tmp;
  TestModelOptions options;
  options.tie_word_embeddings = true;
  options.attention_bias = true;
  ASSERT_TRUE(WriteTestModel(tmp.path(), options).ok());
  const LoadedModel model = LoadOrDie(tmp.path());
  EXPECT_TRUE(model.config.tie_word_embeddings);
  EXPECT_TRUE(model.weights.lm_head_tied);
  EXPECT_EQ(model.weights.lm_head.data, model.weights.embed_tokens.data);
  EXPECT_EQ(model.weights.checkpoint->Find("lm_head.weight"), nullptr);
  for (const LlamaLayerWeights& layer : model.weights.layers) {
    ASSERT_TRUE(layer.q_bias && layer.k_bias && layer.v_bias && layer.o_bias);
    ExpectShape(*layer.q_bias, {64});
    ExpectShape(*layer.k_bias, {32});
    ExpectShape(*layer.v_bias, {32});
    ExpectShape(*layer.o_bias, {64});
  }
}

TEST(TestModelTest, BenchmarkPresetSize) {
  Result<models::ModelSpec> config = TestModelConfig(TestModelOptions::Benchmark());
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_EQ(config->vocab_size, 32000);
  EXPECT_EQ(config->hidden_size, 768);
  EXPECT_EQ(config->num_hidden_layers, 12);
  EXPECT_EQ(config->ParamCount(), 124668672);
  TestModelOptions too_small;
  too_small.vocab_size = 300;
  EXPECT_FALSE(TestModelConfig(too_small).ok());
  TestModelOptions bad_heads;
  bad_heads.num_key_value_heads = 3;
  EXPECT_FALSE(WriteTestModel("/nonexistent-never-created", bad_heads).ok());
}

TEST(TestModelTest, Llama32OneBPresetHasTheRealModelsSize) {
  Result<models::ModelSpec> config = TestModelConfig(TestModelOptions::Llama32_1B());
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->vocab_size, 128256);
  // meta-llama/Llama-3.2-1B's parameter count, tied embeddings counted once.
  EXPECT_EQ(config->ParamCount(), 1235814400);
}

TEST(LlamaWeightsTest, MissingTensorIsNamed) {
  TempDir tmp;
  ASSERT_TRUE(WriteTestModel(tmp.path(), {}).ok());
  RewriteWeights(tmp.path(), [](std::vector<NamedTensor>& tensors) {
    std::erase_if(tensors, [](const NamedTensor& t) {
      return t.spec.name == "model.layers.1.mlp.up_proj.weight";
    });
  });
  Result<LoadedModel> model = LoadModelDir(tmp.path());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.error(), "missing tensor model.layers.1.mlp.up_proj.weight in " + tmp.path());

  // An untied model without lm_head.weight.
  RewriteWeights(tmp.path(), [](std::vector<NamedTensor>& tensors) {
    std::erase_if(tensors, [](const NamedTensor& t) { return t.spec.name == "lm_head.weight"; });
  });
  model = LoadModelDir(tmp.path());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().find("missing tensor"), std::string::npos) << model.error();
}

TEST(LlamaWeightsTest, MisShapedTensorNamesBothShapes) {
  TempDir tmp;
  ASSERT_TRUE(WriteTestModel(tmp.path(), {}).ok());
  RewriteWeights(tmp.path(), [](std::vector<NamedTensor>& tensors) {
    for (NamedTensor& t : tensors) {
      if (t.spec.name == "model.layers.0.self_attn.k_proj.weight") t.spec.shape = {64, 32};
    }
  });
  Result<LoadedModel> model = LoadModelDir(tmp.path());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().find("model.layers.0.self_attn.k_proj.weight"), std::string::npos);
  EXPECT_NE(model.error().find("has shape [64, 32], expected [32, 64]"), std::string::npos)
      << model.error();
  EXPECT_NE(model.error().find("model.safetensors"), std::string::npos) << model.error();
}

TEST(LlamaWeightsTest, MixedDtypesShardsAndExtraTensors) {
  TempDir tmp;
  ASSERT_TRUE(WriteTestModel(tmp.path(), {}).ok());
  // Convert the norms to bf16, add an unused buffer, and split the file into two shards.
  std::vector<NamedTensor> tensors;
  RewriteWeights(tmp.path(), [&](std::vector<NamedTensor>& all) {
    for (NamedTensor& t : all) {
      if (t.spec.name.find("norm") == std::string::npos) continue;
      std::vector<float> values(t.data.size() / 4);
      std::memcpy(values.data(), t.data.data(), t.data.size());
      t.spec.dtype = Dtype::kBF16;
      t.data.resize(values.size() * 2);
      for (std::size_t i = 0; i < values.size(); ++i) {
        const std::uint16_t bits = FloatToBf16(values[i]);
        std::memcpy(t.data.data() + 2 * i, &bits, 2);
      }
    }
    all.push_back({{"model.layers.0.self_attn.rotary_emb.inv_freq", Dtype::kF32, {8}},
                   std::vector<std::byte>(32)});
    tensors = all;
  });
  std::filesystem::remove(tmp.File("model.safetensors"));
  const std::size_t half = tensors.size() / 2;
  json weight_map = json::object();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    weight_map[tensors[i].spec.name] =
        i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(WriteSafetensors(tmp.File("model-00001-of-00002.safetensors"),
                               {tensors.begin(), tensors.begin() + half})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(tmp.File("model-00002-of-00002.safetensors"),
                               {tensors.begin() + half, tensors.end()})
                  .ok());
  tmp.Write("model.safetensors.index.json", json{{"weight_map", weight_map}}.dump());

  const LoadedModel model = LoadOrDie(tmp.path());
  EXPECT_EQ(model.weights.checkpoint->files().size(), 2u);
  EXPECT_EQ(model.weights.norm.dtype, Dtype::kBF16);
  EXPECT_EQ(model.weights.layers[1].input_layernorm.dtype, Dtype::kBF16);
  EXPECT_EQ(model.weights.layers[1].q_proj.dtype, Dtype::kF32);
  const std::vector<float> norm = ToFloat32(model.weights.norm);
  const std::vector<float> exact =
      TestModelTensorValues({}, {"model.norm.weight", Dtype::kF32, {64}});
  for (std::size_t i = 0; i < norm.size(); ++i) {
    EXPECT_EQ(norm[i], Bf16ToFloat(FloatToBf16(exact[i])));
  }
}

TEST(LlamaWeightsTest, Qwen2BiasesAndTiedHeadLoad) {
  TempDir tmp;
  models::ModelSpec config;
  config.model_type = "qwen2";
  config.hidden_size = 32;
  config.intermediate_size = 48;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 8;
  config.vocab_size = 50;
  config.max_position_embeddings = 128;
  config.tie_word_embeddings = true;
  config.attention_qkv_bias = true;
  tmp.Write("config.json", models::ModelSpecToJson(config).dump());
  std::vector<NamedTensor> tensors;
  for (const TensorSpec& spec : TestModelTensorSpecs(config, Dtype::kF16)) {
    std::int64_t count = 1;
    for (std::int64_t d : spec.shape) count *= d;
    tensors.push_back({spec, std::vector<std::byte>(std::size_t(count) * 2)});
  }
  ASSERT_TRUE(WriteSafetensors(tmp.File("model.safetensors"), tensors).ok());
  const LoadedModel model = LoadOrDie(tmp.path());
  EXPECT_EQ(model.config.model_type, "qwen2");
  EXPECT_TRUE(model.weights.lm_head_tied);
  ASSERT_TRUE(model.weights.layers[0].q_bias.has_value());
  ExpectShape(*model.weights.layers[0].k_bias, {16});
  EXPECT_FALSE(model.weights.layers[0].o_bias.has_value());
  EXPECT_EQ(model.tokenizer_json_path, "");  // none written
}

TEST(LlamaWeightsTest, ViewsOutliveTheLoadedModel) {
  TempDir tmp;
  ASSERT_TRUE(WriteTestModel(tmp.path(), {}).ok());
  LlamaWeights weights;
  {
    const LoadedModel model = LoadOrDie(tmp.path());
    weights = model.weights;  // shares the mapped files
  }
  const std::vector<float> expected =
      TestModelTensorValues({}, {"model.norm.weight", Dtype::kF32, {64}});
  EXPECT_EQ(ToFloat32(weights.norm), expected);
}

TEST(LlamaWeightsTest, DirectoryErrorsNameTheFile) {
  TempDir tmp;
  Result<LoadedModel> model = LoadModelDir(tmp.path());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().find(tmp.File("config.json")), std::string::npos) << model.error();
  // A well-formed config of a model type the backend does not run (the simulator takes it):
  // refused before the weights are looked for, naming the file.
  tmp.Write("config.json", R"({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
                               "hidden_size": 64, "intermediate_size": 256,
                               "num_attention_heads": 4, "num_hidden_layers": 2,
                               "vocab_size": 100, "hidden_act": "gelu"})");
  model = LoadModelDir(tmp.path());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(
      model.error().find(tmp.File("config.json") + ": unsupported architecture GPTNeoXForCausalLM"),
      std::string::npos)
      << model.error();
  // A config that is not even Llama-shaped names the missing field.
  tmp.Write("config.json", R"({"model_type": "t5", "d_model": 64})");
  model = LoadModelDir(tmp.path());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().find(tmp.File("config.json") + ": field 'num_hidden_layers' is missing"),
            std::string::npos)
      << model.error();
  ASSERT_TRUE(WriteTestModel(tmp.path(), {}).ok());
  std::filesystem::remove(tmp.File("model.safetensors"));
  model = LoadModelDir(tmp.path());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().find("no model.safetensors.index.json"), std::string::npos)
      << model.error();
}

}  // namespace
}  // namespace duet::backend
