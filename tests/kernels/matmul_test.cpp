// MatMul against a double-precision reference on random inputs: GEMV (M = 1) and GEMM shapes
// that hit every edge of the tiling (N = 1, K = 1, K not a multiple of 8 / 16 / 512, M and N
// across tile and slice boundaries), all three weight dtypes, fp32 and bf16 biases, both
// instruction-set paths with and without oneDNN, and bit-identical results for any thread
// count; every row count the GEMV takes, dispatched and forced, and which kernel MatMul picks.
// Where oneDNN takes a bf16 product, the reference multiplies the inputs rounded to bf16 (what
// the library is documented to do) and is met as tightly as the fp32 paths.
#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tests/kernels/kernel_test_util.h"

namespace duet::kernels::cpu {
namespace {

using testing::IsaTest;
using testing::MakeWeight;
using testing::RandomFloats;
using testing::TestWeight;

struct Shape {
  std::int64_t m, n, k;
};

// Checks out against sum_k in[m][k] * w[n][k] (+ bias[n]) in double. The tolerance scales with
// sum |in * w| (the size of the terms, not of their possibly cancelling sum).
void ExpectMatchesReference(const std::vector<float>& out, const std::vector<float>& in,
                            const TestWeight& w, std::int64_t m, const std::vector<double>* bias,
                            const std::string& label) {
  const bool bf16_inputs = w.dtype == WeightDtype::kBF16 && MatMulUsesLibrary(m, w.dtype);
  int failures = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t n = 0; n < w.rows; ++n) {
      double sum = 0.0, magnitude = 0.0;
      for (std::int64_t k = 0; k < w.cols; ++k) {
        const float x = in[i * w.cols + k];
        const double term =
            static_cast<double>(bf16_inputs ? Bf16ToF32(F32ToBf16(x)) : x) * w.at(n, k);
        sum += term;
        magnitude += std::fabs(term);
      }
      if (bias != nullptr) {
        sum += (*bias)[n];
        magnitude += std::fabs((*bias)[n]);
      }
      const double got = out[i * w.rows + n];
      // Written so that a NaN (an output the kernel never wrote: the tests fill out with NaN)
      // fails too.
      if (!(std::fabs(got - sum) <= 1e-5 * magnitude + 1e-6) && ++failures <= 5) {
        ADD_FAILURE() << label << " out[" << i << "][" << n << "] = " << got << ", want " << sum;
      }
    }
  }
}

class MatMulTest : public IsaTest {};

// Sets whether MatMul may use oneDNN for its lifetime.
class ScopedGemmLibrary {
 public:
  explicit ScopedGemmLibrary(bool enabled) : saved_(SetGemmLibraryForTesting(enabled)) {}
  ~ScopedGemmLibrary() { SetGemmLibraryForTesting(saved_); }

 private:
  bool saved_;
};

TEST_P(MatMulTest, MatchesDoubleReferenceForAllShapesAndDtypes) {
  const Shape shapes[] = {
      {1, 1, 1},     {1, 1, 7},      {1, 5, 16},      {1, 3, 33},   {1, 37, 1000}, {1, 64, 4099},
      {2, 1, 1},     {3, 7, 9},      {4, 3, 8},       {5, 50, 513}, {7, 1, 1031},  {64, 48, 512},
      {65, 49, 17},  {70, 97, 1100}, {128, 96, 64},   {9, 130, 24}, {15, 40, 33},  {16, 1, 1},
      {16, 257, 40}, {40, 600, 96},  {300, 513, 130},
  };
  ThreadPool pool(3);
  std::uint32_t seed = 1;
  for (bool library : {false, true}) {
    const ScopedGemmLibrary scoped(library);
    for (const Shape& s : shapes) {
      for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kBF16, WeightDtype::kF16}) {
        const TestWeight w = MakeWeight(dtype, s.n, s.k, ++seed);
        const std::vector<float> in = RandomFloats(static_cast<std::size_t>(s.m * s.k), ++seed);
        std::vector<float> out(static_cast<std::size_t>(s.m * s.n), std::nanf(""));
        MatMul(out.data(), in.data(), s.m, w.view(), nullptr, &pool);
        ExpectMatchesReference(out, in, w, s.m, nullptr,
                               std::string(WeightDtypeName(dtype)) + " m=" + std::to_string(s.m) +
                                   " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                                   (MatMulUsesLibrary(s.m, dtype) ? " (oneDNN)" : ""));
      }
    }
  }
}

// On a CPU where oneDNN has fast fp32 and bf16 kernels (any x86-64 with AVX-512), prefill-sized
// products take them; decode-sized ones and f16 weights stay on Duet's kernels.
TEST_P(MatMulTest, PrefillSizedProductsGoToTheLibrary) {
  if (GetParam() == Isa::kBaseline) {
    EXPECT_FALSE(MatMulUsesLibrary(kLibraryMinRows, WeightDtype::kBF16));
    return;
  }
  if (!MatMulUsesLibrary(kLibraryMinRows, WeightDtype::kBF16)) {
    GTEST_SKIP() << "oneDNN has no optimised bf16 matmul on this CPU";
  }
  EXPECT_TRUE(MatMulUsesLibrary(kLibraryMinRows, WeightDtype::kF32));
  EXPECT_FALSE(MatMulUsesLibrary(kLibraryMinRows - 1, WeightDtype::kBF16));
  EXPECT_FALSE(MatMulUsesLibrary(kLibraryMinRows, WeightDtype::kF16));
  const ScopedGemmLibrary off(false);
  EXPECT_FALSE(MatMulUsesLibrary(kLibraryMinRows, WeightDtype::kBF16));
}

TEST_P(MatMulTest, AddsFp32AndSixteenBitBiases) {
  for (std::int64_t m : {1, 6, 20}) {
    const TestWeight w = MakeWeight(WeightDtype::kBF16, 13, 40, 11);
    const std::vector<float> in = RandomFloats(static_cast<std::size_t>(m * 40), 12);
    for (WeightDtype bias_dtype : {WeightDtype::kF32, WeightDtype::kBF16, WeightDtype::kF16}) {
      const TestWeight bias = MakeWeight(bias_dtype, 1, 13, 13, -5.0f, 5.0f);
      const std::vector<double> bias_values(bias.values.begin(), bias.values.end());
      std::vector<float> out(static_cast<std::size_t>(m * 13));
      const Weight bias_view = bias.view();
      MatMul(out.data(), in.data(), m, w.view(), &bias_view, nullptr);
      ExpectMatchesReference(out, in, w, m, &bias_values,
                             std::string("bias ") + WeightDtypeName(bias_dtype));
    }
  }
}

TEST_P(MatMulTest, ResultsAreBitIdenticalForAnyThreadCount) {
  for (const Shape& s : {Shape{1, 301, 777}, Shape{77, 101, 600}, Shape{40, 700, 100}}) {
    for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kBF16, WeightDtype::kF16}) {
      const TestWeight w = MakeWeight(dtype, s.n, s.k, 21);
      const std::vector<float> in = RandomFloats(static_cast<std::size_t>(s.m * s.k), 22);
      std::vector<float> single(static_cast<std::size_t>(s.m * s.n));
      MatMul(single.data(), in.data(), s.m, w.view(), nullptr, nullptr);
      for (int threads : {1, 2, 5}) {
        ThreadPool pool(threads);
        std::vector<float> multi(single.size());
        MatMul(multi.data(), in.data(), s.m, w.view(), nullptr, &pool);
        EXPECT_EQ(std::memcmp(multi.data(), single.data(), single.size() * sizeof(float)), 0)
            << "threads=" << threads << " m=" << s.m << " " << WeightDtypeName(dtype);
      }
    }
  }
}

// Sets which kernel MatMul runs (nullopt: its own choice) for its lifetime.
class ScopedKernel {
 public:
  explicit ScopedKernel(std::optional<MatMulKernel> kernel)
      : saved_(ForceMatMulKernelForTesting(kernel)) {}
  ~ScopedKernel() { ForceMatMulKernelForTesting(saved_); }

 private:
  std::optional<MatMulKernel> saved_;
};

// Decode-sized products: every row count the GEMV takes and two beyond, both as MatMul
// dispatches them and forced onto the GEMV, over shapes that leave every kind of tail (columns
// not a multiple of 8 or 16, W rows not a multiple of the interleaved streams, fewer W rows than
// streams), with and without a bias, and bit-identical for any thread count.
TEST_P(MatMulTest, SmallRowCountsMatchReferenceForAnyThreadCount) {
  struct WeightShape {
    std::int64_t n, k;
  };
  const WeightShape shapes[] = {{1, 1}, {2, 7}, {5, 13}, {13, 24}, {67, 41}, {70, 100}, {131, 777}};
  ThreadPool pool2(2), pool3(3), pool5(5);
  std::uint32_t seed = 100;
  for (const std::optional<MatMulKernel> kernel :
       {std::optional<MatMulKernel>(), std::optional(MatMulKernel::kGemv)}) {
    const ScopedKernel scoped(kernel);
    for (std::int64_t m = 1; m <= std::max(kLibraryMinRows, kGemmMinRows) + 1; ++m) {
      for (const WeightShape& s : shapes) {
        for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kBF16, WeightDtype::kF16}) {
          const TestWeight w = MakeWeight(dtype, s.n, s.k, ++seed);
          const TestWeight bias = MakeWeight(WeightDtype::kBF16, 1, s.n, ++seed, -2.0f, 2.0f);
          const std::vector<double> bias_values(bias.values.begin(), bias.values.end());
          const Weight bias_view = bias.view();
          const std::vector<float> in = RandomFloats(static_cast<std::size_t>(m * s.k), ++seed);
          for (bool with_bias : {false, true}) {
            const std::string label = std::string(WeightDtypeName(dtype)) +
                                      " m=" + std::to_string(m) + " n=" + std::to_string(s.n) +
                                      " k=" + std::to_string(s.k) + (with_bias ? " bias" : "") +
                                      (kernel ? " forced " : " dispatched ") +
                                      ToString(MatMulKernelFor(m, dtype));
            const Weight* b = with_bias ? &bias_view : nullptr;
            std::vector<float> single(static_cast<std::size_t>(m * s.n), std::nanf(""));
            MatMul(single.data(), in.data(), m, w.view(), b, nullptr);
            ExpectMatchesReference(single, in, w, m, with_bias ? &bias_values : nullptr, label);
            for (ThreadPool* pool : {&pool2, &pool3, &pool5}) {
              std::vector<float> multi(single.size(), std::nanf(""));
              MatMul(multi.data(), in.data(), m, w.view(), b, pool);
              EXPECT_EQ(std::memcmp(multi.data(), single.data(), single.size() * sizeof(float)), 0)
                  << label << " threads=" << pool->threads();
            }
          }
        }
      }
    }
  }
}

// MatMul's choice: the GEMV below kLibraryMinRows rows and oneDNN from there where oneDNN
// takes the product; elsewhere the GEMV below kGemmMinRows and Duet's GEMM from there.
TEST_P(MatMulTest, SmallRowCountsRunTheGemv) {
  for (bool library : {false, true}) {
    const ScopedGemmLibrary scoped(library);
    for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kBF16, WeightDtype::kF16}) {
      // Whether oneDNN takes this dtype here (an optimised kernel for it on this CPU).
      const bool onednn = MatMulUsesLibrary(512, dtype);
      if (!library || GetParam() == Isa::kBaseline || dtype == WeightDtype::kF16) {
        EXPECT_FALSE(onednn);
      }
      const std::int64_t gemv_below = onednn ? kLibraryMinRows : kGemmMinRows;
      for (std::int64_t m = 1; m <= gemv_below + 2; ++m) {
        const MatMulKernel want = m < gemv_below ? MatMulKernel::kGemv
                                  : onednn       ? MatMulKernel::kLibrary
                                                 : MatMulKernel::kGemm;
        EXPECT_EQ(MatMulKernelFor(m, dtype), want) << WeightDtypeName(dtype) << " m=" << m;
      }
    }
  }
  const ScopedKernel forced(MatMulKernel::kGemm);
  EXPECT_EQ(MatMulKernelFor(1, WeightDtype::kBF16), MatMulKernel::kGemm);
}

TEST_P(MatMulTest, ZeroRowsIsANoOp) {
  const TestWeight w = MakeWeight(WeightDtype::kF32, 4, 4, 1);
  float out = 42.0f;
  const float in = 1.0f;
  MatMul(&out, &in, 0, w.view(), nullptr, nullptr);
  EXPECT_EQ(out, 42.0f);
}

DUET_INSTANTIATE_ISA_TESTS(MatMulTest);

TEST(MatMulDeathTest, BiasOfTheWrongLengthIsABrokenInvariant) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const TestWeight w = MakeWeight(WeightDtype::kF32, 4, 4, 1);
  const std::vector<float> in(4, 1.0f), bias(3, 0.0f);
  std::vector<float> out(4);
  const Weight bias_view = VectorWeight(bias.data(), 3);
  EXPECT_DEATH(MatMul(out.data(), in.data(), 1, w.view(), &bias_view, nullptr), "invariant");
}

}  // namespace
}  // namespace duet::kernels::cpu
