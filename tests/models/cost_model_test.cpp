// Tests for the roofline step-cost model: hand-computed FLOPs and bytes on the tiny model,
// the regimes of real shapes (memory-bound decode, compute-bound prefill), monotonicity,
// tensor parallelism, and exact linearity of decode cost in context length.
#include "models/cost_model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "tests/models/bundled_specs.h"

namespace duet::models {
namespace {

RooflineCostModel Llama8bOnH100(int tp = 1) {
  RooflineOptions options;
  options.tp = tp;
  return RooflineCostModel(Model("llama-3.1-8b"), Gpu("h100-sxm"), options);
}

StepShape Decode(Tokens batch, Tokens context_each) {
  StepShape shape;
  shape.decode_tokens = batch;
  shape.decode_context_tokens = batch * context_each;
  return shape;
}

StepShape Prefill(Tokens tokens, Tokens context = 0) {
  StepShape shape;
  shape.prefill.push_back({tokens, context});
  return shape;
}

TEST(StepShapeTest, TokenCounts) {
  StepShape shape;
  shape.prefill = {{100, 0}, {28, 512}};
  shape.decode_tokens = 7;
  shape.decode_context_tokens = 7000;
  EXPECT_EQ(shape.PrefillTokens(), 128);
  EXPECT_EQ(shape.TotalTokens(), 135);
}

TEST(RooflineTest, EmptyStepCostsNothing) {
  RooflineCostModel model = Llama8bOnH100();
  EXPECT_EQ(model.StepTime(StepShape{}), 0.0);
  StepShape no_tokens;
  no_tokens.prefill = {{0, 100}};
  no_tokens.decode_context_tokens = 0;
  EXPECT_EQ(model.StepTime(no_tokens), 0.0);
  StepCostBreakdown cost = model.Breakdown(no_tokens);
  EXPECT_EQ(cost.flops, 0.0);
  EXPECT_EQ(cost.bytes, 0.0);
}

TEST(RooflineTest, HandComputedTinyModel) {
  // tiny-test: L=2, h=64, q=64, kv=32, I=128, V=512, bf16.
  ModelSpec spec = Model("tiny-test");
  HardwareSpec hw = Gpu("tiny-gpu");
  RooflineOptions options;
  RooflineCostModel model(spec, hw, options);
  StepShape shape;
  shape.prefill = {{10, 6}};
  shape.decode_tokens = 3;
  shape.decode_context_tokens = 300;
  const double tokens = 13;
  const double linear = 2 * 2 * tokens * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128);
  const double pairs = 10 * 6 + 10 * 11 / 2.0 + 300 + 3;
  const double attention = 2 * 4 * 64 * pairs;
  const double lm_head = 2 * 64 * 512 * (1 + 3);
  // Weights once, less the untied embedding table (512 x 64 bf16) of which only the 13 gathered
  // rows are read; KV read and written; activations.
  const double bytes = double(spec.WeightBytes()) - 512 * 64 * 2 + tokens * 64 * 2 +
                       (6 + 300 + tokens) * 256 + 2 * 2 * tokens * (4 * 64 + 2 * 128);
  StepCostBreakdown cost = model.Breakdown(shape);
  EXPECT_DOUBLE_EQ(cost.flops, linear + attention + lm_head);
  EXPECT_DOUBLE_EQ(cost.bytes, bytes);
  EXPECT_DOUBLE_EQ(cost.compute_s, cost.flops / (1e12 * 0.6));
  EXPECT_DOUBLE_EQ(cost.memory_s, cost.bytes / (100e9 * 0.8));
  EXPECT_EQ(cost.comm_s, 0.0);
  EXPECT_DOUBLE_EQ(cost.total_s, std::max(cost.compute_s, cost.memory_s) + 0.002);
  EXPECT_EQ(model.StepTime(shape), cost.total_s);
}

TEST(RooflineTest, TiedEmbeddingsAreReadAsTheLmHead) {
  // Tied, the one table is the LM head and every step reads it whole; untied, the LM head is
  // read whole and the embedding table only in the rows gathered.
  ModelSpec untied = Model("tiny-test");
  ModelSpec tied = untied;
  tied.tie_word_embeddings = true;
  ASSERT_EQ(untied.WeightBytes() - tied.WeightBytes(), 512 * 64 * 2);
  RooflineOptions options;
  StepShape shape;
  shape.decode_tokens = 1;
  const double untied_bytes =
      RooflineCostModel(untied, Gpu("tiny-gpu"), options).Breakdown(shape).bytes;
  const double tied_bytes =
      RooflineCostModel(tied, Gpu("tiny-gpu"), options).Breakdown(shape).bytes;
  EXPECT_DOUBLE_EQ(untied_bytes, tied_bytes);
}

TEST(RooflineTest, DecodeBatchOneIsMemoryBound) {
  RooflineCostModel model = Llama8bOnH100();
  StepCostBreakdown cost = model.Breakdown(Decode(1, 1024));
  EXPECT_GT(cost.memory_s, 10 * cost.compute_s);
  // 16.06 GB of weights less the 1.05 GB embedding table (one row gathered), plus 1k tokens of
  // KV: ~15.1 GB at 3.35 TB/s * 0.8 is 5.6 ms.
  EXPECT_NEAR(cost.memory_s, 15.1e9 / (3350e9 * 0.8), 0.1e-3);
  EXPECT_NEAR(cost.total_s, cost.memory_s + 0.002, 1e-12);
}

TEST(RooflineTest, LongPrefillIsComputeBound) {
  RooflineCostModel model = Llama8bOnH100();
  StepCostBreakdown cost = model.Breakdown(Prefill(8192));
  EXPECT_GT(cost.compute_s, 5 * cost.memory_s);
  // ~2 * 8.0e9 * 8192 linear FLOPs plus causal attention, at 593 TFLOP/s: ~0.24 s.
  EXPECT_GT(cost.total_s, 0.2);
  EXPECT_LT(cost.total_s, 0.3);
}

TEST(RooflineTest, MonotoneInTokensAndContext) {
  RooflineCostModel model = Llama8bOnH100();
  Seconds previous = 0;
  for (Tokens tokens = 1; tokens <= 16384; tokens *= 2) {
    Seconds t = model.StepTime(Prefill(tokens));
    EXPECT_GT(t, previous) << tokens;
    previous = t;
  }
  previous = 0;
  for (Tokens context = 0; context <= 65536; context = context * 2 + 1) {
    Seconds t = model.StepTime(Prefill(512, context));
    EXPECT_GT(t, previous) << context;
    previous = t;
  }
  previous = 0;
  for (Tokens batch = 1; batch <= 512; batch *= 2) {
    Seconds t = model.StepTime(Decode(batch, 2048));
    EXPECT_GT(t, previous) << batch;
    previous = t;
  }
  previous = 0;
  for (Tokens context = 1; context <= 131072; context *= 2) {
    Seconds t = model.StepTime(Decode(32, context));
    EXPECT_GT(t, previous) << context;
    previous = t;
  }
}

TEST(RooflineTest, ChunkingKeepsAttentionWork) {
  // One 1024-token chunk and two 512-token chunks (the second after the first) attend over the
  // same query-key pairs; the split adds one LM-head row and re-reads 512 tokens of KV.
  RooflineCostModel model = Llama8bOnH100();
  ModelSpec spec = Model("llama-3.1-8b");
  StepCostBreakdown whole = model.Breakdown(Prefill(1024));
  StepShape split;
  split.prefill = {{512, 0}, {512, 512}};
  StepCostBreakdown parts = model.Breakdown(split);
  EXPECT_NEAR(parts.flops - whole.flops, 2.0 * spec.hidden_size * spec.vocab_size, 1e3);
  EXPECT_NEAR(parts.bytes - whole.bytes, 512.0 * spec.KvBytesPerToken(), 1);
}

TEST(RooflineTest, TensorParallelHalvesWorkAndAddsComm) {
  RooflineCostModel tp1 = Llama8bOnH100(1);
  RooflineCostModel tp2 = Llama8bOnH100(2);
  for (const StepShape& shape : {Decode(64, 1024), Prefill(8192)}) {
    StepCostBreakdown one = tp1.Breakdown(shape);
    StepCostBreakdown two = tp2.Breakdown(shape);
    EXPECT_DOUBLE_EQ(two.compute_s, one.compute_s / 2);
    EXPECT_DOUBLE_EQ(two.memory_s, one.memory_s / 2);
    EXPECT_EQ(one.comm_s, 0.0);
    EXPECT_GT(two.comm_s, 0.0);
    // 64 all-reduces of at least the 10 us latency each.
    EXPECT_GE(two.comm_s, 64 * 10e-6);
    EXPECT_LT(two.total_s, one.total_s);
  }
  // A shape that names its tp is priced at that tp.
  StepShape shape = Decode(64, 1024);
  shape.tp = 2;
  EXPECT_EQ(tp1.StepTime(shape), tp2.StepTime(Decode(64, 1024)));
}

TEST(RooflineTest, DecodeIsLinearInContext) {
  // Sums of consecutive decode steps must be exact arithmetic: t(c) = a + b * c.
  RooflineCostModel model = Llama8bOnH100();
  for (Tokens batch : {1, 16, 128}) {
    StepShape shape;
    shape.decode_tokens = batch;
    const Tokens base = batch * 100;
    Seconds times[4];
    for (int i = 0; i < 4; ++i) {
      shape.decode_context_tokens = base + i * batch * 1000;
      times[i] = model.StepTime(shape);
    }
    const double step = times[1] - times[0];
    EXPECT_GT(step, 0);
    EXPECT_NEAR(times[2] - times[1], step, 1e-12 * times[3]);
    EXPECT_NEAR(times[3] - times[2], step, 1e-12 * times[3]);
  }
}

TEST(RooflineTest, PureAndCheapToCall) {
  RooflineCostModel model = Llama8bOnH100();
  StepShape shape;
  shape.prefill = {{256, 1024}, {128, 0}};
  shape.decode_tokens = 48;
  shape.decode_context_tokens = 48 * 3000;
  const Seconds first = model.StepTime(shape);
  constexpr int kCalls = 200000;
  double sum = 0;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) {
    shape.decode_context_tokens = 48 * 3000 + (i & 1);
    sum += model.StepTime(shape);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  shape.decode_context_tokens = 48 * 3000;
  EXPECT_EQ(model.StepTime(shape), first);
  EXPECT_GT(sum, 0);
  // Generous even for unoptimized builds; Release does it in a few milliseconds.
  EXPECT_LT(seconds, 2.0);
  std::printf("StepTime: %.1f ns per call\n", seconds / kCalls * 1e9);
}

TEST(RooflineTest, ReportedNumbers) {
  // The headline numbers for Llama-3.1-8B on one H100 (printed for the design notes).
  RooflineCostModel model = Llama8bOnH100();
  const Seconds batch1 = model.StepTime(Decode(1, 1024));
  const Seconds batch64 = model.StepTime(Decode(64, 1024));
  const Seconds prefill = model.StepTime(Prefill(8192));
  std::printf("8B/H100: decode b1@1k %.3f ms, decode b64@1k %.3f ms, prefill 8k %.1f ms\n",
              batch1 * 1e3, batch64 * 1e3, prefill * 1e3);
  EXPECT_LT(batch1, batch64);
  EXPECT_LT(batch64, 2 * batch1);  // decode batching is nearly free while memory-bound
  EXPECT_GT(prefill, 10 * batch64);
}

// A small Qwen3-MoE: 2 layers of hidden 64, 8 experts of width 32, 2 per token; 4 heads of 16
// with 2 KV heads; vocabulary 512; bf16.
ModelSpec SmallMoe(const nlohmann::json& mlp_only_layers = nlohmann::json::array()) {
  const nlohmann::json doc = {{"mlp_only_layers", mlp_only_layers},
                              {"model_type", "qwen3_moe"},
                              {"num_hidden_layers", 2},
                              {"hidden_size", 64},
                              {"num_attention_heads", 4},
                              {"num_key_value_heads", 2},
                              {"head_dim", 16},
                              {"intermediate_size", 128},
                              {"vocab_size", 512},
                              {"num_experts", 8},
                              {"num_experts_per_tok", 2},
                              {"moe_intermediate_size", 32}};
  Result<ModelSpec> spec = ParseModelSpec(doc, "small-moe.json");
  EXPECT_TRUE(spec.ok()) << spec.error();
  return spec.ok() ? *spec : ModelSpec{};
}

// Expert parallelism by hand: on G GPUs each sends its T/G tokens to their k experts, of which
// (G-1)/G live elsewhere, and gets the results back.
TEST(RooflineTest, ExpertParallelAllToAllBytesByHand) {
  const ModelSpec spec = SmallMoe();
  RooflineOptions options;
  options.tp = 4;
  const RooflineCostModel model(spec, Gpu("tiny-gpu"), options);
  const StepCostBreakdown cost = model.Breakdown(Prefill(100));
  // 2 layers * (dispatch + combine) * 100/4 tokens * 2 experts * 64 * 2 bytes * 3/4.
  EXPECT_DOUBLE_EQ(cost.a2a_bytes, 2 * 2 * 25 * 2 * 64 * 2 * 0.75);  // 19200
  // Communication: 4 all-reduces of the 100 tokens' hidden state in a ring of 4, then the
  // all-to-alls; each call pays the latency. NVLink 10 GB/s at 0.7.
  const double link = 10e9 * 0.7;
  const double allreduces = 4 * (2 * 0.75 * 100 * 64 * 2 / link + 10e-6);
  const double a2a = 19200 / link + 2 * 2 * 10e-6;
  EXPECT_DOUBLE_EQ(cost.comm_s, allreduces + a2a);
  // What the simulator moves over its network instead: the bytes at the link's full 10 GB/s.
  const StepCostModel::AllToAll traffic = model.ExpertTraffic(Prefill(100));
  EXPECT_DOUBLE_EQ(traffic.bytes_per_gpu, 19200);
  EXPECT_DOUBLE_EQ(traffic.seconds, 19200 / 10e9);
  // Data-parallel attention over the same 4 GPUs: no all-reduce, the same all-to-all.
  options.tp = 1;
  options.dp = 4;
  const StepCostBreakdown dp =
      RooflineCostModel(spec, Gpu("tiny-gpu"), options).Breakdown(Prefill(100));
  EXPECT_DOUBLE_EQ(dp.a2a_bytes, cost.a2a_bytes);
  EXPECT_DOUBLE_EQ(dp.comm_s, a2a);
  // The same 4 GPUs as two nodes of two: of each GPU's 3 peers, 2 are on the other node, so 2/3
  // of its bytes cross its NIC (2 GB/s) while 1/3 move over NVLink, at once.
  options.nodes = 2;
  options.nic_bw = 2e9;
  const RooflineCostModel two_nodes(spec, Gpu("tiny-gpu"), options);
  const StepCostModel::AllToAll across = two_nodes.ExpertTraffic(Prefill(100));
  EXPECT_DOUBLE_EQ(across.bytes_per_gpu, 19200);
  EXPECT_DOUBLE_EQ(across.inter_node_bytes_per_gpu, 12800);
  EXPECT_DOUBLE_EQ(across.seconds, 12800 / 2e9);
  EXPECT_DOUBLE_EQ(two_nodes.Breakdown(Prefill(100)).comm_s, 12800 / 2e9 / 0.7 + 2 * 2 * 10e-6);
  // One GPU holds every expert: nothing to send.
  const RooflineCostModel one(spec, Gpu("tiny-gpu"), RooflineOptions{});
  EXPECT_EQ(one.Breakdown(Prefill(100)).a2a_bytes, 0.0);
  EXPECT_EQ(one.ExpertTraffic(Prefill(100)).bytes_per_gpu, 0.0);
}

// A step reads the experts its tokens reach: k per layer for one token, all of them for many.
TEST(RooflineTest, MoeStepsReadTheExpertsTheirTokensReach) {
  const ModelSpec spec = SmallMoe();
  const RooflineCostModel one_gpu(spec, Gpu("tiny-gpu"), RooflineOptions{});
  EXPECT_DOUBLE_EQ(one_gpu.Breakdown(Decode(1, 100)).experts_read, 2 * 2);
  // 3 tokens: 8 * (1 - (6/8)^3) per layer.
  EXPECT_NEAR(one_gpu.Breakdown(Decode(3, 100)).experts_read, 2 * 8 * (1 - 0.421875), 1e-12);
  EXPECT_NEAR(one_gpu.Breakdown(Decode(500, 100)).experts_read, 2 * 8, 1e-9);
  // Bytes of one decode row by hand: weights but the embedding table and the routed experts,
  // 2 experts a layer of 3 * 64 * 32 bf16 weights, KV of 101 tokens (2 layers * 2 * 32 * 2
  // bytes), the embedding row and activations (2 layers of 4 * 64 + 2 * 2 * 32).
  const WeightBreakdown w = spec.Weights();
  const double expected = double(w.NonExpert().bytes - w.embedding.bytes) +
                          2 * 2 * (3 * 64 * 32 * 2) + 101 * 256 + 64 * 2 +
                          2 * (2 * 4 * 64 + 2 * 2 * 2 * 32);
  EXPECT_DOUBLE_EQ(one_gpu.Breakdown(Decode(1, 100)).bytes, expected);
  // Linear FLOPs of one token: attention (q, o 64x64; k, v 64x32), 2 experts, the router.
  const double linear = 2 * 2 * (2 * 64 * 64 + 2 * 64 * 32 + 2 * 3 * 64 * 32 + 64 * 8);
  const double attention = 2 * 4 * 64 * 101.0;
  EXPECT_DOUBLE_EQ(one_gpu.Breakdown(Decode(1, 100)).flops, linear + attention + 2 * 64 * 512);
  // More rows reach more experts, so a memory-bound MoE decode step grows with the batch
  // faster than a dense one, whose weights are read once whatever the batch.
  const RooflineCostModel dsv3(Model("deepseek-v3"), Gpu("h200"), RooflineOptions{8});
  const RooflineCostModel llama(Model("llama-3.1-70b"), Gpu("h200"), RooflineOptions{8});
  const double moe_growth = dsv3.StepTime(Decode(32, 1024)) / dsv3.StepTime(Decode(1, 1024));
  const double dense_growth = llama.StepTime(Decode(32, 1024)) / llama.StepTime(Decode(1, 1024));
  EXPECT_GT(moe_growth, 3.0);
  EXPECT_LT(dense_growth, 1.2);
  // A Qwen3-MoE config whose every layer is dense reads no experts and sends nothing.
  RooflineOptions tp2;
  tp2.tp = 2;
  const StepCostBreakdown dense =
      RooflineCostModel(SmallMoe({0, 1}), Gpu("tiny-gpu"), tp2).Breakdown(Decode(4, 100));
  EXPECT_EQ(dense.experts_read, 0.0);
  EXPECT_EQ(dense.a2a_bytes, 0.0);
  EXPECT_TRUE(std::isfinite(dense.total_s) && dense.total_s > 0);
}

// DeepSeek-V3's latent attention: decode runs absorbed over the 576-wide latent, prefill as
// multi-head attention of 192-wide keys and 128-wide values over expanded latents; TP splits
// neither the latent nor its reads, data-parallel attention does.
TEST(RooflineTest, LatentAttention) {
  const ModelSpec spec = Model("deepseek-v3");
  RooflineOptions tp8;
  tp8.tp = 8;
  const RooflineCostModel tp(spec, Gpu("h200"), tp8);
  const StepCostBreakdown short_ctx = tp.Breakdown(Decode(16, 1000));
  const StepCostBreakdown long_ctx = tp.Breakdown(Decode(16, 2000));
  // 16000 more context tokens: 61 layers * 2 * 128 heads * (576 + 512) FLOPs each, over 8
  // GPUs; all of their 70272 latent bytes on every GPU.
  EXPECT_NEAR(long_ctx.flops - short_ctx.flops, 16000.0 * 61 * 2 * 128 * 1088 / 8, 1.0);
  EXPECT_NEAR(long_ctx.bytes - short_ctx.bytes, 16000.0 * 70272, 1.0);
  // A prefill chunk after 1000 cached tokens: each of them is a pair of 61 * 2 * 128 * 320
  // FLOPs for each of the chunk's 10 tokens, and expanded once (61 * 2 * 512 * 128 * 256).
  const double more = tp.Breakdown(Prefill(10, 1000)).flops - tp.Breakdown(Prefill(10, 0)).flops;
  EXPECT_NEAR(more, (10000.0 * 61 * 2 * 128 * 320 + 1000.0 * 61 * 2 * 512 * 128 * 256) / 8, 1e3);
  RooflineOptions dp8;
  dp8.dp = 8;
  const RooflineCostModel dp(spec, Gpu("h200"), dp8);
  EXPECT_NEAR(dp.Breakdown(Decode(16, 2000)).bytes - dp.Breakdown(Decode(16, 1000)).bytes,
              16000.0 * 70272 / 8, 1.0);
}

// A verify step: each decode row's drafts pass through the model as more tokens (weights read
// once), attending to the row's context and causally to each other; the drafter adds one pass
// over the step's tokens and k - 1 passes of one token per row.
TEST(SpeculativeTest, VerifyStepsAndDrafterPassesByHand) {
  StepShape verify = Decode(4, 1000);
  verify.decode_draft_tokens = 4 * 3;
  const StepFeatures f = FeaturesOf(verify);
  EXPECT_EQ(f.tokens(), 16);
  EXPECT_EQ(f.logit_rows(), 16);
  // Each row's 4 queries: 4 * 1000 context pairs and 1 + 2 + 3 + 4 among themselves.
  EXPECT_DOUBLE_EQ(f.decode_pairs(), 4 * (4 * 1000 + 10));
  const RooflineCostModel target = Llama8bOnH100();
  const StepCostBreakdown plain = target.Breakdown(Decode(4, 1000));
  const StepCostBreakdown checked = target.Breakdown(verify);
  // Memory-bound: 12 more tokens cost their KV writes and activations, not the weights again.
  EXPECT_LT(checked.memory_s, plain.memory_s * 1.01);
  EXPECT_GT(checked.flops, 3.9 * plain.flops);

  RooflineOptions no_overhead;
  no_overhead.step_overhead = 0;
  const ModelSpec drafter_spec = Model("llama-3.2-1b");
  const RooflineCostModel drafter(drafter_spec, Gpu("h100-sxm"), no_overhead);
  const SpeculativeCostModel speculative(
      std::make_unique<RooflineCostModel>(Llama8bOnH100()),
      std::make_unique<RooflineCostModel>(drafter_spec, Gpu("h100-sxm"), no_overhead), 3);
  const StepShape second = Decode(4, 1000 + 1), third = Decode(4, 1000 + 2);
  EXPECT_DOUBLE_EQ(speculative.StepTime(verify),
                   target.StepTime(verify) + drafter.StepTime(verify) + drafter.StepTime(second) +
                       drafter.StepTime(third));
  // A prefill-only step: the drafter caches the prompt too, in one pass.
  EXPECT_DOUBLE_EQ(speculative.StepTime(Prefill(512)),
                   target.StepTime(Prefill(512)) + drafter.StepTime(Prefill(512)));
}

}  // namespace
}  // namespace duet::models
