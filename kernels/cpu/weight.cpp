// fp32 <-> bf16/f16 conversions and the row converters the kernels use (see weight.h); the
// AVX2 row converter widens eight values per instruction and matches the scalar helpers bit for
// bit.
#include "kernels/cpu/weight.h"

#include <cstring>

#include "common/status.h"
#include "kernels/cpu/cpu_features.h"

#if DUET_KERNELS_X86
#include <immintrin.h>
#endif

namespace duet::kernels::cpu {
namespace {

void ConvertBaseline(const void* src, WeightDtype dtype, std::int64_t count, float* dst) {
  switch (dtype) {
    case WeightDtype::kF32:
      std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(float));
      return;
    case WeightDtype::kBF16: {
      const auto* in = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = 0; i < count; ++i) dst[i] = Bf16ToF32(in[i]);
      return;
    }
    case WeightDtype::kF16: {
      const auto* in = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = 0; i < count; ++i) dst[i] = F16ToF32(in[i]);
      return;
    }
  }
}

#if DUET_KERNELS_X86
DUET_TARGET_AVX2 void ConvertAvx2(const void* src, WeightDtype dtype, std::int64_t count,
                                  float* dst) {
  const auto* in = static_cast<const std::uint16_t*>(src);
  std::int64_t i = 0;
  if (dtype == WeightDtype::kBF16) {
    for (; i + 8 <= count; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  } else if (dtype == WeightDtype::kF16) {
    for (; i + 8 <= count; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  }
  if (i < count) {
    const std::size_t bytes = WeightDtypeBytes(dtype);
    ConvertBaseline(static_cast<const char*>(src) + i * bytes, dtype, count - i, dst + i);
  }
}
#endif

}  // namespace

std::size_t WeightDtypeBytes(WeightDtype dtype) { return dtype == WeightDtype::kF32 ? 4 : 2; }

const char* WeightDtypeName(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kF32:
      return "f32";
    case WeightDtype::kBF16:
      return "bf16";
    case WeightDtype::kF16:
      return "f16";
  }
  return "?";
}

std::uint16_t F32ToBf16(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry out of
  // the mantissa correctly bumps the exponent (up to infinity).
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

std::uint16_t F32ToF16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t x = bits & 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN
    if (x == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  // 65520 is halfway between the largest f16 (65504, odd mantissa) and 2^16: ties go to even,
  // i.e. to infinity.
  if (x >= 0x477ff000u) return sign | 0x7c00u;
  const std::uint32_t exponent = x >> 23;
  if (exponent < 113) {  // below 2^-14: an f16 subnormal (or zero) = round(value * 2^24)
    const std::uint32_t shift = 126 - exponent;  // >= 14
    if (shift > 24) return sign;                 // < 2^-25: rounds to zero
    const std::uint32_t mantissa = (x & 0x7fffffu) | 0x800000u;
    std::uint32_t q = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t q = ((exponent - 112) << 10) | ((x >> 13) & 0x3ffu);
  const std::uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (q & 1u))) ++q;  // a carry bumps the exponent
  return static_cast<std::uint16_t>(sign | q);
}

void ConvertToF32(const void* src, WeightDtype dtype, std::int64_t count, float* dst) {
  DUET_CHECK(count >= 0);
#if DUET_KERNELS_X86
  if (dtype != WeightDtype::kF32 && ActiveIsa() == Isa::kAvx2) {
    ConvertAvx2(src, dtype, count, dst);
    return;
  }
#endif
  ConvertBaseline(src, dtype, count, dst);
}

#if DUET_KERNELS_X86
namespace {
// Eight floats to bf16 with F32ToBf16's rounding: RNE by integer add, NaNs made quiet.
DUET_TARGET_AVX2 void ConvertF32ToBf16Avx2(const float* src, std::int64_t count,
                                           std::uint16_t* dst) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf = _mm256_set1_epi32(0x7f800000);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  std::int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, bias), lsb), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i quieted = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
    const __m256i r = _mm256_blendv_epi8(rounded, quieted, nan);
    // Pack the eight 32-bit lanes (each < 2^16) to 16 bits, in order.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), packed);
  }
  for (; i < count; ++i) dst[i] = F32ToBf16(src[i]);
}
}  // namespace
#endif

void ConvertFromF32(const float* src, std::int64_t count, WeightDtype dtype, void* dst) {
  DUET_CHECK(count >= 0);
  if (dtype == WeightDtype::kF32) {
    std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(float));
    return;
  }
  auto* out = static_cast<std::uint16_t*>(dst);
#if DUET_KERNELS_X86
  if (dtype == WeightDtype::kBF16 && ActiveIsa() == Isa::kAvx2) {
    ConvertF32ToBf16Avx2(src, count, out);
    return;
  }
#endif
  for (std::int64_t i = 0; i < count; ++i) {
    out[i] = dtype == WeightDtype::kBF16 ? F32ToBf16(src[i]) : F32ToF16(src[i]);
  }
}

void WeightRowToF32(const Weight& w, std::int64_t row, float* dst) {
  DUET_CHECK(w.data != nullptr && row >= 0 && row < w.rows);
  const char* base = static_cast<const char*>(w.data) +
                     static_cast<std::size_t>(row * w.cols) * WeightDtypeBytes(w.dtype);
  ConvertToF32(base, w.dtype, w.cols, dst);
}

}  // namespace duet::kernels::cpu
