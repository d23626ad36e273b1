// Paged KV cache and PagedAttention against a double-precision reference over contiguous K/V:
// GQA ratios 1/2/4, head_dim 16/64/128, odd block sizes, out-of-order and non-contiguous block
// tables, partially filled last blocks (unused slots and blocks hold NaN, so any stray read
// shows), causality, chunked prefill equal to one-shot prefill, and thread-count independence.
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "tests/kernels/kernel_test_util.h"

namespace duet::kernels::cpu {
namespace {

using testing::IsaTest;
using testing::RandomFloats;

// How the fixture stores its cache: dtype, and either one K and one V array (layers == 0) or a
// block-major cache of `layers` layers, of which the fixture's is `layer`.
struct Layout {
  WeightDtype dtype = WeightDtype::kF32;
  std::int64_t layers = 0;
  std::int64_t layer = 0;
};

// A cache of NaN-filled blocks and one sequence whose table lists shuffled, non-contiguous
// blocks; k_ref / v_ref hold the same rows contiguously [position][kv_head][head_dim], already
// rounded to the cache's dtype (so the cache holds them exactly).
struct Fixture {
  std::int64_t heads, kv_heads, head_dim, block_tokens, positions;
  Layout layout;
  std::vector<unsigned char> storage;
  PagedKvLayer layer;
  std::vector<std::int32_t> table;
  std::vector<float> k_ref, v_ref;

  Fixture(std::int64_t heads_, std::int64_t kv_heads_, std::int64_t head_dim_,
          std::int64_t block_tokens_, std::int64_t positions_, std::uint32_t seed,
          Layout layout_ = {})
      : heads(heads_),
        kv_heads(kv_heads_),
        head_dim(head_dim_),
        block_tokens(block_tokens_),
        positions(positions_),
        layout(layout_) {
    const std::int64_t blocks_needed = (positions + block_tokens - 1) / block_tokens;
    const std::int64_t num_blocks = 2 * blocks_needed + 3;
    const std::int64_t block_elements = block_tokens * kv_heads * head_dim;
    const std::int64_t per_block = 2 * std::max<std::int64_t>(layout.layers, 1) * block_elements;
    const std::size_t bytes = WeightDtypeBytes(layout.dtype);
    storage.resize(static_cast<std::size_t>(num_blocks * per_block) * bytes);
    const float nan = std::nanf("");
    for (std::size_t e = 0; e < storage.size() / bytes; ++e) {
      ConvertFromF32(&nan, 1, layout.dtype, storage.data() + e * bytes);
    }
    unsigned char* k = storage.data();
    unsigned char* v =
        storage.data() + static_cast<std::size_t>(num_blocks * block_elements) * bytes;
    if (layout.layers > 0) {
      k = storage.data() + static_cast<std::size_t>(2 * layout.layer * block_elements) * bytes;
      v = k + static_cast<std::size_t>(block_elements) * bytes;
    }
    layer = PagedKvLayer{k,
                         v,
                         static_cast<std::int32_t>(block_tokens),
                         static_cast<std::int32_t>(kv_heads),
                         static_cast<std::int32_t>(head_dim),
                         num_blocks,
                         layout.dtype,
                         layout.layers > 0 ? per_block : 0};
    std::vector<std::int32_t> all(static_cast<std::size_t>(num_blocks));
    std::iota(all.begin(), all.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(all.begin(), all.end(), rng);
    table.assign(all.begin(), all.begin() + blocks_needed);
    const std::size_t row = static_cast<std::size_t>(kv_heads * head_dim);
    k_ref = RandomFloats(static_cast<std::size_t>(positions) * row, seed + 1, -2, 2);
    v_ref = RandomFloats(static_cast<std::size_t>(positions) * row, seed + 2, -2, 2);
    for (std::vector<float>* ref : {&k_ref, &v_ref}) {
      std::vector<std::uint32_t> rounded(ref->size());
      ConvertFromF32(ref->data(), static_cast<std::int64_t>(ref->size()), layout.dtype,
                     rounded.data());
      ConvertToF32(rounded.data(), layout.dtype, static_cast<std::int64_t>(ref->size()),
                   ref->data());
    }
  }

  // The value stored for position p, element e of its row, in the K (or V) cache.
  float Stored(bool key, std::int64_t p, std::int64_t e) const {
    const std::int64_t offset =
        table[p / block_tokens] * layer.stride() + (p % block_tokens) * row() + e;
    float value = 0.0f;
    ConvertToF32(static_cast<const unsigned char*>(key ? layer.k : layer.v) +
                     offset * static_cast<std::int64_t>(WeightDtypeBytes(layout.dtype)),
                 layout.dtype, 1, &value);
    return value;
  }

  std::int64_t row() const { return kv_heads * head_dim; }

  // Writes reference rows [first, first + count) into the cache.
  void Write(std::int64_t first, std::int64_t count) {
    WriteKv(layer, table, first, count, k_ref.data() + first * row(), v_ref.data() + first * row());
  }

  // Reference attention of q [n][heads][head_dim] for tokens at context_before + i.
  std::vector<double> Reference(const std::vector<float>& q, std::int64_t n,
                                std::int64_t context_before, double scale) const {
    std::vector<double> out(static_cast<std::size_t>(n * heads * head_dim), 0.0);
    const std::int64_t group = heads / kv_heads;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t visible = context_before + i + 1;
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t g = h / group;
        const float* qh = q.data() + (i * heads + h) * head_dim;
        std::vector<double> s(static_cast<std::size_t>(visible));
        for (std::int64_t p = 0; p < visible; ++p) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < head_dim; ++d) {
            dot += double(qh[d]) * k_ref[(p * kv_heads + g) * head_dim + d];
          }
          s[p] = dot * scale;
        }
        const double max_s = *std::max_element(s.begin(), s.end());
        double sum = 0.0;
        for (double& x : s) sum += (x = std::exp(x - max_s));
        double* o = out.data() + (i * heads + h) * head_dim;
        for (std::int64_t p = 0; p < visible; ++p) {
          for (std::int64_t d = 0; d < head_dim; ++d) {
            o[d] += s[p] / sum * v_ref[(p * kv_heads + g) * head_dim + d];
          }
        }
      }
    }
    return out;
  }
};

// The tolerance for tiled attention over a 16-bit cache, whose products read queries and
// probabilities rounded to 16 bits (a few bf16 ulps of the output); 1e-5 everywhere else.
constexpr double kRoundedInputsTolerance = 8e-3;

double Tolerance(std::int64_t n_tokens, WeightDtype dtype) {
  return PagedAttentionIsTiled(n_tokens, dtype) && dtype != WeightDtype::kF32
             ? kRoundedInputsTolerance
             : 1e-5;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::string& label, double tolerance = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  int failures = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tolerance * (1.0 + std::fabs(want[i]))) &&
        ++failures <= 5) {
      ADD_FAILURE() << label << " [" << i << "] = " << got[i] << ", want " << want[i];
    }
  }
}

class AttentionTest : public IsaTest {};

// fp32 per-layer arrays, and block-major bf16 and f16 caches of three layers (the middle one).
const Layout kLayouts[] = {
    {WeightDtype::kF32, 0, 0}, {WeightDtype::kBF16, 3, 1}, {WeightDtype::kF16, 3, 1}};

std::string LayoutName(const Layout& layout) {
  return std::string(WeightDtypeName(layout.dtype)) +
         (layout.layers > 0 ? " block-major" : " per-layer");
}

TEST_P(AttentionTest, WriteKvPlacesRowsInTheirBlocksAndSlots) {
  for (const Layout& layout : kLayouts) {
    SCOPED_TRACE(LayoutName(layout));
    Fixture f(2, 2, 16, 5, 23, 1, layout);
    f.Write(0, 23);
    for (std::int64_t p = 0; p < 23; ++p) {
      for (std::int64_t e = 0; e < f.row(); ++e) {
        ASSERT_EQ(f.Stored(true, p, e), f.k_ref[p * f.row() + e]);
        ASSERT_EQ(f.Stored(false, p, e), f.v_ref[p * f.row() + e]);
      }
    }
    // Slots 3 and 4 of the last block were not written.
    EXPECT_TRUE(std::isnan(f.Stored(true, 23, 0)));
    EXPECT_TRUE(std::isnan(f.Stored(false, 24, 0)));
    // Nor was any other layer of a block-major cache.
    std::int64_t written = 0;
    const std::size_t bytes = WeightDtypeBytes(layout.dtype);
    for (std::size_t e = 0; e < f.storage.size() / bytes; ++e) {
      float value = 0.0f;
      ConvertToF32(f.storage.data() + e * bytes, layout.dtype, 1, &value);
      written += std::isnan(value) ? 0 : 1;
    }
    EXPECT_EQ(written, 2 * 23 * f.row());
  }
}

// The 16-bit and block-major caches give the reference attention of their (rounded) contents,
// in prefill over several tiles, a chunk late in the context, and decode over many partitions,
// bit-identically for any thread count.
TEST_P(AttentionTest, SixteenBitAndBlockMajorCachesMatchReference) {
  ThreadPool pool(2);
  std::uint32_t seed = 70;
  for (const Layout& layout : kLayouts) {
    for (const auto& [head_dim, block_tokens] :
         {std::pair<std::int64_t, std::int64_t>{64, 16}, {20, 5}}) {
      const std::string label = LayoutName(layout) + " head_dim=" + std::to_string(head_dim);
      const std::int64_t heads = 8, kv_heads = 2, context = 300, prompt = 150, chunk = 40;
      Fixture f(heads, kv_heads, head_dim, block_tokens, context, ++seed, layout);
      f.Write(0, context);
      const double scale = 1.0 / std::sqrt(double(head_dim));
      const auto q = RandomFloats(static_cast<std::size_t>(prompt * heads * head_dim), ++seed);
      std::vector<float> out(q.size()), single(q.size());
      PagedAttention(out.data(), q.data(), prompt, heads, f.layer, f.table, 0, float(scale), &pool);
      ExpectNear(out, f.Reference(q, prompt, 0, scale), "prefill " + label,
                 Tolerance(prompt, layout.dtype));
      PagedAttention(single.data(), q.data(), prompt, heads, f.layer, f.table, 0, float(scale),
                     nullptr);
      EXPECT_EQ(std::memcmp(single.data(), out.data(), out.size() * sizeof(float)), 0) << label;
      out.resize(static_cast<std::size_t>(chunk * heads * head_dim));
      PagedAttention(out.data(), q.data(), chunk, heads, f.layer, f.table, 260, float(scale),
                     &pool);
      ExpectNear(out, f.Reference(q, chunk, 260, scale), "chunk " + label,
                 Tolerance(chunk, layout.dtype));
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        out.resize(static_cast<std::size_t>(heads * head_dim));
        PagedAttention(out.data(), q.data(), 1, heads, f.layer, f.table, context - 1, float(scale),
                       p);
        ExpectNear(out, f.Reference(q, 1, context - 1, scale), "decode " + label);
      }
    }
  }
}

// Where the library is available, prompts of kTiledMinTokens or more take the tiled path over
// fp32 and bf16 caches (so the tests above exercise it); fewer tokens, f16 caches and the
// baseline path never do.
TEST_P(AttentionTest, PrefillIsTiledWhereTheLibraryIs) {
  EXPECT_FALSE(PagedAttentionIsTiled(kTiledMinTokens - 1, WeightDtype::kF32));
  EXPECT_FALSE(PagedAttentionIsTiled(kTiledMinTokens, WeightDtype::kF16));
  if (GetParam() == Isa::kBaseline) {
    EXPECT_FALSE(PagedAttentionIsTiled(kTiledMinTokens, WeightDtype::kF32));
    return;
  }
  if (!MatMulUsesLibrary(kLibraryMinRows, WeightDtype::kBF16)) {
    GTEST_SKIP() << "oneDNN has no optimised bf16 matmul on this CPU";
  }
  EXPECT_TRUE(PagedAttentionIsTiled(kTiledMinTokens, WeightDtype::kF32));
  EXPECT_TRUE(PagedAttentionIsTiled(kTiledMinTokens, WeightDtype::kBF16));
}

TEST_P(AttentionTest, PrefillAndDecodeMatchReferenceAcrossGqaRatiosAndHeadDims) {
  ThreadPool pool(3);
  std::uint32_t seed = 10;
  for (std::int64_t head_dim : {16, 64, 128}) {
    for (std::int64_t ratio : {1, 2, 4}) {
      for (std::int64_t block_tokens : {16, 7}) {
        const std::int64_t kv_heads = 2, heads = kv_heads * ratio;
        const std::string label = "head_dim=" + std::to_string(head_dim) +
                                  " ratio=" + std::to_string(ratio) +
                                  " block=" + std::to_string(block_tokens);
        // Prefill of 37 tokens, then one decode token at position 37 (both leave the last block
        // partially filled).
        Fixture f(heads, kv_heads, head_dim, block_tokens, 38, ++seed);
        const double scale = 1.0 / std::sqrt(double(head_dim));
        f.Write(0, 37);
        const auto q = RandomFloats(static_cast<std::size_t>(37 * heads * head_dim), ++seed);
        std::vector<float> out(q.size());
        PagedAttention(out.data(), q.data(), 37, heads, f.layer, f.table, 0, float(scale), &pool);
        ExpectNear(out, f.Reference(q, 37, 0, scale), "prefill " + label);

        f.Write(37, 1);
        const auto q1 = RandomFloats(static_cast<std::size_t>(heads * head_dim), ++seed);
        std::vector<float> out1(q1.size());
        PagedAttention(out1.data(), q1.data(), 1, heads, f.layer, f.table, 37, float(scale), &pool);
        ExpectNear(out1, f.Reference(q1, 1, 37, scale), "decode " + label);
      }
    }
  }
}

TEST_P(AttentionTest, LongContextsSpanningManyPartitionsMatchReference) {
  // Contexts beyond the 128-position softmax partitions, odd block sizes and a head_dim that is
  // not a multiple of 8 (vector tails); decode with and without a pool (which take different
  // work splits), and a prefill chunk starting mid-context.
  std::uint32_t seed = 40;
  for (const auto& [head_dim, block_tokens] :
       {std::pair<std::int64_t, std::int64_t>{64, 16}, {20, 5}, {128, 1}, {16, 33}}) {
    const std::int64_t heads = 8, kv_heads = 2, context = 1000;
    Fixture f(heads, kv_heads, head_dim, block_tokens, context, ++seed);
    f.Write(0, context);
    const double scale = 1.0 / std::sqrt(double(head_dim));
    const std::string label =
        "head_dim=" + std::to_string(head_dim) + " block=" + std::to_string(block_tokens);
    ThreadPool pool(2);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      const auto q = RandomFloats(static_cast<std::size_t>(heads * head_dim), ++seed);
      std::vector<float> out(q.size());
      PagedAttention(out.data(), q.data(), 1, heads, f.layer, f.table, context - 1, float(scale),
                     p);
      ExpectNear(out, f.Reference(q, 1, context - 1, scale), "decode " + label);
    }
    const auto q = RandomFloats(static_cast<std::size_t>(40 * heads * head_dim), ++seed);
    std::vector<float> out(q.size());
    PagedAttention(out.data(), q.data(), 40, heads, f.layer, f.table, 250, float(scale), &pool);
    ExpectNear(out, f.Reference(q, 40, 250, scale), "chunk " + label);
  }
}

TEST_P(AttentionTest, LargeScoresStayFinite) {
  // Scores of several hundred would overflow exp without max subtraction.
  Fixture f(4, 2, 64, 16, 40, 3);
  for (float& x : f.k_ref) x *= 20.0f;
  f.Write(0, 40);
  auto q = RandomFloats(static_cast<std::size_t>(4 * 64), 4, -20, 20);
  std::vector<float> out(q.size());
  PagedAttention(out.data(), q.data(), 1, 4, f.layer, f.table, 39, 0.125f, nullptr);
  ExpectNear(out, f.Reference(q, 1, 39, 0.125), "large scores");
}

TEST_P(AttentionTest, FutureKeysAndValuesDoNotChangeEarlierOutputs) {
  Fixture f(4, 2, 16, 4, 20, 5);
  f.Write(0, 20);
  const auto q = RandomFloats(static_cast<std::size_t>(20 * 4 * 16), 6);
  std::vector<float> before(q.size()), after(q.size());
  PagedAttention(before.data(), q.data(), 20, 4, f.layer, f.table, 0, 0.25f, nullptr);
  // Perturb position 12 in the cache (both K and V, every KV head).
  for (std::int64_t e = 0; e < f.row(); ++e) {
    f.k_ref[12 * f.row() + e] += 3.0f;
    f.v_ref[12 * f.row() + e] -= 5.0f;
  }
  f.Write(12, 1);
  PagedAttention(after.data(), q.data(), 20, 4, f.layer, f.table, 0, 0.25f, nullptr);
  const std::size_t token_floats = 4 * 16;
  for (std::size_t i = 0; i < 12 * token_floats; ++i) ASSERT_EQ(before[i], after[i]) << i;
  for (std::int64_t t = 12; t < 20; ++t) {
    EXPECT_NE(std::memcmp(before.data() + t * token_floats, after.data() + t * token_floats,
                          token_floats * sizeof(float)),
              0)
        << "token " << t << " should see position 12";
  }
}

TEST_P(AttentionTest, ChunkedPrefillEqualsOneShot) {
  Fixture f(8, 2, 64, 16, 37, 7);
  const auto q = RandomFloats(static_cast<std::size_t>(37 * 8 * 64), 8);
  const float scale = 0.125f;
  std::vector<float> one_shot(q.size()), chunked(q.size());
  f.Write(0, 37);
  PagedAttention(one_shot.data(), q.data(), 37, 8, f.layer, f.table, 0, scale, nullptr);
  ExpectNear(one_shot, f.Reference(q, 37, 0, scale), "one shot");

  // A fresh cache filled chunk by chunk: each chunk writes its K/V, then attends with
  // context_before = tokens already cached.
  Fixture g(8, 2, 64, 16, 37, 7);
  ThreadPool pool(2);
  std::int64_t done = 0;
  for (std::int64_t chunk : {10, 20, 7}) {
    g.Write(done, chunk);
    const std::size_t offset = static_cast<std::size_t>(done * 8 * 64);
    PagedAttention(chunked.data() + offset, q.data() + offset, chunk, 8, g.layer, g.table, done,
                   scale, &pool);
    done += chunk;
  }
  if (PagedAttentionIsTiled(37, WeightDtype::kF32)) {
    // The one-shot pass was tiled, the chunks were not: equal within rounding.
    std::vector<double> want(one_shot.begin(), one_shot.end());
    ExpectNear(chunked, want, "chunked vs one shot");
  } else {
    EXPECT_EQ(std::memcmp(chunked.data(), one_shot.data(), q.size() * sizeof(float)), 0);
  }
}

TEST_P(AttentionTest, ResultsAreBitIdenticalForAnyThreadCount) {
  Fixture f(8, 2, 128, 16, 300, 9);
  f.Write(0, 300);
  const auto q = RandomFloats(static_cast<std::size_t>(3 * 8 * 128), 10);
  for (int threads : {2, 3, 8}) {  // 8 threads slices each 4-head group for decode
    ThreadPool pool(threads);
    for (std::int64_t n : {1, 3}) {
      std::vector<float> multi(q.size());
      PagedAttention(multi.data(), q.data(), n, 8, f.layer, f.table, 300 - n, 0.09f, &pool);
      std::vector<float> want(q.size());
      PagedAttention(want.data(), q.data(), n, 8, f.layer, f.table, 300 - n, 0.09f, nullptr);
      EXPECT_EQ(std::memcmp(multi.data(), want.data(), n * 8 * 128 * sizeof(float)), 0)
          << threads << " threads, n=" << n;
    }
  }
}

DUET_INSTANTIATE_ISA_TESTS(AttentionTest);

TEST(AttentionDeathTest, TablesThatDoNotCoverTheContextAreBrokenInvariants) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Fixture f(2, 1, 16, 4, 8, 11);
  const std::vector<float> q(2 * 16, 0.5f);
  std::vector<float> out(q.size());
  // Two blocks cover 8 positions; a ninth needs a third.
  EXPECT_DEATH(PagedAttention(out.data(), q.data(), 1, 2, f.layer, f.table, 8, 1.0f, nullptr),
               "block table has 2 blocks, needs 3");
  std::vector<std::int32_t> bad_table = {0, static_cast<std::int32_t>(f.layer.num_blocks)};
  EXPECT_DEATH(WriteKv(f.layer, bad_table, 0, 8, f.k_ref.data(), f.v_ref.data()),
               "outside the cache");
}

TEST(AttentionDeathTest, HeadsMustBeAMultipleOfKvHeads) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Fixture f(2, 2, 16, 4, 8, 12);
  f.Write(0, 8);
  const std::vector<float> q(3 * 16, 0.5f);
  std::vector<float> out(q.size());
  EXPECT_DEATH(PagedAttention(out.data(), q.data(), 1, 3, f.layer, f.table, 0, 1.0f, nullptr),
               "heads % layer.kv_heads == 0");
}

}  // namespace
}  // namespace duet::kernels::cpu
