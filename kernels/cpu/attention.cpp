// WriteKv and PagedAttention (see attention.h): partial softmaxes over fixed 128-position
// partitions, each computed for all heads at once so the paged cache is read as whole
// contiguous rows, then folded in partition order; decode parallelises over partitions.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/onednn_gemm.h"

#if DUET_KERNELS_X86
#include <immintrin.h>
#endif

namespace duet::kernels::cpu {
namespace {

// How it works. A token's visible positions are cut into partitions of kPartition positions.
// For one partition and every head: scores (pass 1), max-subtracted exponentials (pass 2) and
// their weighted sum of V rows (pass 3) give a partial softmax (max, sum, unnormalised output).
// Processing all heads together reads each slot's [kv_head][head_dim] row whole, so a block is
// one contiguous run instead of head_dim-float pieces kv_heads * head_dim apart (one 4 KiB page
// per piece for Llama-3-8B shapes), which measured ~3x faster. A token's partials are folded
// in partition order; decode spreads (token, partition) pairs over the pool, prefill spreads
// tokens. Partitions are fixed and always folded in the same order, so the result is the same
// bit for bit whichever way the work was spread.

// Positions per partial softmax. Small enough that a decode of a 1k context yields 8 work
// items, large enough that folding partials (head_dim FMAs per head) costs < 1%.
constexpr std::int64_t kPartition = 128;
// V rows accumulated per register pass: output registers are loaded and stored once per group.
constexpr std::int64_t kRowGroup = 8;
// Above this many bytes of stored partials, decode-style splitting is not used.
constexpr std::int64_t kMaxPartialBytes = 64ll << 20;

// Geometry shared by the kernels for one call.
struct Shape {
  std::int64_t heads;  // query heads
  std::int64_t group;  // query heads per KV head
  std::int64_t head_dim;
  std::int64_t row_stride;  // floats between consecutive slots: kv_heads * head_dim
};

// The rows a kernel should prefetch while it works: the next run of rows to be read (`rows`
// contiguous rows from `first`; none when first is null). Runs end at block boundaries and
// blocks are scattered, which the hardware prefetchers cannot anticipate.
struct NextRun {
  const float* first = nullptr;
  std::int64_t rows = 0;
};

// scores[h * kPartition + r] = scale * dot(q[h], K row r, KV head h / group) for r < rows.
using ScoreFn = void (*)(const Shape& shape, const float* q, const float* k, std::int64_t rows,
                         NextRun next, float scale, float* scores);
// acc[h][:] += sum_r probs[h * kPartition + r] * V row r (KV head h / group), r < rows <= 8.
using AccumulateFn = void (*)(const Shape& shape, const float* probs, const float* v,
                              std::int64_t rows, NextRun next, float* acc);
// x[i] = exp(x[i] - max) for i < n.
using ExpFn = void (*)(float* x, std::int64_t n, float max);

constexpr std::int64_t kLineFloats = 16;  // 64-byte cache lines

// Prefetches the part of `count` contiguous rows (stride floats apart, row_floats used each)
// that falls to `part` of `parts`, so that prefetches are spread over a kernel's loop instead of
// issued in one burst that would stall on the fill buffers.
inline void PrefetchShare(const float* first, std::int64_t count, std::int64_t stride,
                          std::int64_t row_floats, std::int64_t part, std::int64_t parts) {
  if (first == nullptr) return;
  // Rows of a run are contiguous (stride == row_floats): treat them as one range.
  const std::int64_t floats = (count - 1) * stride + row_floats;
  const std::int64_t lines = (floats + kLineFloats - 1) / kLineFloats;
  for (std::int64_t l = lines * part / parts; l < lines * (part + 1) / parts; ++l) {
    __builtin_prefetch(first + l * kLineFloats, /*rw=*/0, /*locality=*/3);
  }
}

// ---------------------------------------------------------------------------------------------
// Baseline path (written so that -O3 vectorises it without reassociation).

void ScoreBaseline(const Shape& shape, const float* q, const float* k, std::int64_t rows,
                   NextRun next, float scale, float* scores) {
  const std::int64_t head_dim = shape.head_dim;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = k + r * shape.row_stride;
    // One row ahead: the next row of this run, else the first of the next run.
    const float* ahead = r + 1 < rows ? row + shape.row_stride : next.first;
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      PrefetchShare(ahead, 1, shape.row_stride, shape.row_stride, h, shape.heads);
      const float* qh = q + h * head_dim;
      const float* kh = row + (h / shape.group) * head_dim;
      float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::int64_t d = 0;
      for (; d + 8 <= head_dim; d += 8) {
        for (int l = 0; l < 8; ++l) partial[l] += qh[d + l] * kh[d + l];
      }
      for (int l = 0; d < head_dim; ++d, ++l) partial[l] += qh[d] * kh[d];
      const float dot = ((partial[0] + partial[4]) + (partial[1] + partial[5])) +
                        ((partial[2] + partial[6]) + (partial[3] + partial[7]));
      scores[h * kPartition + r] = dot * scale;
    }
  }
}

void AccumulateBaseline(const Shape& shape, const float* probs, const float* v, std::int64_t rows,
                        NextRun next, float* acc) {
  const std::int64_t head_dim = shape.head_dim;
  for (std::int64_t h = 0; h < shape.heads; ++h) {
    PrefetchShare(next.first, next.rows, shape.row_stride, shape.row_stride, h, shape.heads);
    float* a = acc + h * head_dim;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float p = probs[h * kPartition + r];
      const float* vh = v + r * shape.row_stride + (h / shape.group) * head_dim;
      for (std::int64_t d = 0; d < head_dim; ++d) a[d] += p * vh[d];
    }
  }
}

void ExpBaseline(float* x, std::int64_t n, float max) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - max);
}

// ---------------------------------------------------------------------------------------------
// AVX2 path.

#if DUET_KERNELS_X86

DUET_TARGET_AVX2 inline float HorizontalSum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// Eight rows at a time per head: each q load feeds eight FMAs, the eight independent
// accumulators hide FMA latency and keep eight rows' loads in flight, and one transposing
// reduction yields all eight scores. Leftover rows take a row at a time.
DUET_TARGET_AVX2 void ScoreAvx2(const Shape& shape, const float* q, const float* k,
                                std::int64_t rows, NextRun next, float scale, float* scores) {
  constexpr std::int64_t kRows = 8;
  const std::int64_t head_dim = shape.head_dim;
  const std::int64_t stride = shape.row_stride;
  const std::int64_t vector_dims = head_dim / 8 * 8;
  const __m256 scale_v = _mm256_set1_ps(scale);
  std::int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    const float* group_rows = k + r * stride;
    // Prefetch what follows these rows: the next eight of this run, else the next run.
    const bool more_here = r + kRows < rows;
    const float* ahead = more_here ? group_rows + kRows * stride : next.first;
    const std::int64_t ahead_rows = more_here ? std::min(kRows, rows - r - kRows) : next.rows;
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      PrefetchShare(ahead, ahead_rows, stride, stride, h, shape.heads);
      const float* qh = q + h * head_dim;
      const float* kh = group_rows + (h / shape.group) * head_dim;
      __m256 acc[kRows];
      for (auto& a : acc) a = _mm256_setzero_ps();
      for (std::int64_t d = 0; d < vector_dims; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qh + d);
        for (int i = 0; i < kRows; ++i) {
          acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kh + i * stride + d), acc[i]);
        }
      }
      // Transpose-reduce: lane i of `sums` is the total of acc[i].
      const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]);
      const __m256 t1 = _mm256_hadd_ps(acc[2], acc[3]);
      const __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]);
      const __m256 t3 = _mm256_hadd_ps(acc[6], acc[7]);
      const __m256 u0 = _mm256_hadd_ps(t0, t1);
      const __m256 u1 = _mm256_hadd_ps(t2, t3);
      __m256 sums =
          _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
      if (vector_dims < head_dim) {
        alignas(32) float tails[kRows];
        for (int i = 0; i < kRows; ++i) {
          float t = 0.0f;
          for (std::int64_t d = vector_dims; d < head_dim; ++d) t += qh[d] * kh[i * stride + d];
          tails[i] = t;
        }
        sums = _mm256_add_ps(sums, _mm256_load_ps(tails));
      }
      _mm256_storeu_ps(scores + h * kPartition + r, _mm256_mul_ps(sums, scale_v));
    }
  }
  for (; r < rows; ++r) {
    const float* row = k + r * stride;
    const float* ahead = r + 1 < rows ? row + stride : next.first;
    for (std::int64_t h = 0; h < shape.heads; ++h) {
      PrefetchShare(ahead, 1, stride, stride, h, shape.heads);
      const float* qh = q + h * head_dim;
      const float* kh = row + (h / shape.group) * head_dim;
      __m256 acc = _mm256_setzero_ps();
      for (std::int64_t d = 0; d < vector_dims; d += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(kh + d), acc);
      }
      float dot = HorizontalSum(acc);
      for (std::int64_t d = vector_dims; d < head_dim; ++d) dot += qh[d] * kh[d];
      scores[h * kPartition + r] = dot * scale;
    }
  }
}

DUET_TARGET_AVX2 void AccumulateAvx2(const Shape& shape, const float* probs, const float* v,
                                     std::int64_t rows, NextRun next, float* acc) {
  const std::int64_t head_dim = shape.head_dim;
  const std::int64_t stride = shape.row_stride;
  for (std::int64_t h = 0; h < shape.heads; ++h) {
    PrefetchShare(next.first, next.rows, stride, stride, h, shape.heads);
    const float* p = probs + h * kPartition;
    const float* vh = v + (h / shape.group) * head_dim;
    float* a = acc + h * head_dim;
    std::int64_t d = 0;
    // 32 output dims stay in registers across the group's rows.
    for (; d + 32 <= head_dim; d += 32) {
      __m256 a0 = _mm256_loadu_ps(a + d);
      __m256 a1 = _mm256_loadu_ps(a + d + 8);
      __m256 a2 = _mm256_loadu_ps(a + d + 16);
      __m256 a3 = _mm256_loadu_ps(a + d + 24);
      for (std::int64_t r = 0; r < rows; ++r) {
        const __m256 pr = _mm256_broadcast_ss(p + r);
        const float* x = vh + r * stride + d;
        a0 = _mm256_fmadd_ps(pr, _mm256_loadu_ps(x), a0);
        a1 = _mm256_fmadd_ps(pr, _mm256_loadu_ps(x + 8), a1);
        a2 = _mm256_fmadd_ps(pr, _mm256_loadu_ps(x + 16), a2);
        a3 = _mm256_fmadd_ps(pr, _mm256_loadu_ps(x + 24), a3);
      }
      _mm256_storeu_ps(a + d, a0);
      _mm256_storeu_ps(a + d + 8, a1);
      _mm256_storeu_ps(a + d + 16, a2);
      _mm256_storeu_ps(a + d + 24, a3);
    }
    for (; d + 8 <= head_dim; d += 8) {
      __m256 a0 = _mm256_loadu_ps(a + d);
      for (std::int64_t r = 0; r < rows; ++r) {
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r), _mm256_loadu_ps(vh + r * stride + d), a0);
      }
      _mm256_storeu_ps(a + d, a0);
    }
    for (; d < head_dim; ++d) {
      float sum = a[d];
      for (std::int64_t r = 0; r < rows; ++r) sum += p[r] * vh[r * stride + d];
      a[d] = sum;
    }
  }
}

// exp for x <= 0 (scores minus their maximum), 8 lanes: Cody-Waite reduction x = n ln2 + r,
// |r| <= ln2 / 2, then Cephes' degree-6 polynomial for e^r; within 2 ulp of expf. Inputs below
// -87.3 are clamped there (the result, ~1e-38, is negligible next to the maximum's 1).
DUET_TARGET_AVX2 inline __m256 ExpNonPositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365478515625f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
}

DUET_TARGET_AVX2 void ExpAvx2(float* x, std::int64_t n, float max) {
  const __m256 m = _mm256_set1_ps(max);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), m)));
  }
  if (i < n) {
    alignas(32) float tail[8] = {};
    std::memcpy(tail, x + i, static_cast<std::size_t>(n - i) * sizeof(float));
    _mm256_store_ps(tail, ExpNonPositive(_mm256_sub_ps(_mm256_load_ps(tail), m)));
    std::memcpy(x + i, tail, static_cast<std::size_t>(n - i) * sizeof(float));
  }
}

#endif  // DUET_KERNELS_X86

struct Kernels {
  ScoreFn score;
  AccumulateFn accumulate;
  ExpFn exp;
};

Kernels SelectKernels() {
#if DUET_KERNELS_X86
  if (ActiveIsa() == Isa::kAvx2) return {ScoreAvx2, AccumulateAvx2, ExpAvx2};
#endif
  return {ScoreBaseline, AccumulateBaseline, ExpBaseline};
}

// ---------------------------------------------------------------------------------------------

// The partial softmax of one partition for every head: max[h], sum[h] = sum exp(s - max[h]),
// acc[h][:] = sum exp(s - max[h]) v. Laid out [heads][head_dim + 2] = acc..., max, sum.
std::int64_t PartialFloats(const Shape& shape) { return shape.heads * (shape.head_dim + 2); }

// Element offset of `position`'s row (all KV heads) from the start of the layer's K or V.
std::int64_t RowOffset(const PagedKvLayer& layer, std::span<const std::int32_t> block_table,
                       std::int64_t position) {
  const std::int64_t block = block_table[position / layer.block_tokens];
  return block * layer.stride() + (position % layer.block_tokens) *
                                      static_cast<std::int64_t>(layer.kv_heads) * layer.head_dim;
}

struct Call {
  Shape shape;
  const PagedKvLayer* layer;
  std::span<const std::int32_t> block_table;
  float scale;
  Kernels kernels;

  // Address of the cache row (all KV heads) of `position`.
  const char* Row(const void* cache, std::int64_t position) const {
    return static_cast<const char*>(cache) +
           RowOffset(*layer, block_table, position) *
               static_cast<std::int64_t>(WeightDtypeBytes(layer->dtype));
  }

  // Rows in the run starting at p: consecutive positions in [p, p1) within one block (so
  // their rows are contiguous), at most max_rows.
  std::int64_t RunRows(std::int64_t p, std::int64_t p1, std::int64_t max_rows) const {
    const std::int64_t block_tokens = layer->block_tokens;
    const std::int64_t block_end = (p / block_tokens + 1) * block_tokens;
    return std::min({p1 - p, block_end - p, max_rows});
  }

  // Calls fn(first_position, rows, fp32_rows, next_run) for the runs covering [p0, p1). An fp32
  // cache is read in place and the kernels prefetch the next run; a 16-bit one is widened a run
  // at a time into this thread's scratch (runs end at block boundaries, so a run is at most a
  // block), after prefetching the next run's 16-bit rows here.
  template <typename Fn>
  void ForEachRun(const void* cache, std::int64_t p0, std::int64_t p1, std::int64_t max_rows,
                  Fn fn) const {
    const bool widen = layer->dtype != WeightDtype::kF32;
    thread_local std::vector<float> widened;
    if (widen) {
      const auto need = static_cast<std::size_t>(layer->block_tokens * shape.row_stride);
      if (widened.size() < need) widened.resize(need);
    }
    const auto row_bytes =
        shape.row_stride * static_cast<std::int64_t>(WeightDtypeBytes(layer->dtype));
    std::int64_t rows = RunRows(p0, p1, max_rows);
    for (std::int64_t p = p0; p < p1;) {
      const std::int64_t next_p = p + rows;
      const std::int64_t next_rows = next_p < p1 ? RunRows(next_p, p1, max_rows) : 0;
      const char* row = Row(cache, p);
      if (!widen) {
        NextRun next;
        if (next_rows > 0) {
          next = NextRun{reinterpret_cast<const float*>(Row(cache, next_p)), next_rows};
        }
        fn(p, rows, reinterpret_cast<const float*>(row), next);
      } else {
        if (next_rows > 0) {
          const char* ahead = Row(cache, next_p);
          for (std::int64_t b = 0; b < next_rows * row_bytes; b += 64) {
            __builtin_prefetch(ahead + b, /*rw=*/0, /*locality=*/3);
          }
        }
        ConvertToF32(row, layer->dtype, rows * shape.row_stride, widened.data());
        fn(p, rows, widened.data(), NextRun{});
      }
      p = next_p;
      rows = next_rows;
    }
  }

  // Partial softmax of q (one token, [heads][head_dim]) over positions [p0, p1).
  void Partition(const float* q, std::int64_t p0, std::int64_t p1, float* partial) const {
    const std::int64_t heads = shape.heads, head_dim = shape.head_dim;
    thread_local std::vector<float> scratch;
    const auto need = static_cast<std::size_t>(heads * (kPartition + head_dim));
    if (scratch.size() < need) scratch.resize(need);
    float* scores = scratch.data();                    // [heads][kPartition]
    float* acc = scratch.data() + heads * kPartition;  // [heads][head_dim]
    const std::int64_t n = p1 - p0;

    ForEachRun(layer->k, p0, p1, kPartition,
               [&](std::int64_t p, std::int64_t rows, const float* k, NextRun next) {
                 kernels.score(shape, q, k, rows, next, scale, scores + (p - p0));
               });
    for (std::int64_t h = 0; h < heads; ++h) {
      float* s = scores + h * kPartition;
      const float max_score = *std::max_element(s, s + n);
      kernels.exp(s, n, max_score);
      double sum = 0.0;
      for (std::int64_t i = 0; i < n; ++i) sum += s[i];
      partial[h * (head_dim + 2) + head_dim] = max_score;
      partial[h * (head_dim + 2) + head_dim + 1] = static_cast<float>(sum);
    }
    std::memset(acc, 0, static_cast<std::size_t>(heads * head_dim) * sizeof(float));
    ForEachRun(layer->v, p0, p1, kRowGroup,
               [&](std::int64_t p, std::int64_t rows, const float* v, NextRun next) {
                 kernels.accumulate(shape, scores + (p - p0), v, rows, next, acc);
               });
    for (std::int64_t h = 0; h < heads; ++h) {
      std::memcpy(partial + h * (head_dim + 2), acc + h * head_dim,
                  static_cast<std::size_t>(head_dim) * sizeof(float));
    }
  }
};

// Folds `count` partials of one token (in partition order) into out [heads][head_dim]:
// rescales running (max, sum, acc) to the larger max at each step, then divides by the sum.
// Used the same way however the partials were computed, so results are bit-identical.
void FoldPartials(const Shape& shape, const float* partials, std::int64_t count, float* out) {
  const std::int64_t head_dim = shape.head_dim, stride = PartialFloats(shape);
  for (std::int64_t h = 0; h < shape.heads; ++h) {
    float* o = out + h * head_dim;
    const float* first = partials + h * (head_dim + 2);
    std::memcpy(o, first, static_cast<std::size_t>(head_dim) * sizeof(float));
    float max = first[head_dim];
    float sum = first[head_dim + 1];
    for (std::int64_t r = 1; r < count; ++r) {
      const float* part = partials + r * stride + h * (head_dim + 2);
      const float new_max = std::max(max, part[head_dim]);
      const float old_weight = std::exp(max - new_max);
      const float part_weight = std::exp(part[head_dim] - new_max);
      for (std::int64_t d = 0; d < head_dim; ++d) o[d] = o[d] * old_weight + part[d] * part_weight;
      sum = sum * old_weight + part[head_dim + 1] * part_weight;
      max = new_max;
    }
    const float inv_sum = 1.0f / sum;
    for (std::int64_t d = 0; d < head_dim; ++d) o[d] *= inv_sum;
  }
}

void CheckLayer(const PagedKvLayer& layer) {
  DUET_CHECK(layer.k != nullptr && layer.v != nullptr);
  DUET_CHECK(layer.block_tokens > 0 && layer.kv_heads > 0 && layer.head_dim > 0);
  DUET_CHECK(layer.num_blocks > 0);
  DUET_CHECK(layer.block_stride == 0 || layer.block_stride >= layer.block_elements());
}

// The first `blocks` entries of the table exist and name blocks of the layer.
void CheckTable(const PagedKvLayer& layer, std::span<const std::int32_t> block_table,
                std::int64_t blocks) {
  DUET_CHECK_MSG(static_cast<std::int64_t>(block_table.size()) >= blocks,
                 "block table has " + std::to_string(block_table.size()) + " blocks, needs " +
                     std::to_string(blocks));
  for (std::int64_t b = 0; b < blocks; ++b) {
    DUET_CHECK_MSG(block_table[b] >= 0 && block_table[b] < layer.num_blocks,
                   "block id " + std::to_string(block_table[b]) + " outside the cache of " +
                       std::to_string(layer.num_blocks) + " blocks");
  }
}

std::int64_t Partitions(std::int64_t visible) { return (visible + kPartition - 1) / kPartition; }

// Tiled prefill. Each KV head's keys and values are gathered from the paged cache into
// contiguous [position][head_dim] matrices once per call; then for a tile of query tokens and
// every query head of one KV head's group, two library products do the work: scores = Q K^T over
// the positions the tile's last token sees, a causal softmax per row (fp32, summed in double,
// normalised before the second product), and out = P V. The softmax is exact, not online: a
// tile's whole score rows are kept, tiles shrinking from 64 tokens towards 8 to keep them near
// kMaxTileScores floats. Memory beyond the model's: one layer's K and V of the sequence
// (gathered) and, per thread, a tile's scores.
constexpr std::int64_t kTileTokens = 64;
constexpr std::int64_t kMaxTileScores = std::int64_t{1} << 22;  // 16 MiB of fp32

// Grows a thread's scratch to at least `bytes` and returns it.
unsigned char* Scratch(std::vector<unsigned char>& buffer, std::int64_t bytes) {
  if (buffer.size() < static_cast<std::size_t>(bytes))
    buffer.resize(static_cast<std::size_t>(bytes));
  return buffer.data();
}

void TiledAttention(float* out, const float* q, std::int64_t n_tokens, std::int64_t heads,
                    const PagedKvLayer& layer, std::span<const std::int32_t> block_table,
                    std::int64_t context_before, float scale, ExpFn exp, ThreadPool* pool) {
  const std::int64_t kv_heads = layer.kv_heads, head_dim = layer.head_dim;
  const std::int64_t group = heads / kv_heads;
  const std::int64_t total = context_before + n_tokens;
  const WeightDtype dtype = layer.dtype;
  const auto element_bytes = static_cast<std::int64_t>(WeightDtypeBytes(dtype));
  const std::int64_t matrix_bytes = total * head_dim * element_bytes;
  const std::int64_t head_bytes = head_dim * element_bytes;

  // The caller's buffer, reached from the workers through this pointer (a thread_local named
  // inside the lambdas would be each worker's own).
  thread_local std::vector<unsigned char> gathered_storage;
  unsigned char* gathered = Scratch(gathered_storage, 2 * kv_heads * matrix_bytes);
  auto keys = [&](std::int64_t g) { return gathered + 2 * g * matrix_bytes; };
  auto values = [&](std::int64_t g) { return gathered + (2 * g + 1) * matrix_bytes; };
  ParallelFor(
      pool, total,
      [&](std::int64_t p0, std::int64_t p1) {
        for (std::int64_t p = p0; p < p1; ++p) {
          const std::int64_t offset = RowOffset(layer, block_table, p) * element_bytes;
          const auto* k_row = static_cast<const unsigned char*>(layer.k) + offset;
          const auto* v_row = static_cast<const unsigned char*>(layer.v) + offset;
          for (std::int64_t g = 0; g < kv_heads; ++g) {
            std::memcpy(keys(g) + p * head_bytes, k_row + g * head_bytes,
                        static_cast<std::size_t>(head_bytes));
            std::memcpy(values(g) + p * head_bytes, v_row + g * head_bytes,
                        static_cast<std::size_t>(head_bytes));
          }
        }
      },
      /*min_chunk=*/64);

  // Tiles depend on the shape only, so results do not depend on the pool.
  const std::int64_t tile =
      std::clamp<std::int64_t>(kMaxTileScores / (group * total), 8, kTileTokens);
  const std::int64_t tiles = (n_tokens + tile - 1) / tile;
  ParallelFor(pool, kv_heads * tiles, [&](std::int64_t i0, std::int64_t i1) {
    thread_local std::vector<unsigned char> query_storage, score_storage, prob_storage,
        result_storage;
    for (std::int64_t item = i0; item < i1; ++item) {
      const std::int64_t g = item / tiles;
      const std::int64_t t0 = (item % tiles) * tile;
      const std::int64_t t1 = std::min(n_tokens, t0 + tile);
      const std::int64_t count = t1 - t0, rows = group * count;
      const std::int64_t seen = context_before + t1;  // positions the tile's last token sees
      // Rows ordered (query head of the group, token).
      unsigned char* queries = Scratch(query_storage, rows * head_bytes);
      auto* scores = reinterpret_cast<float*>(Scratch(score_storage, rows * seen * 4));
      auto* results = reinterpret_cast<float*>(Scratch(result_storage, rows * head_dim * 4));
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t h = g * group + r / count, t = t0 + r % count;
        ConvertFromF32(q + (t * heads + h) * head_dim, head_dim, dtype, queries + r * head_bytes);
      }
      OneDnnAttentionScores(scores, queries, rows, keys(g), seen, head_dim, dtype);
      for (std::int64_t r = 0; r < rows; ++r) {
        float* s = scores + r * seen;
        const std::int64_t visible = context_before + t0 + r % count + 1;
        for (std::int64_t j = 0; j < visible; ++j) s[j] *= scale;
        exp(s, visible, *std::max_element(s, s + visible));
        double sum = 0.0;
        for (std::int64_t j = 0; j < visible; ++j) sum += s[j];
        const auto inv_sum = static_cast<float>(1.0 / sum);
        for (std::int64_t j = 0; j < visible; ++j) s[j] *= inv_sum;
        std::fill(s + visible, s + seen, 0.0f);
      }
      const void* probs = scores;
      if (dtype != WeightDtype::kF32) {
        unsigned char* rounded = Scratch(prob_storage, rows * seen * element_bytes);
        ConvertFromF32(scores, rows * seen, dtype, rounded);
        probs = rounded;
      }
      OneDnnAttentionValues(results, probs, rows, values(g), seen, head_dim, dtype);
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t h = g * group + r / count, t = t0 + r % count;
        std::memcpy(out + (t * heads + h) * head_dim, results + r * head_dim,
                    static_cast<std::size_t>(head_dim) * sizeof(float));
      }
    }
  });
}

}  // namespace

bool PagedAttentionIsTiled(std::int64_t n_tokens, WeightDtype cache_dtype) {
  return n_tokens >= kTiledMinTokens && GemmLibraryEnabled() && OneDnnSupports(cache_dtype);
}

void WriteKv(const PagedKvLayer& layer, std::span<const std::int32_t> block_table,
             std::int64_t start_position, std::int64_t n_tokens, const float* k_new,
             const float* v_new) {
  CheckLayer(layer);
  DUET_CHECK(start_position >= 0 && n_tokens >= 0);
  if (n_tokens == 0) return;
  DUET_CHECK(k_new != nullptr && v_new != nullptr);
  const std::int64_t end = start_position + n_tokens;
  CheckTable(layer, block_table, (end + layer.block_tokens - 1) / layer.block_tokens);
  const std::int64_t row = static_cast<std::int64_t>(layer.kv_heads) * layer.head_dim;
  const auto element_bytes = static_cast<std::int64_t>(WeightDtypeBytes(layer.dtype));
  for (std::int64_t t = 0; t < n_tokens; ++t) {
    const std::int64_t offset = RowOffset(layer, block_table, start_position + t) * element_bytes;
    ConvertFromF32(k_new + t * row, row, layer.dtype, static_cast<char*>(layer.k) + offset);
    ConvertFromF32(v_new + t * row, row, layer.dtype, static_cast<char*>(layer.v) + offset);
  }
}

void PagedAttention(float* out, const float* q, std::int64_t n_tokens, std::int64_t heads,
                    const PagedKvLayer& layer, std::span<const std::int32_t> block_table,
                    std::int64_t context_before, float scale, ThreadPool* pool) {
  CheckLayer(layer);
  DUET_CHECK(out != nullptr && q != nullptr);
  DUET_CHECK(n_tokens >= 0 && context_before >= 0);
  DUET_CHECK(heads > 0 && heads % layer.kv_heads == 0);
  if (n_tokens == 0) return;
  const std::int64_t total = context_before + n_tokens;
  CheckTable(layer, block_table, (total + layer.block_tokens - 1) / layer.block_tokens);

  if (PagedAttentionIsTiled(n_tokens, layer.dtype)) {
    TiledAttention(out, q, n_tokens, heads, layer, block_table, context_before, scale,
                   SelectKernels().exp, pool);
    return;
  }
  const Call call{Shape{heads, heads / layer.kv_heads, layer.head_dim,
                        static_cast<std::int64_t>(layer.kv_heads) * layer.head_dim},
                  &layer, block_table, scale, SelectKernels()};
  const std::int64_t token_floats = heads * layer.head_dim;
  const std::int64_t partial_floats = PartialFloats(call.shape);
  const int threads = pool == nullptr ? 1 : pool->threads();

  // Few tokens (decode, small chunks): spread (token, partition) pairs over the pool, keep
  // their partials, then fold them per token.
  const std::int64_t pairs = [&] {
    std::int64_t sum = 0;
    for (std::int64_t i = 0; i < n_tokens; ++i) sum += Partitions(context_before + i + 1);
    return sum;
  }();
  if (threads > 1 && n_tokens < 4 * threads &&
      pairs * partial_floats * static_cast<std::int64_t>(sizeof(float)) <= kMaxPartialBytes) {
    thread_local std::vector<float> partials;
    thread_local std::vector<std::int64_t> first_pair;  // [token] -> index of its first pair
    if (partials.size() < static_cast<std::size_t>(pairs * partial_floats)) {
      partials.resize(static_cast<std::size_t>(pairs * partial_floats));
    }
    first_pair.resize(static_cast<std::size_t>(n_tokens + 1));
    first_pair[0] = 0;
    for (std::int64_t i = 0; i < n_tokens; ++i) {
      first_pair[i + 1] = first_pair[i] + Partitions(context_before + i + 1);
    }
    float* partial_data = partials.data();
    const std::int64_t* firsts = first_pair.data();
    ParallelFor(pool, pairs, [&](std::int64_t j0, std::int64_t j1) {
      std::int64_t token = std::upper_bound(firsts, firsts + n_tokens + 1, j0) - firsts - 1;
      for (std::int64_t j = j0; j < j1; ++j) {
        while (firsts[token + 1] <= j) ++token;
        const std::int64_t p0 = (j - firsts[token]) * kPartition;
        const std::int64_t p1 = std::min(context_before + token + 1, p0 + kPartition);
        call.Partition(q + token * token_floats, p0, p1, partial_data + j * partial_floats);
      }
    });
    ParallelFor(pool, n_tokens, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t t = t0; t < t1; ++t) {
        FoldPartials(call.shape, partial_data + firsts[t] * partial_floats,
                     firsts[t + 1] - firsts[t], out + t * token_floats);
      }
    });
    return;
  }

  // Many tokens (prefill) or no pool: one token per work item, its partitions in order.
  ParallelFor(pool, n_tokens, [&](std::int64_t t0, std::int64_t t1) {
    thread_local std::vector<float> partials;
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t visible = context_before + t + 1;
      const std::int64_t count = Partitions(visible);
      if (partials.size() < static_cast<std::size_t>(count * partial_floats)) {
        partials.resize(static_cast<std::size_t>(count * partial_floats));
      }
      for (std::int64_t r = 0; r < count; ++r) {
        call.Partition(q + t * token_floats, r * kPartition,
                       std::min(visible, (r + 1) * kPartition),
                       partials.data() + r * partial_floats);
      }
      FoldPartials(call.shape, partials.data(), count, out + t * token_floats);
    }
  });
}

}  // namespace duet::kernels::cpu
