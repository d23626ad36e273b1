// Every CUDA kernel against the CPU reference kernel on random inputs, odd sizes included, as
// ggml's test-backend-ops does: the CPU gets the same bf16-rounded inputs, so the comparison
// measures only the GPU's arithmetic (fp32 accumulation in another order, fast math functions).
// Skips with a message where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/cpu/kernels.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace duet::kernels::cuda {
namespace {

using cpu::testing::RandomFloats;
using testing::AllClose;

std::vector<Bf16> ToBf16Bits(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = cpu::F32ToBf16(v[i]);
  return out;
}

// The values bf16 storage keeps of v.
std::vector<float> RoundedToBf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = cpu::Bf16ToF32(cpu::F32ToBf16(v[i]));
  return out;
}

TEST(CudaOps, EmbeddingGathersRows) {
  DUET_REQUIRE_CUDA_DEVICE();
  const std::int64_t vocab = 101, dim = 67;
  const std::vector<Bf16> table = ToBf16Bits(RandomFloats(vocab * dim, 1));
  const std::vector<std::int32_t> ids = {0, 100, 7, 7, 55};
  std::vector<float> expected(ids.size() * dim);
  cpu::Embedding(expected.data(), ids,
                 cpu::Weight{table.data(), cpu::WeightDtype::kBF16, vocab, dim});
  DeviceBuffer<Bf16> d_table(table);
  DeviceBuffer<std::int32_t> d_ids(ids);
  DeviceBuffer<float> d_out(expected.size());
  Embedding(d_out.get(), d_ids.get(), static_cast<std::int64_t>(ids.size()), d_table.get(), dim,
            nullptr);
  EXPECT_EQ(d_out.ToHost(), expected);  // a gather: exact
}

TEST(CudaOps, RmsNormMatchesCpu) {
  DUET_REQUIRE_CUDA_DEVICE();
  for (std::int64_t dim : {64, 67, 4096}) {
    const std::int64_t rows = 5;
    const std::vector<float> x = RandomFloats(rows * dim, 2, -3, 3);
    const std::vector<Bf16> gamma = ToBf16Bits(RandomFloats(dim, 3, 0.5f, 1.5f));
    std::vector<float> expected(x.size());
    cpu::RmsNorm(expected.data(), x.data(), rows, dim,
                 cpu::Weight{gamma.data(), cpu::WeightDtype::kBF16, 1, dim}, 1e-5f);
    DeviceBuffer<float> d_x(x), d_out(x.size());
    DeviceBuffer<Bf16> d_gamma(gamma);
    RmsNorm(d_out.get(), d_x.get(), rows, dim, d_gamma.get(), 1e-5f, nullptr);
    const std::vector<float> out = d_out.ToHost();
    EXPECT_TRUE(AllClose(out, expected, 1e-5, 1e-6)) << "dim " << dim;
    // The bf16 output (a matrix multiply's input) is the fp32 one rounded.
    DeviceBuffer<Bf16> d_out16(x.size());
    RmsNorm(d_out16.get(), d_x.get(), rows, dim, d_gamma.get(), 1e-5f, nullptr);
    EXPECT_EQ(d_out16.ToHost(), ToBf16Bits(out)) << "dim " << dim;
  }
}

TEST(CudaOps, RopeMatchesCpu) {
  DUET_REQUIRE_CUDA_DEVICE();
  for (std::int64_t head_dim : {16, 64, 128}) {
    const std::int64_t n = 7, heads = 6, kv_heads = 2;
    std::vector<float> q = RandomFloats(n * heads * head_dim, 4);
    std::vector<float> k = RandomFloats(n * kv_heads * head_dim, 5);
    const std::vector<std::int32_t> positions = {0, 1, 2, 17, 511, 4095, 8191};
    std::vector<float> inv_freq(head_dim / 2);
    for (std::int64_t i = 0; i < head_dim / 2; ++i)
      inv_freq[i] =
          std::pow(500000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(head_dim));
    DeviceBuffer<float> d_q(q), d_k(k), d_freq(inv_freq);
    DeviceBuffer<std::int32_t> d_pos(positions);
    cpu::Rope(q.data(), heads, k.data(), kv_heads, head_dim, positions, inv_freq.data(), 1.0f);
    Rope(d_q.get(), heads, d_k.get(), kv_heads, head_dim, d_pos.get(), n, d_freq.get(), 1.0f,
         nullptr);
    // Angles reach 8191 radians: cosf/sinf of one fp32 angle differ by a few ulp of the angle.
    EXPECT_TRUE(AllClose(d_q.ToHost(), q, 1e-4, 2e-4)) << "head_dim " << head_dim;
    EXPECT_TRUE(AllClose(d_k.ToHost(), k, 1e-4, 2e-4)) << "head_dim " << head_dim;
  }
}

TEST(CudaOps, SwiGluMatchesCpu) {
  DUET_REQUIRE_CUDA_DEVICE();
  const std::int64_t n = 3, inter = 173;
  const std::vector<float> gate = RandomFloats(n * inter, 6, -8, 8);
  const std::vector<float> up = RandomFloats(n * inter, 7, -2, 2);
  std::vector<float> expected(n * inter);
  cpu::SwiGlu(expected.data(), gate.data(), up.data(), n, inter);
  // gate_up: each row's gate values, then its up values, as one multiply by the stacked
  // weights makes them.
  std::vector<float> gate_up(n * 2 * inter);
  for (std::int64_t t = 0; t < n; ++t) {
    std::copy_n(gate.begin() + t * inter, inter, gate_up.begin() + t * 2 * inter);
    std::copy_n(up.begin() + t * inter, inter, gate_up.begin() + t * 2 * inter + inter);
  }
  DeviceBuffer<float> d_gate_up(gate_up), d_out(n * inter);
  SwiGluFused(d_out.get(), d_gate_up.get(), n, inter, nullptr);
  const std::vector<float> out = d_out.ToHost();
  EXPECT_TRUE(AllClose(out, expected, 1e-5, 1e-6));
  DeviceBuffer<Bf16> d_out16(n * inter);
  SwiGluFused(d_out16.get(), d_gate_up.get(), n, inter, nullptr);
  EXPECT_EQ(d_out16.ToHost(), ToBf16Bits(out));
}

TEST(CudaOps, MatMulMatchesCpuOnBf16) {
  DUET_REQUIRE_CUDA_DEVICE();
  cublasHandle_t handle;
  DUET_CUBLAS_CHECK(cublasCreate(&handle));
  // One row with k a multiple of 8 takes the matrix-vector kernel, the others cuBLAS.
  for (auto [m, n, k] : {std::array<std::int64_t, 3>{1, 37, 29},
                         {3, 37, 29},
                         {1, 300, 1024},
                         {5, 1000, 4096},
                         {8, 67, 520},
                         {64, 256, 512},
                         {17, 1000, 4096}}) {
    const std::vector<float> in = RoundedToBf16(RandomFloats(m * k, 8));
    const std::vector<Bf16> w = ToBf16Bits(RandomFloats(n * k, 9, -0.1f, 0.1f));
    std::vector<float> expected(m * n);
    cpu::MatMul(expected.data(), in.data(), m, cpu::Weight{w.data(), cpu::WeightDtype::kBF16, n, k},
                nullptr, nullptr);
    DeviceBuffer<Bf16> d_in(ToBf16Bits(in)), d_w(w);
    DeviceBuffer<float> d_out(m * n);
    MatMul(handle, d_out.get(), d_in.get(), m, d_w.get(), n, k);
    // Same products, fp32 sums in another order.
    EXPECT_TRUE(AllClose(d_out.ToHost(), expected, 1e-3, 1e-4)) << m << "x" << n << "x" << k;
    // Accumulating (a residual connection): out = residual + in x W^T.
    const std::vector<float> residual = RandomFloats(m * n, 10);
    DeviceBuffer<float> d_acc(residual);
    MatMul(handle, d_acc.get(), d_in.get(), m, d_w.get(), n, k, /*accumulate=*/true);
    std::vector<float> sum(expected.size());
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + expected[i];
    EXPECT_TRUE(AllClose(d_acc.ToHost(), sum, 1e-3, 1e-4)) << m << "x" << n << "x" << k;
  }
  cublasDestroy(handle);
}

TEST(CudaOps, ArgmaxIsGreedySampling) {
  DUET_REQUIRE_CUDA_DEVICE();
  for (const std::int64_t vocab : {1001, 1000, 128256}) {  // four logits a load where it divides
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    std::vector<std::vector<float>> rows;
    rows.push_back(RandomFloats(vocab, 10));
    std::vector<float> ties(vocab, 0.5f);
    ties[3] = ties[700] = 2.0f;  // the lower id wins
    rows.push_back(ties);
    std::vector<float> nans = RandomFloats(vocab, 11);
    nans[42] = std::numeric_limits<float>::quiet_NaN();
    nans[43] = 1e30f;
    rows.push_back(nans);
    rows.push_back(std::vector<float>(vocab, -std::numeric_limits<float>::infinity()));
    rows.push_back(std::vector<float>(vocab, std::numeric_limits<float>::quiet_NaN()));
    std::vector<float> flat;
    std::vector<std::int32_t> expected;
    for (const auto& r : rows) {
      flat.insert(flat.end(), r.begin(), r.end());
      expected.push_back(cpu::Sample(r.data(), static_cast<std::int32_t>(vocab), {}, 0));
    }
    DeviceBuffer<float> d_logits(flat);
    DeviceBuffer<std::int32_t> d_tokens(rows.size());
    Argmax(d_tokens.get(), d_logits.get(), static_cast<std::int64_t>(rows.size()), vocab, nullptr);
    EXPECT_EQ(d_tokens.ToHost(), expected);
  }
}

// A mixed batch: a prefill chunk continuing a cached prefix, a fresh prompt, and decode tokens
// (one with a long context), over shuffled, partially filled blocks; head sizes from 16 to 256
// and odd; query heads per KV head 1, 3, 4 and 8; the positions in one range or cut into
// several ranges merged afterwards (as decode batches of few tokens are).
TEST(CudaOps, PagedAttentionMatchesCpuOnMixedBatches) {
  DUET_REQUIRE_CUDA_DEVICE();
  struct Seq {
    std::int64_t context_before, tokens;
  };
  struct Shape {
    std::int64_t head_dim, heads;
    std::int32_t kv_heads;
  };
  const std::vector<Seq> seqs = {{300, 45}, {0, 19},  {1000, 1}, {5, 1},
                                 {127, 1},  {128, 1}, {2999, 1}};
  for (const Shape shape :
       {Shape{64, 8, 2}, {80, 8, 2}, {128, 8, 2}, {16, 6, 2}, {256, 16, 2}, {128, 4, 4}}) {
    const std::int64_t head_dim = shape.head_dim, heads = shape.heads;
    const std::int32_t kv_heads = shape.kv_heads;
    SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", heads " + std::to_string(heads) +
                 ", kv_heads " + std::to_string(kv_heads));
    const std::int32_t block_tokens = 16;
    const std::int64_t width = kv_heads * head_dim;
    std::int64_t total_blocks = 0;
    for (const Seq& s : seqs) total_blocks += (s.context_before + s.tokens + 15) / 16;
    const std::int64_t num_blocks = total_blocks + 7;
    // Block tables: a shuffled permutation of the pool, a disjoint slice per sequence.
    std::vector<std::int32_t> pool(static_cast<std::size_t>(num_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), std::mt19937(12));
    std::vector<std::vector<std::int32_t>> tables;
    std::size_t next = 0;
    for (const Seq& s : seqs) {
      const auto nb = static_cast<std::size_t>((s.context_before + s.tokens + 15) / 16);
      tables.emplace_back(pool.begin() + next, pool.begin() + next + nb);
      next += nb;
    }
    // The CPU cache holds the bf16-rounded values the GPU cache will hold.
    const std::size_t cache = static_cast<std::size_t>(num_blocks * block_tokens * width);
    std::vector<float> k_cache(cache), v_cache(cache);
    const cpu::PagedKvLayer cpu_layer{
        k_cache.data(), v_cache.data(), block_tokens, kv_heads, static_cast<std::int32_t>(head_dim),
        num_blocks};
    std::vector<float> q_all, expected, k_new_all, v_new_all;
    std::vector<std::int32_t> positions, table_offset, flat_tables;
    std::vector<std::int64_t> slots;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const Seq& s = seqs[i];
      const auto offset = static_cast<std::int32_t>(flat_tables.size());
      flat_tables.insert(flat_tables.end(), tables[i].begin(), tables[i].end());
      // The cached prefix, written directly; then this pass's tokens through WriteKv on both.
      const std::vector<float> k_old =
          RoundedToBf16(RandomFloats(s.context_before * width, 20 + i));
      const std::vector<float> v_old =
          RoundedToBf16(RandomFloats(s.context_before * width, 40 + i));
      cpu::WriteKv(cpu_layer, tables[i], 0, s.context_before, k_old.data(), v_old.data());
      const std::vector<float> k_new = RoundedToBf16(RandomFloats(s.tokens * width, 60 + i));
      const std::vector<float> v_new = RoundedToBf16(RandomFloats(s.tokens * width, 80 + i));
      cpu::WriteKv(cpu_layer, tables[i], s.context_before, s.tokens, k_new.data(), v_new.data());
      const std::vector<float> q = RandomFloats(s.tokens * heads * head_dim, 100 + i, -2, 2);
      std::vector<float> out(q.size());
      cpu::PagedAttention(out.data(), q.data(), s.tokens, heads, cpu_layer, tables[i],
                          s.context_before, scale, nullptr);
      q_all.insert(q_all.end(), q.begin(), q.end());
      expected.insert(expected.end(), out.begin(), out.end());
      k_new_all.insert(k_new_all.end(), k_new.begin(), k_new.end());
      v_new_all.insert(v_new_all.end(), v_new.begin(), v_new.end());
      for (std::int64_t t = 0; t < s.tokens; ++t) {
        const std::int64_t p = s.context_before + t;
        positions.push_back(static_cast<std::int32_t>(p));
        table_offset.push_back(offset);
        slots.push_back(static_cast<std::int64_t>(tables[i][p / block_tokens]) * block_tokens +
                        p % block_tokens);
      }
    }
    // The GPU cache starts with the prefixes (bf16 of the CPU cache), then gets this pass's
    // tokens through WriteKv.
    std::vector<float> k_prefix = k_cache, v_prefix = v_cache;
    for (std::size_t j = 0; j < slots.size(); ++j) {
      std::fill_n(k_prefix.begin() + slots[j] * width, width, 0.0f);
      std::fill_n(v_prefix.begin() + slots[j] * width, width, 0.0f);
    }
    DeviceBuffer<Bf16> d_k(ToBf16Bits(k_prefix)), d_v(ToBf16Bits(v_prefix));
    const PagedKvLayer layer{
        d_k.get(), d_v.get(), block_tokens, kv_heads, static_cast<std::int32_t>(head_dim),
        num_blocks};
    const auto n = static_cast<std::int64_t>(positions.size());
    DeviceBuffer<std::int64_t> d_slots(slots);
    DeviceBuffer<float> d_knew(k_new_all), d_vnew(v_new_all), d_q(q_all), d_out(q_all.size());
    DeviceBuffer<std::int32_t> d_tables(flat_tables), d_offset(table_offset), d_pos(positions);
    WriteKv(layer, d_slots.get(), n, d_knew.get(), d_vnew.get(), nullptr);
    EXPECT_EQ(d_k.ToHost(), ToBf16Bits(k_cache)) << "WriteKv stores exactly the bf16 of the CPU";
    const std::int64_t max_context = *std::max_element(positions.begin(), positions.end()) + 1;
    DeviceBuffer<float> workspace;
    for (int splits : {1, 3, 0}) {
      SCOPED_TRACE("splits " + std::to_string(splits));
      PagedAttention(d_out.get(), d_q.get(), n, nullptr, heads, layer, d_tables.get(),
                     d_offset.get(), d_pos.get(), max_context, scale, &workspace, splits, nullptr);
      const std::vector<float> out = d_out.ToHost();
      EXPECT_TRUE(AllClose(out, expected, 2e-4, 2e-5));
      // The bf16 output (the next multiply's input) is the fp32 one rounded.
      DeviceBuffer<Bf16> d_out16(q_all.size());
      PagedAttention(d_out16.get(), d_q.get(), n, nullptr, heads, layer, d_tables.get(),
                     d_offset.get(), d_pos.get(), max_context, scale, &workspace, splits, nullptr);
      EXPECT_EQ(d_out16.ToHost(), ToBf16Bits(out));
    }
    if (!PrefillAttentionSupports(head_dim)) continue;
    // As the CUDA model runs a mixed batch: the prefill chunks in tiles on the tensor cores
    // (bf16 products: bf16 tolerance), the decode tokens through the split kernel.
    std::vector<PrefillTile> tiles;
    std::vector<std::int32_t> decode;
    std::int32_t row = 0;
    for (const Seq& s : seqs) {
      const auto len = static_cast<std::int32_t>(s.tokens);
      if (len >= 16) {
        for (std::int32_t i = 0; i < len; i += kPrefillTileRows)
          tiles.push_back({row + i, std::min(kPrefillTileRows, len - i)});
      } else {
        for (std::int32_t i = 0; i < len; ++i) decode.push_back(row + i);
      }
      row += len;
    }
    DeviceBuffer<PrefillTile> d_tiles(tiles);
    DeviceBuffer<std::int32_t> d_decode(decode);
    DeviceBuffer<float> d_mixed(q_all.size());
    PrefillAttention(d_mixed.get(), d_q.get(), heads, layer, d_tables.get(), d_offset.get(),
                     d_pos.get(), d_tiles.get(), static_cast<std::int64_t>(tiles.size()), scale,
                     nullptr);
    PagedAttention(d_mixed.get(), d_q.get(), static_cast<std::int64_t>(decode.size()),
                   d_decode.get(), heads, layer, d_tables.get(), d_offset.get(), d_pos.get(),
                   max_context, scale, &workspace, 0, nullptr);
    EXPECT_TRUE(AllClose(d_mixed.ToHost(), expected, 1e-2, 2e-3));
  }
}

}  // namespace
}  // namespace duet::kernels::cuda
