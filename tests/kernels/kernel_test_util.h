// Shared helpers of the CPU kernel tests: seeded random data, weights in each dtype together with
// the exact fp32 values the kernels should see, and a fixture running a test once per
// instruction-set path (baseline and, where the CPU has it, AVX2).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/weight.h"

namespace duet::kernels::cpu::testing {

inline std::vector<float> RandomFloats(std::size_t n, std::uint32_t seed, float low = -1.0f,
                                       float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A weight in one dtype: the stored bits and, in `values`, what each element means exactly
// (the scalar conversion of the stored bits), for references to compute with.
struct TestWeight {
  WeightDtype dtype = WeightDtype::kF32;
  std::int64_t rows = 0, cols = 0;
  std::vector<float> f32;           // storage for kF32
  std::vector<std::uint16_t> bits;  // storage for kBF16 / kF16
  std::vector<float> values;        // exact meaning of every element

  Weight view() const {
    const void* data = dtype == WeightDtype::kF32 ? static_cast<const void*>(f32.data())
                                                  : static_cast<const void*>(bits.data());
    return Weight{data, dtype, rows, cols};
  }
  double at(std::int64_t r, std::int64_t c) const { return values[r * cols + c]; }
};

inline TestWeight MakeWeight(WeightDtype dtype, std::int64_t rows, std::int64_t cols,
                             std::uint32_t seed, float low = -1.0f, float high = 1.0f) {
  TestWeight w;
  w.dtype = dtype;
  w.rows = rows;
  w.cols = cols;
  const std::vector<float> source =
      RandomFloats(static_cast<std::size_t>(rows * cols), seed, low, high);
  w.values.resize(source.size());
  if (dtype == WeightDtype::kF32) {
    w.f32 = source;
    w.values = source;
  } else {
    w.bits.resize(source.size());
    for (std::size_t i = 0; i < source.size(); ++i) {
      w.bits[i] = dtype == WeightDtype::kBF16 ? F32ToBf16(source[i]) : F32ToF16(source[i]);
      w.values[i] = dtype == WeightDtype::kBF16 ? Bf16ToF32(w.bits[i]) : F16ToF32(w.bits[i]);
    }
  }
  return w;
}

inline const char* DtypeLabel(WeightDtype d) { return WeightDtypeName(d); }

// Runs each test of a fixture once per Isa; skips an Isa the CPU lacks; restores the default.
class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) GTEST_SKIP() << "CPU lacks " << IsaName(GetParam());
    saved_ = ActiveIsa();
    switched_ = true;
    SetIsaForTesting(GetParam());
  }
  void TearDown() override {
    if (switched_) SetIsaForTesting(saved_);
  }

 private:
  Isa saved_ = Isa::kBaseline;
  bool switched_ = false;
};

inline std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) {
  return IsaName(info.param);
}

}  // namespace duet::kernels::cpu::testing

#define DUET_INSTANTIATE_ISA_TESTS(Fixture)                                                      \
  INSTANTIATE_TEST_SUITE_P(                                                                      \
      Isas, Fixture,                                                                             \
      ::testing::Values(::duet::kernels::cpu::Isa::kBaseline, ::duet::kernels::cpu::Isa::kAvx2), \
      ::duet::kernels::cpu::testing::IsaParamName)
