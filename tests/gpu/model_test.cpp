// The CUDA model against the CPU model on the project's test model stored in bf16 (so both
// compute with the same weights): logits of a prompt within bf16 tolerance, greedy
// continuations through the shared engine loop token for token (which also reuses cached
// prefix blocks on the GPU), a chunked prefill giving the cold run's logits, and batched
// requests giving what single runs give. Skips with a message where no CUDA device is present.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "backend/cpu/cpu_model.h"
#include "backend/cuda/cuda_model.h"
#include "backend/engine/local_engine.h"
#include "backend/model/test_model.h"
#include "tests/gpu/cuda_test_util.h"

namespace duet::backend {
namespace {

namespace fs = std::filesystem;

class CudaParity : public ::testing::Test {
 protected:
  void SetUp() override {
    DUET_REQUIRE_CUDA_DEVICE();
    dir_ =
        (fs::temp_directory_path() / ("duet_cuda_parity_" + std::to_string(::getpid()))).string();
    TestModelOptions options;
    options.dtype = Dtype::kBF16;
    ASSERT_TRUE(WriteTestModel(dir_, options).ok());
    auto loaded = LoadModelDir(dir_);
    ASSERT_TRUE(loaded.ok()) << loaded.error();
    loaded_ = std::make_unique<LoadedModel>(std::move(*loaded));
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::unique_ptr<CpuModel> Cpu(std::int64_t blocks = 64) {
    CpuModelOptions options;
    options.num_blocks = blocks;
    options.threads = 2;
    auto m = CpuModel::Create(*loaded_, options);
    EXPECT_TRUE(m.ok()) << m.error();
    return std::move(*m);
  }
  std::unique_ptr<CudaModel> Cuda(std::int64_t blocks = 64) {
    auto m = CudaModel::Create(*loaded_, {blocks, 16, 0});
    EXPECT_TRUE(m.ok()) << m.error();
    return std::move(*m);
  }
  static std::vector<std::int32_t> Prompt(std::int32_t n, std::int32_t seed) {
    std::vector<std::int32_t> ids;
    for (std::int32_t i = 0; i < n; ++i) ids.push_back((i * 37 + seed * 101) % 500 + 3);
    return ids;
  }
  static std::vector<std::int32_t> Table(std::int32_t first, std::int32_t n) {
    std::vector<std::int32_t> t;
    for (std::int32_t i = 0; i < n; ++i) t.push_back(first + i);
    return t;
  }
  // Every row within 2% of the row's largest logit: the GPU rounds activations to bf16 before
  // each matrix multiply, the CPU keeps them in fp32.
  static ::testing::AssertionResult RowsClose(const std::vector<float>& gpu,
                                              const std::vector<float>& cpu, std::int32_t vocab) {
    if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes differ";
    for (std::size_t r = 0; r < cpu.size() / static_cast<std::size_t>(vocab); ++r) {
      float scale = 0, worst = 0;
      for (std::int32_t i = 0; i < vocab; ++i) {
        const std::size_t j = r * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(i);
        scale = std::max(scale, std::abs(cpu[j]));
        worst = std::max(worst, std::abs(gpu[j] - cpu[j]));
      }
      if (worst > 0.02f * scale)
        return ::testing::AssertionFailure()
               << "row " << r << ": max difference " << worst << " against logits up to " << scale;
    }
    return ::testing::AssertionSuccess();
  }

  std::string dir_;
  std::unique_ptr<LoadedModel> loaded_;
};

TEST_F(CudaParity, KvCacheIsWhatTheSimulatorPlans) {
  // bf16 on the device, sized by the one formula the simulator plans with.
  const auto cuda = Cuda(40);
  EXPECT_EQ(cuda->kv_cache_dtype(), models::Dtype::kBF16);
  const auto spec = models::LoadModelSpec(dir_);
  ASSERT_TRUE(spec.ok()) << spec.error();
  EXPECT_EQ(cuda->kv_cache_bytes(), 40 * 16 * spec->KvBytesPerToken(models::Dtype::kBF16));
  EXPECT_EQ(cuda->kv_cache_bytes(), 40 * 16 * cuda->kv_bytes_per_token());
}

TEST_F(CudaParity, LogitsMatchTheCpuModel) {
  const auto ids = Prompt(45, 1);
  const auto table = Table(3, 4);
  const SequenceChunk chunk{ids, 0, table, SequenceChunk::Logits::kAll};
  std::vector<float> cpu_logits, gpu_logits;
  EXPECT_TRUE(Cpu()->Forward({&chunk, 1}, &cpu_logits).ok());
  EXPECT_TRUE(Cuda()->Forward({&chunk, 1}, &gpu_logits).ok());
  EXPECT_TRUE(RowsClose(gpu_logits, cpu_logits, loaded_->config.vocab_size));
}

TEST_F(CudaParity, GreedyContinuationsMatchTheCpuPathTokenForToken) {
  auto cpu = Cpu();
  auto gpu = Cuda();
  LocalEngine cpu_engine(*cpu, {});
  LocalEngine gpu_engine(*gpu, {});
  for (std::int32_t seed : {1, 2, 3}) {
    const auto ids = Prompt(20 + 13 * seed, seed);
    const auto expected = cpu_engine.Generate({{ids, 24, {}}});
    const auto actual = gpu_engine.Generate({{ids, 24, {}}});
    ASSERT_EQ(actual.size(), 1u);
    EXPECT_EQ(actual[0].tokens, expected[0].tokens) << "prompt " << seed;
  }
}

TEST_F(CudaParity, ChunkedPrefillGivesTheColdLogits) {
  auto gpu = Cuda();
  const auto ids = Prompt(40, 4);
  const std::int32_t vocab = loaded_->config.vocab_size;
  std::vector<float> cold;
  const auto table = Table(0, 3);
  const SequenceChunk whole{ids, 0, table, SequenceChunk::Logits::kLast};
  EXPECT_TRUE(gpu->Forward({&whole, 1}, &cold).ok());
  // The same prompt in chunks of 16, 16 and 8 into other blocks.
  const auto table2 = Table(10, 3);
  std::vector<float> chunked;
  for (std::int64_t at = 0; at < 40; at += 16) {
    const std::int64_t len = std::min<std::int64_t>(16, 40 - at);
    const SequenceChunk part{
        std::span(ids).subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(len)), at,
        table2, at + len == 40 ? SequenceChunk::Logits::kLast : SequenceChunk::Logits::kNone};
    EXPECT_TRUE(gpu->Forward({&part, 1}, &chunked).ok());
  }
  ASSERT_EQ(chunked.size(), static_cast<std::size_t>(vocab));
  // bf16 precision: the tensor-core prefill rounds Q and the softmax weights to bf16, and the
  // chunks tile the prompt otherwise than the whole does.
  EXPECT_TRUE(kernels::cuda::testing::AllClose(chunked, cold, 1e-2, 2e-3));
}

TEST_F(CudaParity, BatchedRequestsMatchSingleRuns) {
  auto gpu = Cuda(128);
  LocalEngine engine(*gpu, {});
  std::vector<GenerationRequest> batch;
  for (std::int32_t seed : {5, 6, 7, 8}) batch.push_back({Prompt(10 + 7 * seed, seed), 12, {}});
  const auto together = engine.Generate(batch);
  ASSERT_EQ(together.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto single_model = Cuda(128);
    LocalEngine single(*single_model, {});
    EXPECT_EQ(single.Generate({batch[i]})[0].tokens, together[i].tokens) << "request " << i;
  }
}

TEST(CudaModelErrors, NoDeviceIsAClearError) {
  if (kernels::cuda::DeviceCount() > 0) GTEST_SKIP() << "a device is present: nothing to refuse";
  LoadedModel empty;
  auto m = CudaModel::Create(empty, {16, 16, 0});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().find("CUDA model: no CUDA device"), std::string::npos) << m.error();
}

}  // namespace
}  // namespace duet::backend
