// Tests for instance memory planning: KV capacity of real model/GPU pairs, tensor-parallel
// splits, and clear errors when the weights do not fit or the options are invalid.
#include <gtest/gtest.h>

#include <string>

#include "models/model_spec.h"
#include "tests/models/bundled_specs.h"

namespace duet::models {
namespace {

void ExpectErrorContains(const Result<InstanceMemory>& plan,
                         std::initializer_list<std::string> parts) {
  ASSERT_FALSE(plan.ok());
  for (const std::string& part : parts) {
    EXPECT_NE(plan.error().find(part), std::string::npos) << plan.error() << " lacks " << part;
  }
}

TEST(MemoryPlanTest, Llama8bOnH100) {
  ModelSpec model = Model("llama-3.1-8b");
  Result<InstanceMemory> plan = PlanInstanceMemory(model, Gpu("h100-sxm"), MemoryOptions{});
  ASSERT_TRUE(plan.ok()) << plan.error();
  // 0.9 * 80 GiB - 16.06 GB weights - 2 GiB reserve = 59.1 GB -> ~451k tokens of 128 KiB.
  const Bytes usable = static_cast<Bytes>(0.9 * 80 * kGiB);
  EXPECT_EQ(plan->weight_bytes_per_gpu, model.WeightBytes());
  EXPECT_EQ(plan->reserved_bytes_per_gpu, 2LL << 30);
  EXPECT_EQ(plan->kv_bytes_per_gpu, usable - model.WeightBytes() - (2LL << 30));
  EXPECT_EQ(plan->kv_tokens, plan->kv_bytes_per_gpu / 131072);
  EXPECT_GT(plan->kv_tokens, 400000);
  EXPECT_LT(plan->kv_tokens, 500000);
  EXPECT_EQ(plan->kv_blocks, plan->kv_tokens / 16);
}

TEST(MemoryPlanTest, TensorParallelSplitsWeightsAndMultipliesTokens) {
  ModelSpec model = Model("llama-3.1-8b");
  HardwareSpec hw = Gpu("h100-sxm");
  MemoryOptions tp1;
  MemoryOptions tp2;
  tp2.tp = 2;
  Result<InstanceMemory> one = PlanInstanceMemory(model, hw, tp1);
  Result<InstanceMemory> two = PlanInstanceMemory(model, hw, tp2);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(two->weight_bytes_per_gpu, model.WeightBytes() / 2);
  EXPECT_GT(two->kv_bytes_per_gpu, one->kv_bytes_per_gpu);
  // Each GPU stores half of every token, so tokens = 2 * per-GPU bytes / KvBytesPerToken.
  EXPECT_EQ(two->kv_tokens, two->kv_bytes_per_gpu / (model.KvBytesPerToken() / 2));
  EXPECT_GT(two->kv_tokens, 2 * one->kv_tokens);
}

TEST(MemoryPlanTest, Llama70bNeedsTensorParallelOnH100) {
  ModelSpec model = Model("llama-3.1-70b");
  HardwareSpec hw = Gpu("h100-sxm");
  ExpectErrorContains(PlanInstanceMemory(model, hw, MemoryOptions{}),
                      {"llama-3.1-70b", "141.1 GB of weights over tp=1", "does not fit on h100-sxm",
                       "77.3 GB usable per GPU"});
  MemoryOptions tp4;
  tp4.tp = 4;
  Result<InstanceMemory> plan = PlanInstanceMemory(model, hw, tp4);
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_GT(plan->kv_tokens, 400000);
}

TEST(MemoryPlanTest, Llama70bFitsOnTwoH200s) {
  MemoryOptions tp2;
  tp2.tp = 2;
  Result<InstanceMemory> plan = PlanInstanceMemory(Model("llama-3.1-70b"), Gpu("h200"), tp2);
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_GT(plan->kv_tokens, 100000);
}

// DeepSeek-V3 in fp8 on one node of 8 H200s, by hand: a TP group of 8 holds an eighth of
// everything but the routed experts, and an eighth of those (32 of 256 per layer); every GPU
// caches the whole 576-wide latent of each token (61 * 576 * 2 = 70272 bytes), so TP adds no
// KV capacity. With attention data-parallel over the 8 GPUs instead, each holds a whole copy
// of the non-expert weights but only its own requests' latents: 8 ranks of KV.
TEST(MemoryPlanTest, DeepSeekV3OnEightH200s) {
  const ModelSpec model = Model("deepseek-v3");
  const HardwareSpec hw = Gpu("h200");
  const WeightBreakdown w = model.Weights();
  const Bytes usable = static_cast<Bytes>(0.9 * 141 * kGiB);
  const Bytes reserve = 2LL << 30;
  MemoryOptions tp8;
  tp8.tp = 8;
  Result<InstanceMemory> plan = PlanInstanceMemory(model, hw, tp8);
  ASSERT_TRUE(plan.ok()) << plan.error();
  const Bytes tp_weights = (w.NonExpert().bytes + 7) / 8 + (w.routed_experts.bytes + 7) / 8;
  EXPECT_EQ(plan->weight_bytes_per_gpu, tp_weights);  // 84.1 GB
  EXPECT_EQ(plan->kv_bytes_per_gpu, usable - tp_weights - reserve);
  EXPECT_EQ(plan->kv_tokens, (usable - tp_weights - reserve) / 70272);  // 711044

  MemoryOptions dp8;
  dp8.dp = 8;
  plan = PlanInstanceMemory(model, hw, dp8);
  ASSERT_TRUE(plan.ok()) << plan.error();
  const Bytes dp_weights = w.NonExpert().bytes + (w.routed_experts.bytes + 7) / 8;
  EXPECT_EQ(plan->weight_bytes_per_gpu, dp_weights);                        // 100.8 GB
  EXPECT_EQ(plan->kv_tokens, (usable - dp_weights - reserve) / 70272 * 8);  // 3787520
  // TP does not need to divide the (128 nominal) KV heads: the latent is not split by head.
  MemoryOptions tp3;
  tp3.tp = 3;
  ExpectErrorContains(PlanInstanceMemory(model, hw, tp3),
                      {"tp=3 makes 3 GPUs", "do not divide the 256 routed experts"});
  // On 8 H100s it does not fit at all: 84.1 GB of weights per GPU.
  ExpectErrorContains(PlanInstanceMemory(model, Gpu("h100-sxm"), tp8),
                      {"deepseek-v3", "over tp=8", "does not fit on h100-sxm"});
}

// DeepSeek-V3 with its multi-token-prediction layer as the speculative drafter, on 8 H200s
// (TP8): one more MoE decoder layer, sharing the embedding and LM head, and one more layer of
// latent KV per token.
TEST(MemoryPlanTest, DeepSeekV3WithItsMtpDrafter) {
  const ModelSpec model = Model("deepseek-v3");
  ASSERT_EQ(model.mtp_layers, 1);
  const Drafter mtp{model.MtpDrafter(), true};
  const WeightBreakdown w = model.Weights(), d = mtp.model.Weights();
  // One of the 58 MoE layers' experts, and one layer's latent and rotary key.
  EXPECT_EQ(d.routed_experts.bytes * 58, w.routed_experts.bytes);
  EXPECT_EQ(mtp.model.KvBytesPerToken(), (512 + 64) * 2);
  MemoryOptions tp8;
  tp8.tp = 8;
  const Result<InstanceMemory> without = PlanInstanceMemory(model, Gpu("h200"), tp8);
  const Result<InstanceMemory> with = PlanInstanceMemory(model, Gpu("h200"), tp8, &mtp);
  ASSERT_TRUE(without.ok() && with.ok());
  const Bytes mtp_per_gpu = (d.NonExpert().bytes - d.embedding.bytes - d.lm_head.bytes + 7) / 8 +
                            (d.routed_experts.bytes + 7) / 8;
  EXPECT_EQ(with->weight_bytes_per_gpu, without->weight_bytes_per_gpu + mtp_per_gpu);
  EXPECT_EQ(with->kv_tokens, with->kv_bytes_per_gpu / (62 * 1152));
  // A model without such layers has no drafter of its own: a cluster file refuses "mtp".
  EXPECT_EQ(Model("qwen3-235b-a22b").mtp_layers, 0);
}

// Qwen3-235B-A22B in bf16 on 4 H200s: GQA's 4 KV heads split 4 ways; experts 32 a GPU.
TEST(MemoryPlanTest, Qwen3MoeSplitsKvHeadsAndExperts) {
  const ModelSpec model = Model("qwen3-235b-a22b");
  MemoryOptions tp4;
  tp4.tp = 4;
  Result<InstanceMemory> plan = PlanInstanceMemory(model, Gpu("h200"), tp4);
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_EQ(plan->weight_bytes_per_gpu, (model.WeightBytes() + 3) / 4);
  EXPECT_EQ(plan->kv_tokens, plan->kv_bytes_per_gpu / (2 * 94 * 1 * 128 * 2));
  MemoryOptions tp2dp2 = tp4;
  tp2dp2.tp = 2;
  tp2dp2.dp = 2;  // non-expert weights twice over: less KV per GPU, tokens for two ranks
  Result<InstanceMemory> mixed = PlanInstanceMemory(model, Gpu("h200"), tp2dp2);
  ASSERT_TRUE(mixed.ok()) << mixed.error();
  const WeightBreakdown w = model.Weights();
  EXPECT_EQ(mixed->weight_bytes_per_gpu,
            (w.NonExpert().bytes + 1) / 2 + (w.routed_experts.bytes + 3) / 4);
  EXPECT_EQ(mixed->kv_tokens, mixed->kv_bytes_per_gpu / (2 * 94 * 2 * 128 * 2) * 2);
  // On 8 H100s: each GPU holds one of the 4 KV heads, replicated twice (as on 4 GPUs).
  MemoryOptions tp8 = tp4;
  tp8.tp = 8;
  Result<InstanceMemory> h100 = PlanInstanceMemory(model, Gpu("h100-sxm"), tp8);
  ASSERT_TRUE(h100.ok()) << h100.error();
  EXPECT_EQ(h100->weight_bytes_per_gpu, (model.WeightBytes() + 7) / 8);
  EXPECT_EQ(h100->kv_tokens, h100->kv_bytes_per_gpu / (2 * 94 * 1 * 128 * 2));
  tp8.tp = 6;
  ExpectErrorContains(PlanInstanceMemory(model, Gpu("h200"), tp8),
                      {"tp=6 and num_key_value_heads=4 do not divide one another"});
  MemoryOptions dp0;
  dp0.dp = 0;
  ExpectErrorContains(PlanInstanceMemory(model, Gpu("h200"), dp0), {"dp must be in [1, 4096]"});
}

TEST(MemoryPlanTest, TinyModelOnTinyGpu) {
  MemoryOptions options;
  options.reserved_bytes_per_gpu = 64LL << 20;
  Result<InstanceMemory> plan = PlanInstanceMemory(Model("tiny-test"), Gpu("tiny-gpu"), options);
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_GT(plan->kv_blocks, 1000);
  // The default 2 GiB reserve does not fit in 1 GiB.
  ExpectErrorContains(PlanInstanceMemory(Model("tiny-test"), Gpu("tiny-gpu"), MemoryOptions{}),
                      {"tiny-test", "does not fit on tiny-gpu", "reserved"});
}

TEST(MemoryPlanTest, TpMustDivideKvHeads) {
  MemoryOptions options;
  options.tp = 3;
  ExpectErrorContains(PlanInstanceMemory(Model("llama-3.1-8b"), Gpu("h100-sxm"), options),
                      {"llama-3.1-8b", "tp=3", "num_key_value_heads=8"});
  options.tp = 12;
  ExpectErrorContains(PlanInstanceMemory(Model("llama-3.1-8b"), Gpu("h100-sxm"), options),
                      {"tp=12", "do not divide one another"});
  // More GPUs than KV heads: one head each, replicated; each GPU stores 1/8 of every token.
  options.tp = 16;
  Result<InstanceMemory> plan = PlanInstanceMemory(Model("llama-3.1-8b"), Gpu("h100-sxm"), options);
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_EQ(plan->kv_tokens, plan->kv_bytes_per_gpu / (131072 / 8));
}

TEST(MemoryPlanTest, LessThanOneBlock) {
  ModelSpec model = Model("tiny-test");
  HardwareSpec hw = Gpu("tiny-gpu");
  MemoryOptions options;
  options.gpu_memory_utilization = 1.0;
  // Leave room for exactly 15 tokens (256 B each) after the weights.
  options.reserved_bytes_per_gpu = hw.hbm_bytes - model.WeightBytes() - 15 * 256;
  ExpectErrorContains(PlanInstanceMemory(model, hw, options),
                      {"tiny-test", "15 tokens", "less than one block of 16"});
  options.block_tokens = 15;
  Result<InstanceMemory> plan = PlanInstanceMemory(model, hw, options);
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_EQ(plan->kv_tokens, 15);
  EXPECT_EQ(plan->kv_blocks, 1);
}

TEST(MemoryPlanTest, InvalidOptions) {
  ModelSpec model = Model("llama-3.1-8b");
  HardwareSpec hw = Gpu("h100-sxm");
  MemoryOptions options;
  options.gpu_memory_utilization = 0;
  ExpectErrorContains(PlanInstanceMemory(model, hw, options), {"gpu_memory_utilization"});
  options.gpu_memory_utilization = 1.5;
  ExpectErrorContains(PlanInstanceMemory(model, hw, options), {"gpu_memory_utilization"});
  options = MemoryOptions{};
  options.tp = 0;
  ExpectErrorContains(PlanInstanceMemory(model, hw, options), {"tp must be >= 1"});
  options = MemoryOptions{};
  options.block_tokens = 0;
  ExpectErrorContains(PlanInstanceMemory(model, hw, options), {"block_tokens"});
  options = MemoryOptions{};
  options.reserved_bytes_per_gpu = -1;
  ExpectErrorContains(PlanInstanceMemory(model, hw, options), {"reserved"});
}

TEST(MemoryPlanTest, HugeReserveDoesNotOverflow) {
  MemoryOptions options;
  options.reserved_bytes_per_gpu = INT64_MAX;
  ExpectErrorContains(PlanInstanceMemory(Model("llama-3.1-70b"), Gpu("h100-sxm"), options),
                      {"does not fit"});
}

}  // namespace
}  // namespace duet::models
