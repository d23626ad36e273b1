// Weights as the CPU kernels see them: a borrowed row-major [rows][cols] matrix in F32, BF16
// or F16 (as stored in safetensors), converted to fp32 on the fly inside the kernels, plus the
// bit-exact scalar conversions between fp32 and the two 16-bit formats.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace duet::kernels::cpu {

enum class WeightDtype { kF32, kBF16, kF16 };

std::size_t WeightDtypeBytes(WeightDtype dtype);  // 4, 2, 2
const char* WeightDtypeName(WeightDtype dtype);   // "f32", "bf16", "f16"

// A borrowed matrix, row-major [rows][cols]: Hugging Face Linear weights are [out][in], so a
// Linear layer is Weight{data, dtype, out_features, in_features}. 1-D tensors (norm gammas,
// biases) are rows = 1, cols = n. The data must stay alive and unchanged while kernels use it.
struct Weight {
  const void* data = nullptr;
  WeightDtype dtype = WeightDtype::kF32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;

  std::int64_t elements() const { return rows * cols; }
  std::size_t bytes() const {
    return static_cast<std::size_t>(elements()) * WeightDtypeBytes(dtype);
  }
};

// Wraps an fp32 vector of n values (a bias, a gamma) as a 1 x n Weight.
inline Weight VectorWeight(const float* data, std::int64_t n) {
  return Weight{data, WeightDtype::kF32, 1, n};
}

// bf16 is the top half of an fp32, so widening is a shift: exact for every value, including
// subnormals, infinities and NaN payloads.
inline float Bf16ToF32(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// IEEE binary16 -> binary32, exact for every finite value (f16 subnormals are normal in f32).
// NaNs keep sign and payload and come out quiet, as F16C's vcvtph2ps and PyTorch produce them.
inline float F16ToF32(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  std::uint32_t out;
  if (exponent == 0x1f) {  // inf / NaN
    out = sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    out = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    out = sign;
  } else {  // subnormal: normalise, value = mantissa * 2^-24
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    out = sign | (static_cast<std::uint32_t>(113 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(out);
}

// fp32 -> bf16 with round-to-nearest-even (what torch's .to(torch.bfloat16) does); NaN stays
// NaN (made quiet so that truncating its payload cannot turn it into infinity).
std::uint16_t F32ToBf16(float value);

// fp32 -> IEEE binary16 with round-to-nearest-even; overflow gives infinity, tiny values
// round into f16 subnormals or zero; NaN stays NaN (quiet).
std::uint16_t F32ToF16(float value);

// Converts `count` consecutive elements of dtype at `src` to fp32 (vectorised where the CPU
// allows; the result is identical to the scalar helpers above).
void ConvertToF32(const void* src, WeightDtype dtype, std::int64_t count, float* dst);

// The reverse: `count` fp32 values to dtype at `dst`, each exactly as F32ToBf16 / F32ToF16
// round it (vectorised for bf16 where the CPU allows).
void ConvertFromF32(const float* src, std::int64_t count, WeightDtype dtype, void* dst);

// Row `row` of w as w.cols fp32 values.
void WeightRowToF32(const Weight& w, std::int64_t row, float* dst);

}  // namespace duet::kernels::cpu
