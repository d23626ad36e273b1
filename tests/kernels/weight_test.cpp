// bf16 / f16 <-> fp32 conversions: every 16-bit pattern against an independent formula (and
// against the CPU's own F16C instructions where present), rounding edge cases, and the
// vectorised row converter against the scalar helpers on both instruction-set paths.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/cpu/weight.h"
#include "tests/kernels/kernel_test_util.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace duet::kernels::cpu {
namespace {

using testing::IsaTest;

std::uint32_t Bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// binary16 by its definition, in double.
double F16Formula(std::uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

TEST(WeightConversion, Bf16KnownValues) {
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xc000), -2.0f);
  EXPECT_EQ(Bf16ToF32(0x0000), 0.0f);
  EXPECT_EQ(Bits(Bf16ToF32(0x8000)), 0x80000000u);                 // -0
  EXPECT_EQ(Bf16ToF32(0x0001), std::ldexp(1.0f, -133));            // smallest subnormal
  EXPECT_EQ(Bf16ToF32(0x7f7f), std::ldexp(255.0f / 128.0f, 127));  // largest finite
  EXPECT_EQ(Bf16ToF32(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bf16ToF32(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Bf16ToF32(0x7fc0)));
  EXPECT_EQ(Bits(Bf16ToF32(0x7f81)), 0x7f810000u);  // payload kept (widening is a shift)
}

TEST(WeightConversion, EveryF16MatchesTheFormula) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float got = F16ToF32(static_cast<std::uint16_t>(h));
    const double want = F16Formula(static_cast<std::uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      ASSERT_EQ(Bits(got) & 0x80000000u, (h & 0x8000u) << 16) << h;  // sign kept
      ASSERT_NE(Bits(got) & 0x00400000u, 0u) << h;                   // quiet
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000u) != 0) << h;  // incl. -0
    }
  }
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x7c00), std::numeric_limits<float>::infinity());
}

TEST(WeightConversion, RoundTripsEverySixteenBitValue) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float bf = Bf16ToF32(bits);
    const float hf = F16ToF32(bits);
    if (std::isnan(bf)) {
      ASSERT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(bf)))) << b;
    } else {
      ASSERT_EQ(F32ToBf16(bf), bits) << b;
    }
    if (std::isnan(hf)) {
      ASSERT_TRUE(std::isnan(F16ToF32(F32ToF16(hf)))) << b;
    } else {
      ASSERT_EQ(F32ToF16(hf), bits) << b;
    }
  }
}

TEST(WeightConversion, Bf16RoundsToNearestEven) {
  const float one = 1.0f;
  EXPECT_EQ(F32ToBf16(one + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even (down)
  EXPECT_EQ(F32ToBf16(one + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(F32ToBf16(std::nextafter(one + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(F32ToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(F32ToBf16(std::ldexp(1.0f, -140)), 0x0000);  // below half the smallest: 0
  EXPECT_EQ(F32ToBf16(std::ldexp(1.0f, -133)), 0x0001);
  // A NaN whose payload lives only in the dropped bits must stay NaN.
  const std::uint16_t nan = F32ToBf16(std::bit_cast<float>(0x7f800001u));
  EXPECT_TRUE(std::isnan(Bf16ToF32(nan)));
}

TEST(WeightConversion, F16RoundsToNearestEven) {
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.99f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // tie with 2^16 goes to even: infinity
  EXPECT_EQ(F32ToF16(-1e9f), 0xfc00);
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(F32ToF16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(F32ToF16(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie -> even (up)
  EXPECT_EQ(F32ToF16(std::ldexp(1023.5f, -24)), 0x0400);   // subnormal rounds into normal
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::bit_cast<float>(0x7f800001u)))));
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) std::uint16_t HardwareF32ToF16(float f) {
  return static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HardwareF16ToF32(std::uint16_t h) { return _cvtsh_ss(h); }

TEST(WeightConversion, F16MatchesTheCpusF16cInstructions) {
  if (!IsaSupported(Isa::kAvx2)) GTEST_SKIP() << "no F16C";
  for (std::uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(Bits(F16ToF32(static_cast<std::uint16_t>(h))),
              Bits(HardwareF16ToF32(static_cast<std::uint16_t>(h))))
        << h;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns cover every exponent, subnormals, infinities and NaNs.
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    ASSERT_EQ(F32ToF16(f), HardwareF32ToF16(f)) << std::hex << Bits(f);
  }
}
#endif

class ConvertToF32Test : public IsaTest {};

TEST_P(ConvertToF32Test, MatchesScalarHelpersBitForBit) {
  std::vector<std::uint16_t> all(65536 + 5);  // + 5: a tail the vector loop does not cover
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i * 40503u);
  std::vector<float> out(all.size());
  ConvertToF32(all.data(), WeightDtype::kBF16, static_cast<std::int64_t>(all.size()), out.data());
  for (std::size_t i = 0; i < all.size(); ++i)
    ASSERT_EQ(Bits(out[i]), Bits(Bf16ToF32(all[i]))) << i;
  ConvertToF32(all.data(), WeightDtype::kF16, static_cast<std::int64_t>(all.size()), out.data());
  for (std::size_t i = 0; i < all.size(); ++i) ASSERT_EQ(Bits(out[i]), Bits(F16ToF32(all[i]))) << i;
}

TEST_P(ConvertToF32Test, ConvertFromF32MatchesScalarHelpersBitForBit) {
  // Every bf16 value, the halfway points above and below it (ties, both parities), NaNs with
  // low payload bits only (which truncation would turn into infinity), and a tail of 5.
  std::vector<float> values;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    values.push_back(std::bit_cast<float>(h << 16));
    values.push_back(std::bit_cast<float>((h << 16) | 0x8000u));
    values.push_back(std::bit_cast<float>((h << 16) | 0x7fffu));
  }
  for (std::uint32_t bits : {0x7f800001u, 0xff800001u, 0x7fc00000u}) {
    values.push_back(std::bit_cast<float>(bits));
  }
  for (int i = 0; i < 5; ++i) values.push_back(1.0f + static_cast<float>(i) / 3.0f);
  const auto n = static_cast<std::int64_t>(values.size());
  std::vector<std::uint16_t> out(values.size());
  ConvertFromF32(values.data(), n, WeightDtype::kBF16, out.data());
  for (std::size_t i = 0; i < values.size(); ++i) ASSERT_EQ(out[i], F32ToBf16(values[i])) << i;
  ConvertFromF32(values.data(), n, WeightDtype::kF16, out.data());
  for (std::size_t i = 0; i < values.size(); ++i) ASSERT_EQ(out[i], F32ToF16(values[i])) << i;
  std::vector<float> copy(values.size());
  ConvertFromF32(values.data(), n, WeightDtype::kF32, copy.data());
  EXPECT_EQ(std::memcmp(copy.data(), values.data(), values.size() * sizeof(float)), 0);
}

TEST_P(ConvertToF32Test, WeightRowToF32ReadsTheRightRow) {
  for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kBF16, WeightDtype::kF16}) {
    const testing::TestWeight w = testing::MakeWeight(dtype, 5, 19, 3);
    std::vector<float> row(19);
    WeightRowToF32(w.view(), 3, row.data());
    for (int c = 0; c < 19; ++c) EXPECT_EQ(row[c], w.at(3, c)) << WeightDtypeName(dtype);
  }
}

DUET_INSTANTIATE_ISA_TESTS(ConvertToF32Test);

TEST(WeightConversion, DtypeSizesAndNames) {
  EXPECT_EQ(WeightDtypeBytes(WeightDtype::kF32), 4u);
  EXPECT_EQ(WeightDtypeBytes(WeightDtype::kBF16), 2u);
  EXPECT_EQ(WeightDtypeBytes(WeightDtype::kF16), 2u);
  EXPECT_STREQ(WeightDtypeName(WeightDtype::kBF16), "bf16");
  const float data[3] = {1, 2, 3};
  const Weight v = VectorWeight(data, 3);
  EXPECT_EQ(v.rows, 1);
  EXPECT_EQ(v.cols, 3);
  EXPECT_EQ(v.bytes(), 12u);
}

}  // namespace
}  // namespace duet::kernels::cpu
