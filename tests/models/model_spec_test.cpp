// Tests for model and hardware spec parsing: every bundled file loads with its published
// numbers, derived sizes (parameters, KV bytes per token) match hand counts, and each kind of
// bad input gives an error naming the file and the field.
#include "models/model_spec.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

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

// A valid Llama-like spec to break one field at a time.
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

// Expects a parse error mentioning the file and every one of `parts`.
void ExpectModelError(const json& doc, std::initializer_list<std::string> parts) {
  Result<ModelSpec> spec = ParseModelSpec(doc, "specs/bad.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().find("specs/bad.json"), std::string::npos) << spec.error();
  for (const std::string& part : parts) {
    EXPECT_NE(spec.error().find(part), std::string::npos) << spec.error() << " lacks " << part;
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

TEST(ModelSpecTest, EveryBundledSpecLoads) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("models/specs")) {
    if (entry.path().extension() != ".json") continue;
    Result<ModelSpec> spec = LoadModelSpec(entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.error();
    EXPECT_EQ(spec->name, entry.path().stem().string()) << "name should match the file name";
    EXPECT_GT(spec->ParamCount(), 0);
    EXPECT_GT(spec->KvBytesPerToken(), 0);
    ++count;
  }
  EXPECT_GE(count, 5);
}

TEST(ModelSpecTest, EveryBundledHardwareLoads) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("models/hardware")) {
    if (entry.path().extension() != ".json") continue;
    Result<HardwareSpec> hw = LoadHardwareSpec(entry.path().string());
    ASSERT_TRUE(hw.ok()) << hw.error();
    EXPECT_EQ(hw->name, entry.path().stem().string());
    EXPECT_GT(hw->bf16_flops, 0);
    EXPECT_GT(hw->hbm_bytes, 0);
    EXPECT_GT(hw->hbm_bw, 0);
    EXPECT_GT(hw->nvlink_bw, 0);
    EXPECT_GT(hw->pcie_bw, 0);
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
  EXPECT_EQ(spec.torch_dtype, "bfloat16");
  EXPECT_FALSE(spec.tie_word_embeddings);
  EXPECT_EQ(spec.BytesPerElement(), 2);
}

TEST(ModelSpecTest, ParamCountsMatchPublishedSizes) {
  // Exact hand count for Llama-3.1-8B: 2 * 128256 * 4096 embeddings + lm_head, 32 layers of
  // 218112000, final norm 4096.
  EXPECT_EQ(LoadModelOrDie("models/specs/llama-3.1-8b.json").ParamCount(), 8030261248);
  EXPECT_NEAR(LoadModelOrDie("models/specs/llama-3.1-70b.json").ParamCount() / 1e9, 70.55, 0.01);
  // Qwen2.5-7B publishes 7.615e9 including the q/k/v biases (~129k) we do not count.
  ModelSpec qwen = LoadModelOrDie("models/specs/qwen2.5-7b.json");
  EXPECT_EQ(qwen.head_dim, 128) << "defaults to hidden_size / num_attention_heads";
  EXPECT_NEAR(qwen.ParamCount() / 7.615e9, 1.0, 0.001);
  ModelSpec small = LoadModelOrDie("models/specs/llama-3.2-1b.json");
  EXPECT_TRUE(small.tie_word_embeddings);
  EXPECT_NEAR(small.ParamCount() / 1e9, 1.236, 0.001);
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
  EXPECT_LT(tiny.WeightBytes(), 1 << 20);
}

TEST(ModelSpecTest, Float32DoublesBytes) {
  json doc = GoodModelDoc();
  doc["torch_dtype"] = "float32";
  Result<ModelSpec> spec = ParseModelSpec(doc, "specs/f32.json");
  ASSERT_TRUE(spec.ok()) << spec.error();
  EXPECT_EQ(spec->BytesPerElement(), 4);
  EXPECT_EQ(spec->KvBytesPerToken(), 512);
  EXPECT_EQ(spec->WeightBytes(), 4 * spec->ParamCount());
}

TEST(ModelSpecTest, DefaultsForOptionalFields) {
  json doc = GoodModelDoc();
  doc.erase("num_key_value_heads");
  doc.erase("head_dim");
  doc.erase("torch_dtype");
  Result<ModelSpec> spec = ParseModelSpec(doc, "some/dir/my-model.json");
  ASSERT_TRUE(spec.ok()) << spec.error();
  EXPECT_EQ(spec->name, "my-model");
  EXPECT_EQ(spec->num_key_value_heads, 4);
  EXPECT_EQ(spec->head_dim, 16);
  EXPECT_EQ(spec->torch_dtype, "bfloat16");
  EXPECT_FALSE(spec->tie_word_embeddings);
}

TEST(ModelSpecTest, MissingFieldNamesFileAndField) {
  json doc = GoodModelDoc();
  doc.erase("hidden_size");
  ExpectModelError(doc, {"field 'hidden_size' is missing"});
}

TEST(ModelSpecTest, WrongTypeNamesField) {
  json doc = GoodModelDoc();
  doc["num_hidden_layers"] = "32";
  ExpectModelError(doc, {"field 'num_hidden_layers'", "integer"});
  doc = GoodModelDoc();
  doc["hidden_size"] = 64.5;
  ExpectModelError(doc, {"field 'hidden_size'", "integer"});
  doc = GoodModelDoc();
  doc["tie_word_embeddings"] = "yes";
  ExpectModelError(doc, {"field 'tie_word_embeddings'"});
  doc = GoodModelDoc();
  doc["name"] = 7;
  ExpectModelError(doc, {"field 'name'", "string"});
}

TEST(ModelSpecTest, NonPositiveNamesField) {
  json doc = GoodModelDoc();
  doc["intermediate_size"] = -5;
  ExpectModelError(doc, {"field 'intermediate_size'", "between 1 and", "-5"});
  doc = GoodModelDoc();
  doc["vocab_size"] = 0;
  ExpectModelError(doc, {"field 'vocab_size'"});
}

TEST(ModelSpecTest, AbsurdSizesAreRejected) {
  json doc = GoodModelDoc();
  doc["hidden_size"] = 10000000000LL;
  ExpectModelError(doc, {"field 'hidden_size'"});
  doc = GoodModelDoc();
  doc["num_hidden_layers"] = 18446744073709551615ULL;
  ExpectModelError(doc, {"field 'num_hidden_layers'"});
  doc = GoodModelDoc();
  doc["num_attention_heads"] = 65536;
  doc["num_key_value_heads"] = 1;
  doc["head_dim"] = 65536;
  ExpectModelError(doc, {"field 'head_dim'"});
}

TEST(ModelSpecTest, HeadsNotDivisibleByKvHeads) {
  json doc = GoodModelDoc();
  doc["num_key_value_heads"] = 3;
  ExpectModelError(doc, {"field 'num_attention_heads'", "num_key_value_heads (3)"});
}

TEST(ModelSpecTest, HeadDimDefaultNeedsEvenSplit) {
  json doc = GoodModelDoc();
  doc.erase("head_dim");
  doc["hidden_size"] = 66;
  ExpectModelError(doc, {"field 'head_dim'", "missing"});
}

TEST(ModelSpecTest, UnknownDtypeListsAccepted) {
  json doc = GoodModelDoc();
  doc["torch_dtype"] = "float8";
  ExpectModelError(doc, {"field 'torch_dtype'", "float8", "bfloat16, float16, float32"});
}

TEST(ModelSpecTest, NonObjectDocument) { ExpectModelError(json::array({1, 2}), {"object"}); }

TEST(ModelSpecTest, UnknownKeysAreIgnored) {
  json doc = GoodModelDoc();
  doc["rope_scaling"] = {{"factor", 8.0}};
  doc["architectures"] = json::array({"LlamaForCausalLM"});
  EXPECT_TRUE(ParseModelSpec(doc, "x.json").ok());
}

// Writes `text` to a fresh temporary file and returns its path.
std::string WriteTemp(const std::string& file_name, const std::string& text) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "duet_models_test";
  std::filesystem::create_directories(dir);
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
}

TEST(ModelSpecTest, FieldErrorFromFileNamesPath) {
  json doc = GoodModelDoc();
  doc["num_key_value_heads"] = 3;
  std::string path = WriteTemp("bad-heads.json", doc.dump());
  Result<ModelSpec> spec = LoadModelSpec(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.error().find(path + ": field 'num_attention_heads'"), std::string::npos)
      << spec.error();
}

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

}  // namespace
}  // namespace duet::models
