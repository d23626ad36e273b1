// Embedding, RmsNorm, Rope and SwiGLU (see ops.h). These are O(tokens x width) next to the
// O(tokens x width^2) matmuls, so they are plain loops left to the compiler's vectoriser; the
// arithmetic follows Hugging Face's fp32 order of operations.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/status.h"

namespace duet::kernels::cpu {
namespace {

// Rows below this many scalar operations are not worth waking the pool for.
constexpr std::int64_t kMinParallelWork = 1 << 15;

std::int64_t MinChunkRows(std::int64_t row_work) {
  return std::max<std::int64_t>(1, kMinParallelWork / std::max<std::int64_t>(1, row_work));
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

void Embedding(float* out, std::span<const std::int32_t> ids, const Weight& table) {
  DUET_CHECK(out != nullptr && table.data != nullptr && table.rows > 0 && table.cols > 0);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    DUET_CHECK_MSG(ids[i] >= 0 && ids[i] < table.rows, "token id " + std::to_string(ids[i]) +
                                                           " outside the embedding table of " +
                                                           std::to_string(table.rows) + " rows");
    WeightRowToF32(table, ids[i], out + static_cast<std::int64_t>(i) * table.cols);
  }
}

void RmsNorm(float* out, const float* in, std::int64_t rows, std::int64_t dim, const Weight& gamma,
             float eps, ThreadPool* pool) {
  DUET_CHECK(out != nullptr && in != nullptr && gamma.data != nullptr);
  DUET_CHECK(rows >= 0 && dim > 0);
  DUET_CHECK((gamma.rows == 1 && gamma.cols == dim) || (gamma.rows == dim && gamma.cols == 1));
  if (rows == 0) return;
  // gamma is tiny (dim values): widen it once per call into this thread's scratch.
  thread_local std::vector<float> gamma_f32;
  if (gamma_f32.size() < static_cast<std::size_t>(dim)) gamma_f32.resize(dim);
  ConvertToF32(gamma.data, gamma.dtype, dim, gamma_f32.data());
  const float* g = gamma_f32.data();
  ParallelFor(
      pool, rows,
      [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
          const float* x = in + r * dim;
          float* y = out + r * dim;
          // HF sums in fp32 with pairwise reduction; a double sum rounded once is within an
          // ulp of it and independent of the vector width.
          double sum_squares = 0.0;
          for (std::int64_t i = 0; i < dim; ++i) sum_squares += double(x[i]) * double(x[i]);
          const float variance = static_cast<float>(sum_squares / static_cast<double>(dim));
          const float inv_rms = 1.0f / std::sqrt(variance + eps);
          for (std::int64_t i = 0; i < dim; ++i) y[i] = g[i] * (x[i] * inv_rms);
        }
      },
      MinChunkRows(dim));
}

void Rope(float* q, std::int64_t heads, float* k, std::int64_t kv_heads, std::int64_t head_dim,
          std::span<const std::int32_t> positions, const float* inv_freq, float attention_scaling,
          ThreadPool* pool) {
  DUET_CHECK(q != nullptr && inv_freq != nullptr && heads > 0 && kv_heads >= 0);
  DUET_CHECK(head_dim > 0 && head_dim % 2 == 0);
  DUET_CHECK(kv_heads == 0 || k != nullptr);
  const std::int64_t half = head_dim / 2;
  const auto n_tokens = static_cast<std::int64_t>(positions.size());
  ParallelFor(
      pool, n_tokens,
      [&](std::int64_t t0, std::int64_t t1) {
        thread_local std::vector<float> cos_sin;
        if (cos_sin.size() < static_cast<std::size_t>(head_dim)) cos_sin.resize(head_dim);
        float* cos_half = cos_sin.data();
        float* sin_half = cos_sin.data() + half;
        for (std::int64_t t = t0; t < t1; ++t) {
          DUET_CHECK(positions[t] >= 0);
          // HF: freqs = inv_freq @ position (a product in fp32), emb = cat(freqs, freqs), so
          // both halves of a pair share cos/sin of the same fp32 angle.
          const auto position = static_cast<float>(positions[t]);
          for (std::int64_t i = 0; i < half; ++i) {
            const float angle = position * inv_freq[i];
            cos_half[i] = std::cos(angle) * attention_scaling;
            sin_half[i] = std::sin(angle) * attention_scaling;
          }
          auto rotate = [&](float* x) {
            for (std::int64_t i = 0; i < half; ++i) {
              const float x1 = x[i];
              const float x2 = x[i + half];
              x[i] = x1 * cos_half[i] + (-x2) * sin_half[i];
              x[i + half] = x2 * cos_half[i] + x1 * sin_half[i];
            }
          };
          for (std::int64_t h = 0; h < heads; ++h) rotate(q + (t * heads + h) * head_dim);
          for (std::int64_t h = 0; h < kv_heads; ++h) rotate(k + (t * kv_heads + h) * head_dim);
        }
      },
      MinChunkRows((heads + kv_heads) * head_dim * 4));
}

void SwiGlu(float* out, const float* gate, const float* up, std::int64_t n_tokens,
            std::int64_t intermediate, ThreadPool* pool) {
  DUET_CHECK(out != nullptr && gate != nullptr && up != nullptr);
  DUET_CHECK(n_tokens >= 0 && intermediate > 0);
  ParallelFor(
      pool, n_tokens * intermediate,
      [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) out[i] = Silu(gate[i]) * up[i];
      },
      kMinParallelWork);
}

void SwiGluFused(float* out, const float* gate_up, std::int64_t n_tokens, std::int64_t intermediate,
                 ThreadPool* pool) {
  DUET_CHECK(out != nullptr && gate_up != nullptr);
  DUET_CHECK(n_tokens >= 0 && intermediate > 0);
  ParallelFor(
      pool, n_tokens,
      [&](std::int64_t t0, std::int64_t t1) {
        for (std::int64_t t = t0; t < t1; ++t) {
          const float* gate = gate_up + t * 2 * intermediate;
          const float* up = gate + intermediate;
          float* y = out + t * intermediate;
          for (std::int64_t i = 0; i < intermediate; ++i) y[i] = Silu(gate[i]) * up[i];
        }
      },
      MinChunkRows(intermediate));
}

}  // namespace duet::kernels::cpu
