// Embedding, RmsNorm, Rope and SwiGLU against double-precision references: all weight dtypes,
// odd widths, gamma in both 1-D layouts, head_dim 16/64/128, large positions (with a check that
// angles are rounded to fp32 as Hugging Face computes them), and SwiGLU's fused layout.
#include "kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/kernels/kernel_test_util.h"

namespace duet::kernels::cpu {
namespace {

using testing::IsaTest;
using testing::MakeWeight;
using testing::RandomFloats;
using testing::TestWeight;

class OpsTest : public IsaTest {};

TEST_P(OpsTest, EmbeddingCopiesTheConvertedRows) {
  for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kBF16, WeightDtype::kF16}) {
    const TestWeight table = MakeWeight(dtype, 50, 19, 5);
    const std::vector<std::int32_t> ids = {0, 49, 7, 7, 23};
    std::vector<float> out(ids.size() * 19);
    Embedding(out.data(), ids, table.view());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      for (int c = 0; c < 19; ++c) {
        ASSERT_EQ(out[i * 19 + c], table.at(ids[i], c)) << WeightDtypeName(dtype);
      }
    }
  }
}

TEST_P(OpsTest, RmsNormMatchesReference) {
  ThreadPool pool(2);
  for (std::int64_t dim : {1, 7, 64, 4096}) {
    for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kBF16, WeightDtype::kF16}) {
      const std::int64_t rows = 5;
      const std::vector<float> in = RandomFloats(static_cast<std::size_t>(rows * dim), 3, -4, 4);
      for (bool column_gamma : {false, true}) {
        TestWeight gamma = MakeWeight(dtype, 1, dim, 4, 0.5f, 2.0f);
        if (column_gamma) std::swap(gamma.rows, gamma.cols);
        const float eps = 1e-5f;
        std::vector<float> out(in.size());
        RmsNorm(out.data(), in.data(), rows, dim, gamma.view(), eps, &pool);
        for (std::int64_t r = 0; r < rows; ++r) {
          double mean_square = 0.0;
          for (std::int64_t i = 0; i < dim; ++i)
            mean_square += double(in[r * dim + i]) * in[r * dim + i];
          mean_square /= dim;
          const double inv_rms = 1.0 / std::sqrt(mean_square + eps);
          for (std::int64_t i = 0; i < dim; ++i) {
            const double want = in[r * dim + i] * inv_rms * gamma.values[i];
            ASSERT_NEAR(out[r * dim + i], want, 1e-6 * (1.0 + std::fabs(want)))
                << "dim=" << dim << " " << WeightDtypeName(dtype);
          }
        }
      }
    }
  }
}

TEST_P(OpsTest, RmsNormWorksInPlace) {
  std::vector<float> x = RandomFloats(3 * 33, 8);
  const std::vector<float> gamma = RandomFloats(33, 9);
  std::vector<float> separate(x.size());
  RmsNorm(separate.data(), x.data(), 3, 33, VectorWeight(gamma.data(), 33), 1e-6f);
  RmsNorm(x.data(), x.data(), 3, 33, VectorWeight(gamma.data(), 33), 1e-6f);
  EXPECT_EQ(x, separate);
}

std::vector<float> LlamaInvFreq(std::int64_t head_dim, float theta) {
  std::vector<float> inv_freq(static_cast<std::size_t>(head_dim / 2));
  for (std::int64_t i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(theta, double(2 * i) / double(head_dim)));
  }
  return inv_freq;
}

// rotate_half reference in double. fp32_angles: the angle is the fp32 product position *
// inv_freq (HF's contract); otherwise the exact product.
std::vector<double> RopeReference(const std::vector<float>& x, std::int64_t tokens,
                                  std::int64_t heads, std::int64_t head_dim,
                                  const std::vector<std::int32_t>& positions,
                                  const std::vector<float>& inv_freq, bool fp32_angles,
                                  double scaling = 1.0) {
  std::vector<double> y(x.size());
  const std::int64_t half = head_dim / 2;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const float* in = x.data() + (t * heads + h) * head_dim;
      double* out = y.data() + (t * heads + h) * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const double angle = fp32_angles ? double(float(positions[t]) * inv_freq[i])
                                         : double(positions[t]) * double(inv_freq[i]);
        const double c = std::cos(angle) * scaling, s = std::sin(angle) * scaling;
        out[i] = in[i] * c - in[i + half] * s;
        out[i + half] = in[i + half] * c + in[i] * s;
      }
    }
  }
  return y;
}

TEST_P(OpsTest, RopeMatchesRotateHalfReference) {
  ThreadPool pool(2);
  const std::vector<std::int32_t> positions = {0, 1, 2, 17, 1000, 8191, 131071};
  const auto tokens = static_cast<std::int64_t>(positions.size());
  for (std::int64_t head_dim : {16, 64, 128}) {
    for (const auto& [heads, kv_heads] : {std::pair<std::int64_t, std::int64_t>{4, 2}, {3, 3}}) {
      const std::vector<float> inv_freq = LlamaInvFreq(head_dim, 500000.0f);
      std::vector<float> q = RandomFloats(static_cast<std::size_t>(tokens * heads * head_dim), 1);
      std::vector<float> k =
          RandomFloats(static_cast<std::size_t>(tokens * kv_heads * head_dim), 2);
      const auto q_want = RopeReference(q, tokens, heads, head_dim, positions, inv_freq, true);
      const auto k_want = RopeReference(k, tokens, kv_heads, head_dim, positions, inv_freq, true);
      Rope(q.data(), heads, k.data(), kv_heads, head_dim, positions, inv_freq.data(), 1.0f, &pool);
      for (std::size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(q[i], q_want[i], 2e-6) << head_dim;
      for (std::size_t i = 0; i < k.size(); ++i) ASSERT_NEAR(k[i], k_want[i], 2e-6) << head_dim;
    }
  }
}

TEST_P(OpsTest, RopeRoundsAnglesToFp32LikeHuggingFace) {
  // At position 131071 an fp32 angle is off the exact product by up to ~4e-3 rad; transformers
  // computes it in fp32, so the kernel must too.
  const std::int64_t head_dim = 64;
  const std::vector<std::int32_t> positions = {131071};
  const std::vector<float> inv_freq = LlamaInvFreq(head_dim, 10000.0f);
  std::vector<float> q = RandomFloats(head_dim, 3);
  const auto fp32 = RopeReference(q, 1, 1, head_dim, positions, inv_freq, true);
  const auto exact = RopeReference(q, 1, 1, head_dim, positions, inv_freq, false);
  Rope(q.data(), 1, nullptr, 0, head_dim, positions, inv_freq.data());
  double max_vs_fp32 = 0.0, max_vs_exact = 0.0;
  for (std::int64_t i = 0; i < head_dim; ++i) {
    max_vs_fp32 = std::max(max_vs_fp32, std::fabs(q[i] - fp32[i]));
    max_vs_exact = std::max(max_vs_exact, std::fabs(q[i] - exact[i]));
  }
  EXPECT_LT(max_vs_fp32, 2e-6);
  EXPECT_GT(max_vs_exact, 1e-4);
}

TEST_P(OpsTest, RopeAttentionScalingScalesCosAndSin) {
  const std::int64_t head_dim = 16;
  const std::vector<std::int32_t> positions = {5, 9};
  const std::vector<float> inv_freq = LlamaInvFreq(head_dim, 10000.0f);
  std::vector<float> q = RandomFloats(2 * head_dim, 4);
  const auto want = RopeReference(q, 2, 1, head_dim, positions, inv_freq, true, 1.25);
  Rope(q.data(), 1, nullptr, 0, head_dim, positions, inv_freq.data(), 1.25f);
  for (std::size_t i = 0; i < q.size(); ++i) EXPECT_NEAR(q[i], want[i], 3e-6);
}

double SiluReference(double x) { return x / (1.0 + std::exp(-x)); }

TEST_P(OpsTest, SwiGluMatchesReferenceAndFusedLayout) {
  ThreadPool pool(2);
  const std::int64_t tokens = 3, inter = 1001;
  std::vector<float> gate = RandomFloats(static_cast<std::size_t>(tokens * inter), 5, -12, 12);
  const std::vector<float> up = RandomFloats(gate.size(), 6, -3, 3);
  gate[0] = -100.0f;  // exp(100) overflows fp32: the result must be -0, not NaN
  gate[1] = 100.0f;
  std::vector<float> out(gate.size());
  SwiGlu(out.data(), gate.data(), up.data(), tokens, inter, &pool);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double want = SiluReference(gate[i]) * up[i];
    ASSERT_NEAR(out[i], want, 1e-6 * (1.0 + std::fabs(want))) << i;
  }
  std::vector<float> fused(static_cast<std::size_t>(tokens * 2 * inter));
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::copy_n(gate.begin() + t * inter, inter, fused.begin() + t * 2 * inter);
    std::copy_n(up.begin() + t * inter, inter, fused.begin() + t * 2 * inter + inter);
  }
  std::vector<float> out_fused(out.size());
  SwiGluFused(out_fused.data(), fused.data(), tokens, inter, &pool);
  EXPECT_EQ(out_fused, out);
  // In place over gate.
  SwiGlu(gate.data(), gate.data(), up.data(), tokens, inter);
  EXPECT_EQ(gate, out);
}

DUET_INSTANTIATE_ISA_TESTS(OpsTest);

TEST(OpsDeathTest, OutOfRangeTokenIdIsABrokenInvariant) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const TestWeight table = MakeWeight(WeightDtype::kBF16, 10, 4, 1);
  std::vector<float> out(4);
  const std::vector<std::int32_t> too_big = {10}, negative = {-1};
  EXPECT_DEATH(Embedding(out.data(), too_big, table.view()), "token id 10");
  EXPECT_DEATH(Embedding(out.data(), negative, table.view()), "token id -1");
}

TEST(OpsDeathTest, GammaOfTheWrongSizeIsABrokenInvariant) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<float> in(8, 1.0f), gamma(7, 1.0f);
  std::vector<float> out(8);
  EXPECT_DEATH(RmsNorm(out.data(), in.data(), 1, 8, VectorWeight(gamma.data(), 7), 1e-6f),
               "invariant");
}

}  // namespace
}  // namespace duet::kernels::cpu
