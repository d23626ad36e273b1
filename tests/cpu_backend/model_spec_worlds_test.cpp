// One model description in both worlds: the configs the backend runs (the test model's tiny
// and bench presets, and the fixture model of tests/fixtures/test_model) and every bundled spec
// give the simulator (models::LoadModelSpec) and the backend (weight mapping, CpuModel) the same
// parameter counts and KV bytes; the CPU model's allocated KV cache is exactly what the one
// KV formula says for its fp32 cache, and the counts of the bundled specs are pinned.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_model.h"
#include "backend/model/test_model.h"
#include "models/model_spec.h"

namespace duet::backend {
namespace {

namespace fs = std::filesystem;
using models::Dtype;
using models::ModelSpec;

// Parameters the backend maps for `spec`: the elements of every tensor the weight loader asks
// for (TestModelTensorSpecs lists them with LoadLlamaWeights' names and shapes).
std::int64_t MappedParams(const ModelSpec& spec) {
  std::int64_t params = 0;
  for (const TensorSpec& tensor : TestModelTensorSpecs(spec, Dtype::kBF16)) {
    std::int64_t n = 1;
    for (std::int64_t d : tensor.shape) n *= d;
    params += n;
  }
  return params;
}

class TempModelDir {
 public:
  TempModelDir() {
    static int counter = 0;
    path_ = (fs::temp_directory_path() /
             ("duet_worlds_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                .string();
  }
  ~TempModelDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes the test model with `options`, loads it as the backend and as the simulator does, and
// checks that both see the same model and that CpuModel allocates the KV the formula says.
void ExpectSameInBothWorlds(const TestModelOptions& options) {
  TempModelDir dir;
  ASSERT_TRUE(WriteTestModel(dir.path(), options).ok());
  Result<ModelSpec> simulated = models::LoadModelSpec(dir.path());  // what `duet simulate` reads
  ASSERT_TRUE(simulated.ok()) << simulated.error();
  Result<LoadedModel> loaded = LoadModelDir(dir.path());  // what `duet generate` reads
  ASSERT_TRUE(loaded.ok()) << loaded.error();
  const ModelSpec& run = loaded->config;
  EXPECT_EQ(models::ModelSpecToJson(*simulated), models::ModelSpecToJson(run));
  EXPECT_EQ(simulated->ParamCount(), run.ParamCount());
  EXPECT_EQ(simulated->KvBytesPerToken(), run.KvBytesPerToken());
  EXPECT_EQ(simulated->torch_dtype, options.dtype);

  // The parameters in the checkpoint are the ones ParamCount counts.
  std::int64_t stored = 0;
  for (const std::string& name : loaded->weights.checkpoint->TensorNames()) {
    stored += loaded->weights.checkpoint->Find(name)->NumElements();
  }
  EXPECT_EQ(stored, simulated->ParamCount());

  // The CPU model's KV memory, measured from its buffer, is what the simulator plans with the
  // cluster's default kv_cache_dtype ("auto": the model's dtype), and its block-major region
  // covers it block by block.
  const std::int64_t num_blocks = 7, block_tokens = 16;
  CpuModelOptions cpu_options;
  cpu_options.num_blocks = num_blocks;
  cpu_options.block_tokens = std::int32_t(block_tokens);
  cpu_options.threads = 1;
  Result<std::unique_ptr<CpuModel>> cpu = CpuModel::Create(std::move(*loaded), cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.error();
  EXPECT_EQ((*cpu)->kv_cache_dtype(), options.dtype);
  EXPECT_EQ((*cpu)->kv_bytes_per_token(), simulated->KvBytesPerToken());
  EXPECT_EQ((*cpu)->kv_cache_bytes(), num_blocks * block_tokens * simulated->KvBytesPerToken());
  const std::optional<KvRegion> region = (*cpu)->kv_region();
  ASSERT_TRUE(region.has_value());
  EXPECT_EQ(region->num_blocks, num_blocks);
  EXPECT_EQ(region->block_bytes, block_tokens * simulated->KvBytesPerToken());
}

// Memory that a KvAllocator hands out, filled with a pattern the model must clear.
class PatternKvMemory final : public KvMemory {
 public:
  explicit PatternKvMemory(std::int64_t bytes) : bytes_(static_cast<std::size_t>(bytes), 0xab) {}
  void* data() override { return bytes_.data(); }
  const std::vector<unsigned char>& bytes() const { return bytes_; }

 private:
  std::vector<unsigned char> bytes_;
};

TEST(ModelSpecWorlds, TheKvCacheLivesWhereTheAllocatorPutsIt) {
  TempModelDir dir;
  ASSERT_TRUE(WriteTestModel(dir.path(), TestModelOptions()).ok());
  CpuModelOptions options;
  options.num_blocks = 5;
  options.threads = 1;
  std::vector<std::int64_t> asked;
  PatternKvMemory* given = nullptr;
  options.kv_allocator = [&](std::int64_t bytes) -> Result<std::unique_ptr<KvMemory>> {
    asked.push_back(bytes);
    auto memory = std::make_unique<PatternKvMemory>(bytes);
    given = memory.get();
    return std::unique_ptr<KvMemory>(std::move(memory));
  };
  Result<LoadedModel> loaded = LoadModelDir(dir.path());
  ASSERT_TRUE(loaded.ok()) << loaded.error();
  auto model = CpuModel::Create(std::move(*loaded), options);
  ASSERT_TRUE(model.ok()) << model.error();
  ASSERT_EQ(asked, std::vector<std::int64_t>{(*model)->kv_cache_bytes()});
  const std::optional<KvRegion> region = (*model)->kv_region();
  ASSERT_TRUE(region.has_value());
  EXPECT_EQ(region->base, given->data());
  EXPECT_EQ(region->memory, given);  // a transport finds the memory it allocated
  for (unsigned char b : given->bytes()) ASSERT_EQ(b, 0);  // cleared, as the heap's

  // An allocator that fails fails the model, saying where.
  Result<LoadedModel> again = LoadModelDir(dir.path());
  ASSERT_TRUE(again.ok()) << again.error();
  options.kv_allocator = [](std::int64_t) -> Result<std::unique_ptr<KvMemory>> {
    return Status::Error("no shared memory left");
  };
  auto failed = CpuModel::Create(std::move(*again), options);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error(), "allocating the KV cache: no shared memory left");
}

TEST(ModelSpecWorlds, TinyTestModelInBothWorlds) {
  TestModelOptions options;
  ExpectSameInBothWorlds(options);
  options.dtype = Dtype::kBF16;
  options.attention_bias = true;  // biases are parameters too
  options.tie_word_embeddings = true;
  ExpectSameInBothWorlds(options);
}

TEST(ModelSpecWorlds, FixtureModelInBothWorlds) {
  // tests/fixtures/test_model/hf_golden.json was made from the test model with these options.
  std::ifstream in("tests/fixtures/test_model/hf_golden.json");
  ASSERT_TRUE(in) << "missing fixture";
  const nlohmann::json doc = nlohmann::json::parse(in);
  TestModelOptions options;
  options.seed = doc["model"]["seed"].get<std::uint64_t>();
  const auto dtype = DtypeFromName(doc["model"]["dtype"].get<std::string>());
  ASSERT_TRUE(dtype.has_value());
  options.dtype = *dtype;
  ExpectSameInBothWorlds(options);
}

TEST(ModelSpecWorlds, BenchPresetInBothWorlds) {
  // The ~125M preset's config as written to config.json, read back by the one parser; its
  // weights (250 MB) are not written here.
  Result<ModelSpec> config = TestModelConfig(TestModelOptions::Benchmark());
  ASSERT_TRUE(config.ok()) << config.error();
  Result<ModelSpec> parsed =
      models::ParseModelSpec(models::ModelSpecToJson(*config), "bench/config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.error();
  EXPECT_EQ(parsed->ParamCount(), 124668672);
  EXPECT_EQ(config->ParamCount(), 124668672);
  EXPECT_EQ(MappedParams(*parsed), 124668672);
  EXPECT_EQ(parsed->KvBytesPerToken(), 2 * 12 * 4 * 64 * 2);  // bf16 weights: bf16 KV
  EXPECT_EQ(parsed->KvBytesPerToken(Dtype::kF32), 2 * 12 * 4 * 64 * 4);
  EXPECT_TRUE(models::CheckExecutable(*parsed, "bench/config.json").ok());
}

TEST(ModelSpecWorlds, BundledSpecsKeepTheirNumbers) {
  // The numbers the simulator planned with before the two parsers became one (weights and KV in
  // bf16), and the tensors the backend's weight mapping would ask for.
  struct Expected {
    const char* name;
    std::int64_t params;
    std::int64_t kv_bytes_per_token;
  };
  const Expected expected[] = {
      {"llama-3.1-8b", 8030261248, 131072},
      {"llama-3.1-70b", 70553706496, 327680},
      {"llama-3.2-1b", 1235814400, 32768},
      // The one change: Qwen2's q/k/v biases, 28 * (3584 + 2 * 512), are now counted.
      {"qwen2.5-7b", 7615487488 + 129024, 57344},
      {"tiny-test", 139584, 256},
  };
  int count = 0;
  for (const auto& entry : fs::directory_iterator("models/specs")) {
    if (entry.path().extension() != ".json") continue;
    Result<ModelSpec> spec = models::LoadModelSpec(entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.error();
    // The simulator's mixtures of experts and latent attention: the backend maps no weights.
    if (!models::CheckExecutable(*spec, entry.path().string()).ok()) continue;
    const Expected* e = nullptr;
    for (const Expected& x : expected) {
      if (spec->name == x.name) e = &x;
    }
    ASSERT_NE(e, nullptr) << "no pinned numbers for " << spec->name;
    EXPECT_EQ(spec->ParamCount(), e->params) << spec->name;
    EXPECT_EQ(spec->WeightBytes(), 2 * e->params) << spec->name;
    EXPECT_EQ(spec->KvBytesPerToken(), e->kv_bytes_per_token) << spec->name;
    EXPECT_EQ(MappedParams(*spec), e->params) << spec->name;
    ++count;
  }
  EXPECT_EQ(count, 5);
}

}  // namespace
}  // namespace duet::backend
