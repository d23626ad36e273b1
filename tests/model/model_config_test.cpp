// Tests for config.json parsing of Llama-family models (Llama 3.1/3.2, Qwen2, Mistral shapes
// as published), their defaults, clear errors for unsupported or broken configs, and the
// rotary inverse frequencies including the three bands of Llama 3 scaling.
#include "backend/model/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

namespace duet::backend {
namespace {

using nlohmann::json;

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

ModelConfig ParseOrDie(const json& doc) {
  Result<ModelConfig> config = ParseModelConfig(doc, "dir/config.json");
  EXPECT_TRUE(config.ok()) << config.error();
  return config.ok() ? *config : ModelConfig{};
}

// Expects an error naming the file and every one of `parts`.
void ExpectError(const json& doc, std::initializer_list<std::string> parts) {
  Result<ModelConfig> config = ParseModelConfig(doc, "dir/config.json");
  ASSERT_FALSE(config.ok()) << "parsed: " << doc.dump();
  EXPECT_NE(config.error().find("dir/config.json"), std::string::npos) << config.error();
  for (const std::string& part : parts) {
    EXPECT_NE(config.error().find(part), std::string::npos) << config.error() << " lacks " << part;
  }
}

TEST(ModelConfigTest, ParsesLlama31) {
  const ModelConfig c = ParseOrDie(Llama31Config());
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
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_FALSE(c.attention_qkv_bias);
  EXPECT_FALSE(c.attention_o_bias);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.ParamCount(), 8030261248);  // Llama 3.1 8B's published parameter count
}

TEST(ModelConfigTest, ParsesQwen2WithQkvBiasAndTiedEmbeddings) {
  const ModelConfig c = ParseOrDie(Qwen25Config());
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.attention_qkv_bias);
  EXPECT_FALSE(c.attention_o_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window is false
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int64_t>{151645}));
  EXPECT_EQ(c.ParamCount(), 494032768);  // Qwen2.5-0.5B's published count
}

TEST(ModelConfigTest, ParsesMistralWithAndWithoutSlidingWindow) {
  ModelConfig c = ParseOrDie(MistralConfig());
  EXPECT_EQ(c.model_type, "mistral");
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_FALSE(c.attention_qkv_bias);
  json doc = MistralConfig();
  doc["sliding_window"] = 4096;
  c = ParseOrDie(doc);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.ParamCount(), 7241732096);  // Mistral 7B
}

TEST(ModelConfigTest, AppliesHuggingFaceDefaults) {
  const ModelConfig c = ParseOrDie(json{{"model_type", "llama"},
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
  EXPECT_EQ(c.torch_dtype, "");
}

TEST(ModelConfigTest, LlamaAttentionBiasCoversQkvAndO) {
  json doc = Llama31Config();
  doc["attention_bias"] = true;
  const ModelConfig c = ParseOrDie(doc);
  EXPECT_TRUE(c.attention_qkv_bias);
  EXPECT_TRUE(c.attention_o_bias);
}

TEST(ModelConfigTest, RoundTripsThroughJson) {
  for (const json& doc : {Llama31Config(), Qwen25Config(), MistralConfig()}) {
    const ModelConfig a = ParseOrDie(doc);
    const ModelConfig b = ParseOrDie(ModelConfigToJson(a));
    EXPECT_EQ(ModelConfigToJson(a), ModelConfigToJson(b));
    EXPECT_EQ(a.ParamCount(), b.ParamCount());
    EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
    EXPECT_EQ(a.attention_qkv_bias, b.attention_qkv_bias);
  }
}

TEST(ModelConfigTest, RejectsUnsupportedArchitectures) {
  json doc = Llama31Config();
  doc["architectures"] = {"GPTNeoXForCausalLM"};
  doc["model_type"] = "gpt_neox";
  ExpectError(doc, {"unsupported architecture", "GPTNeoXForCausalLM", "gpt_neox"});
  doc.erase("architectures");
  ExpectError(doc, {"unsupported architecture", "gpt_neox", "LlamaForCausalLM"});
  doc = Llama31Config();
  doc["model_type"] = "qwen2";
  ExpectError(doc, {"model_type", "contradicts"});
  doc.erase("model_type");
  doc.erase("architectures");
  ExpectError(doc, {"model_type", "missing"});
}

TEST(ModelConfigTest, RejectsUnsupportedRopeScaling) {
  json doc = Llama31Config();
  doc["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ExpectError(doc, {"unsupported rope_scaling type", "yarn"});
  doc["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  ExpectError(doc, {"unsupported rope_scaling type", "dynamic"});
  doc["rope_scaling"] = {{"factor", 2.0}};
  ExpectError(doc, {"rope_scaling", "rope_type"});
  doc["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}};
  ExpectError(doc, {"original_max_position_embeddings", "missing"});
  doc["rope_scaling"]["original_max_position_embeddings"] = 8192;
  doc["rope_scaling"]["high_freq_factor"] = 1.0;
  ExpectError(doc, {"low_freq_factor", "below high_freq_factor"});
  doc["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(ParseOrDie(doc).rope_scaling.type, RopeScalingType::kLinear);
  doc["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(ParseOrDie(doc).rope_scaling.type, RopeScalingType::kNone);
}

TEST(ModelConfigTest, RejectsBadFieldsNamingThem) {
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
  ExpectError(without("hidden_size"), {"hidden_size", "missing"});
  ExpectError(without("vocab_size"), {"vocab_size", "missing"});
  ExpectError(with("hidden_size", -4096), {"hidden_size"});
  ExpectError(with("hidden_size", "4096"), {"hidden_size", "integer"});
  ExpectError(with("num_hidden_layers", 0), {"num_hidden_layers"});
  ExpectError(with("num_key_value_heads", 5), {"num_key_value_heads", "divide"});
  ExpectError(with("head_dim", 33), {"head_dim", "even"});
  ExpectError(with("rms_norm_eps", 0), {"rms_norm_eps"});
  ExpectError(with("rope_theta", -1.0), {"rope_theta"});
  ExpectError(with("vocab_size", 1e30), {"vocab_size"});
  ExpectError(with("hidden_size", json::parse("18446744073709551615")), {"hidden_size"});
  ExpectError(with("torch_dtype", "float64"), {"torch_dtype"});
  ExpectError(with("tie_word_embeddings", "no"), {"tie_word_embeddings"});
  ExpectError(with("eos_token_id", json::array({128001, "x"})), {"eos_token_id"});
  ExpectError(with("bos_token_id", 128256), {"bos_token_id", "vocab_size"});
  ExpectError(with("hidden_act", "gelu"), {"hidden_act", "silu"});
  ExpectError(with("mlp_bias", true), {"mlp_bias"});
  ExpectError(with("partial_rotary_factor", 0.5), {"partial_rotary_factor"});
  ExpectError(with("architectures", json::array()), {"architectures"});
  ExpectError(with("rope_scaling", 8), {"rope_scaling"});
  ExpectError(with("hidden_size", json::parse("[[[[[[[[1]]]]]]]]")), {"hidden_size", "array"});
  json qwen = Qwen25Config();
  qwen["use_sliding_window"] = true;
  qwen.erase("sliding_window");
  ExpectError(qwen, {"sliding_window", "missing"});
  EXPECT_FALSE(ParseModelConfig(json::array(), "dir/config.json").ok());
}

TEST(ModelConfigTest, LoadModelConfigNamesTheFile) {
  Result<ModelConfig> missing = LoadModelConfig("/nonexistent/config.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("/nonexistent/config.json"), std::string::npos);
}

// ---- rotary inverse frequencies ----

ModelConfig RopeConfig(int head_dim, double theta) {
  ModelConfig c;
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
  const ModelConfig c = RopeConfig(8, 10000.0);
  const std::vector<float> inv = c.RopeInvFrequencies();
  ASSERT_EQ(inv.size(), 4u);
  // 10000^(-2i/8) = 1, 0.1, 0.01, 0.001.
  ExpectNearUlps(inv[0], 1.0);
  ExpectNearUlps(inv[1], 0.1);
  ExpectNearUlps(inv[2], 0.01);
  ExpectNearUlps(inv[3], 0.001);
}

TEST(RopeTest, LinearScalingDividesEveryFrequency) {
  ModelConfig c = RopeConfig(8, 10000.0);
  c.rope_scaling = {RopeScalingType::kLinear, 4.0};
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
  ModelConfig c = RopeConfig(16, 500000.0);
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 64};
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
  const ModelConfig c = ParseOrDie(Llama31Config());
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
}  // namespace duet::backend
