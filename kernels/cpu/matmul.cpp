// MatMul (see matmul.h). GEMV (few rows): W read once per call, in prefetched interleaved row
// streams, bf16/f16 widened in registers; one row runs four streams with two FMA chains each,
// more rows three streams against groups of up to four input rows (each widened W vector feeds
// an FMA per input row). GEMM: items of (64 rows of in) x (48 rows of W) widen W 512 columns at
// a time into a small fp32 tile and run a 4x3 register-blocked dot-product micro-kernel over it
// (in and W are both k-contiguous, so no packing is needed).
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/onednn_gemm.h"

#if DUET_KERNELS_X86
#include <immintrin.h>
#endif

namespace duet::kernels::cpu {
namespace {

constexpr std::int64_t kGemvRowsPerStep = 4;  // W rows sharing each load of x
// How far ahead of each weight stream the GEMV prefetches. The hardware prefetchers alone left
// the M = 1 bf16 GEMV at ~85% of a plain streaming read; 1-4 KiB ahead measured best (a
// prefetch past a row's end lands in the stream's next row, which is contiguous).
constexpr std::int64_t kGemvPrefetchBytes = 2048;
// The GEMV of m >= 2 rows takes W kGemvMultiStreams rows at a time (interleaved streams, as
// the one-row GEMV takes four) against groups of up to kGemvGroupInputs rows of in: 3 x 4
// accumulators, the widened W vectors and an input vector fit the 16 AVX2 registers, and each
// widened W vector feeds 4 FMAs. Of the blockings tried on the bench model's decode matmuls
// (streams x group = 4x2, 4x3, 3x3, 3x4, 2x4, 2x6, 1x8, 4x4; also 16-column bf16 loads split
// by unpacking against pre-permuted inputs, and widening by byte shuffle, to take the widening
// off the FMA ports), 3x4 with plain widening was fastest, or within the run-to-run noise
// (~10% on this shared 2-core machine), for every m from 2 to 16.
constexpr int kGemvMultiStreams = 3;
constexpr int kGemvGroupInputs = 4;
constexpr std::int64_t kTileK = 512;  // columns of a converted W tile (fp32: 2 KiB/row)
constexpr std::int64_t kTileN = 48;   // W rows per GEMM item (multiple of kNr)
constexpr std::int64_t kTileM = 64;   // in rows per GEMM item (multiple of kMr)
constexpr int kMr = 4;                // micro-kernel rows of in
constexpr int kNr = 3;                // micro-kernel rows of W

const char* RowBytes(const Weight& w, std::int64_t row) {
  return static_cast<const char*>(w.data) +
         static_cast<std::size_t>(row * w.cols) * WeightDtypeBytes(w.dtype);
}

// Scratch reused across calls by each thread (no allocation once warm).
std::vector<float>& ThreadScratch(std::size_t floats) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < floats) scratch.resize(floats);
  return scratch;
}

// ---------------------------------------------------------------------------------------------
// Baseline (SSE2) path: plain loops written so that -O3 vectorises them without reassociation
// (eight independent partial sums).

float DotBaseline(const float* a, const float* b, std::int64_t n) {
  float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (int j = 0; j < 8; ++j) partial[j] += a[k + j] * b[k + j];
  }
  for (int j = 0; k < n; ++k, ++j) partial[j] += a[k] * b[k];
  return ((partial[0] + partial[4]) + (partial[1] + partial[5])) +
         ((partial[2] + partial[6]) + (partial[3] + partial[7]));
}

// out[i][n] for the m rows of in and W rows [n0, n1): each W row is widened 256 columns at a
// time and the piece is used by all m rows while it is in L1. For every (i, n) the sum runs in
// the same order whatever m is (the m = 1 order).
void GemvBaseline(const Weight& w, const float* in, std::int64_t m, std::int64_t n0,
                  std::int64_t n1, float* out) {
  const std::int64_t cols = w.cols;
  if (w.dtype == WeightDtype::kF32) {
    for (std::int64_t n = n0; n < n1; ++n) {
      const float* row = reinterpret_cast<const float*>(RowBytes(w, n));
      for (std::int64_t i = 0; i < m; ++i)
        out[i * w.rows + n] = DotBaseline(row, in + i * cols, cols);
    }
    return;
  }
  constexpr std::int64_t kPiece = 256;
  float converted[kPiece];
  for (std::int64_t n = n0; n < n1; ++n) {
    const char* row = RowBytes(w, n);
    for (std::int64_t i = 0; i < m; ++i) out[i * w.rows + n] = 0.0f;
    for (std::int64_t k = 0; k < cols; k += kPiece) {
      const std::int64_t len = std::min(kPiece, cols - k);
      ConvertToF32(row + k * 2, w.dtype, len, converted);
      for (std::int64_t i = 0; i < m; ++i) {
        out[i * w.rows + n] += DotBaseline(converted, in + i * cols + k, len);
      }
    }
  }
}

// c[i][j] (+)= dot(a row i, b row j) over kt columns, for an mr x nr block.
void BlockBaseline(const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                   std::int64_t kt, float* c, std::int64_t ldc, int mr, int nr, bool accumulate) {
  for (int i = 0; i < mr; ++i) {
    for (int j = 0; j < nr; ++j) {
      const float s = DotBaseline(a + i * lda, b + j * ldb, kt);
      c[i * ldc + j] = accumulate ? c[i * ldc + j] + s : s;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA + F16C path.

#if DUET_KERNELS_X86

DUET_TARGET_AVX2 inline float HorizontalSum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// Eight consecutive weights starting at element i, widened to fp32.
template <WeightDtype D>
DUET_TARGET_AVX2 inline __m256 Load8(const char* row, std::int64_t i) {
  if constexpr (D == WeightDtype::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i * 2));
    if constexpr (D == WeightDtype::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

// The last `count` (< 8) weights from element i, zero-padded to eight.
template <WeightDtype D>
DUET_TARGET_AVX2 inline __m256 Load8Partial(const char* row, std::int64_t i, std::int64_t count) {
  alignas(32) char padded[32] = {};
  constexpr std::size_t kBytes = D == WeightDtype::kF32 ? 4 : 2;
  std::memcpy(padded, row + i * static_cast<std::int64_t>(kBytes),
              static_cast<std::size_t>(count) * kBytes);
  return Load8<D>(padded, 0);
}

DUET_TARGET_AVX2 inline __m256i TailMask(std::int64_t count) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lanes);
}

// out[rows[r]] = dot(W row rows[r], x) for R rows (R <= 4).
template <WeightDtype D, int R>
DUET_TARGET_AVX2 void GemvRowsAvx2(const Weight& w, const std::int64_t* row_ids, const float* x,
                                   float* out) {
  constexpr std::int64_t kBytes = D == WeightDtype::kF32 ? 4 : 2;
  const std::int64_t cols = w.cols;
  const char* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = RowBytes(w, row_ids[r]);
  __m256 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  std::int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + k);
    const __m256 x1 = _mm256_loadu_ps(x + k + 8);
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(rows[r] + k * kBytes + kGemvPrefetchBytes, _MM_HINT_T0);
      acc0[r] = _mm256_fmadd_ps(Load8<D>(rows[r], k), x0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(Load8<D>(rows[r], k + 8), x1, acc1[r]);
    }
  }
  if (k + 8 <= cols) {
    const __m256 x0 = _mm256_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) acc0[r] = _mm256_fmadd_ps(Load8<D>(rows[r], k), x0, acc0[r]);
    k += 8;
  }
  if (k < cols) {
    const __m256 x0 = _mm256_maskload_ps(x + k, TailMask(cols - k));
    for (int r = 0; r < R; ++r) {
      acc1[r] = _mm256_fmadd_ps(Load8Partial<D>(rows[r], k, cols - k), x0, acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[row_ids[r]] = HorizontalSum(_mm256_add_ps(acc0[r], acc1[r]));
}

// Rows [n0, n1) as four interleaved quarters: step i reads rows n0 + i, n0 + q + i, ..., so
// each of the four streams runs through contiguous memory for the whole range and the hardware
// prefetchers keep up (four adjacent rows would restart three short streams every step).
template <WeightDtype D>
DUET_TARGET_AVX2 void GemvAvx2Typed(const Weight& w, const float* x, std::int64_t n0,
                                    std::int64_t n1, float* out) {
  const std::int64_t quarter = (n1 - n0) / kGemvRowsPerStep;
  for (std::int64_t i = 0; i < quarter; ++i) {
    const std::int64_t ids[4] = {n0 + i, n0 + quarter + i, n0 + 2 * quarter + i,
                                 n0 + 3 * quarter + i};
    GemvRowsAvx2<D, 4>(w, ids, x, out);
  }
  for (std::int64_t n = n0 + kGemvRowsPerStep * quarter; n < n1; ++n) {
    GemvRowsAvx2<D, 1>(w, &n, x, out);
  }
}

// Columns [k, k + 8) of GemvRowsMultiAvx2.
template <WeightDtype D, int R, int M>
DUET_TARGET_AVX2 inline void MultiStepAvx2(const char* const* rows, const float* in,
                                           std::int64_t ld_in, std::int64_t k,
                                           __m256 (&acc)[R][M]) {
  __m256 x[M];
  for (int i = 0; i < M; ++i) x[i] = _mm256_loadu_ps(in + i * ld_in + k);
  for (int r = 0; r < R; ++r) {
    const __m256 wv = Load8<D>(rows[r], k);
    for (int i = 0; i < M; ++i) acc[r][i] = _mm256_fmadd_ps(wv, x[i], acc[r][i]);
  }
}

// out[i][rows[r]] = dot(W row rows[r], in row i) for R rows of W and M rows of in (in rows
// w.cols floats apart, out rows w.rows apart): each W vector is loaded and widened once and
// feeds M FMAs. One accumulator chain per (W row, input row), in the same column order whatever
// R and M are, so how the rows are grouped never changes a result.
template <WeightDtype D, int R, int M>
DUET_TARGET_AVX2 void GemvRowsMultiAvx2(const Weight& w, const std::int64_t* row_ids,
                                        const float* in, float* out) {
  constexpr std::int64_t kBytes = D == WeightDtype::kF32 ? 4 : 2;
  const std::int64_t cols = w.cols;
  const char* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = RowBytes(w, row_ids[r]);
  __m256 acc[R][M];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) acc[r][i] = _mm256_setzero_ps();
  }
  std::int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(rows[r] + k * kBytes + kGemvPrefetchBytes, _MM_HINT_T0);
    }
    MultiStepAvx2<D, R, M>(rows, in, cols, k, acc);
    MultiStepAvx2<D, R, M>(rows, in, cols, k + 8, acc);
  }
  if (k + 8 <= cols) {
    MultiStepAvx2<D, R, M>(rows, in, cols, k, acc);
    k += 8;
  }
  if (k < cols) {
    const __m256i mask = TailMask(cols - k);
    for (int r = 0; r < R; ++r) {
      const __m256 wv = Load8Partial<D>(rows[r], k, cols - k);
      for (int i = 0; i < M; ++i) {
        acc[r][i] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(in + i * cols + k, mask), acc[r][i]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < M; ++i) out[i * w.rows + row_ids[r]] = HorizontalSum(acc[r][i]);
  }
}

// `count` (1 <= count <= M) rows of in against R rows of W.
template <WeightDtype D, int R, int M = kGemvGroupInputs>
DUET_TARGET_AVX2 void GemvGroupAvx2(const Weight& w, const std::int64_t* row_ids, const float* in,
                                    std::int64_t count, float* out) {
  if constexpr (M > 1) {
    if (count < M) {
      GemvGroupAvx2<D, R, M - 1>(w, row_ids, in, count, out);
      return;
    }
  }
  GemvRowsMultiAvx2<D, R, M>(w, row_ids, in, out);
}

// All m rows of in against R rows of W, in groups of at most kGemvGroupInputs sized evenly
// (7 rows: 3 + 4; 9: 3 + 3 + 3). The groups after the first reread the R rows from L1, so W
// still streams from memory once per call.
template <WeightDtype D, int R>
DUET_TARGET_AVX2 void GemvGroupsAvx2(const Weight& w, const std::int64_t* row_ids, const float* in,
                                     std::int64_t m, float* out) {
  const std::int64_t groups = (m + kGemvGroupInputs - 1) / kGemvGroupInputs;
  std::int64_t i0 = 0;
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t count = (m - i0) / (groups - g);
    GemvGroupAvx2<D, R>(w, row_ids, in + i0 * w.cols, count, out + i0 * w.rows);
    i0 += count;
  }
}

// m >= 2 rows of in against W rows [n0, n1), as kGemvMultiStreams interleaved streams of W
// rows for the reason GemvAvx2Typed gives.
template <WeightDtype D>
DUET_TARGET_AVX2 void GemvMultiAvx2Typed(const Weight& w, const float* in, std::int64_t m,
                                         std::int64_t n0, std::int64_t n1, float* out) {
  constexpr int R = kGemvMultiStreams;
  const std::int64_t part = (n1 - n0) / R;
  for (std::int64_t i = 0; i < part; ++i) {
    std::int64_t ids[R];
    for (int r = 0; r < R; ++r) ids[r] = n0 + r * part + i;
    GemvGroupsAvx2<D, R>(w, ids, in, m, out);
  }
  for (std::int64_t n = n0 + R * part; n < n1; ++n) GemvGroupsAvx2<D, 1>(w, &n, in, m, out);
}

template <WeightDtype D>
DUET_TARGET_AVX2 void GemvAvx2Dtype(const Weight& w, const float* in, std::int64_t m,
                                    std::int64_t n0, std::int64_t n1, float* out) {
  if (m == 1) {
    GemvAvx2Typed<D>(w, in, n0, n1, out);
  } else {
    GemvMultiAvx2Typed<D>(w, in, m, n0, n1, out);
  }
}

DUET_TARGET_AVX2 void GemvAvx2(const Weight& w, const float* in, std::int64_t m, std::int64_t n0,
                               std::int64_t n1, float* out) {
  switch (w.dtype) {
    case WeightDtype::kF32:
      GemvAvx2Dtype<WeightDtype::kF32>(w, in, m, n0, n1, out);
      return;
    case WeightDtype::kBF16:
      GemvAvx2Dtype<WeightDtype::kBF16>(w, in, m, n0, n1, out);
      return;
    case WeightDtype::kF16:
      GemvAvx2Dtype<WeightDtype::kF16>(w, in, m, n0, n1, out);
      return;
  }
}

// c[i][j] (+)= dot(a row i, b row j) over kt columns: MR x NR accumulators of 8 lanes each,
// every load of a and b feeds NR resp. MR FMAs.
template <int MR, int NR>
DUET_TARGET_AVX2 void MicroKernelAvx2(const float* a, std::int64_t lda, const float* b,
                                      std::int64_t ldb, std::int64_t kt, float* c, std::int64_t ldc,
                                      bool accumulate) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  std::int64_t k = 0;
  for (; k + 8 <= kt; k += 8) {
    __m256 bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = _mm256_loadu_ps(b + j * ldb + k);
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_loadu_ps(a + i * lda + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  if (k < kt) {
    const __m256i mask = TailMask(kt - k);
    __m256 bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = _mm256_maskload_ps(b + j * ldb + k, mask);
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_maskload_ps(a + i * lda + k, mask);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      const float s = HorizontalSum(acc[i][j]);
      c[i * ldc + j] = accumulate ? c[i * ldc + j] + s : s;
    }
  }
}

template <int MR>
DUET_TARGET_AVX2 void MicroKernelRowsAvx2(const float* a, std::int64_t lda, const float* b,
                                          std::int64_t ldb, std::int64_t kt, float* c,
                                          std::int64_t ldc, int nr, bool accumulate) {
  switch (nr) {
    case 3:
      MicroKernelAvx2<MR, 3>(a, lda, b, ldb, kt, c, ldc, accumulate);
      return;
    case 2:
      MicroKernelAvx2<MR, 2>(a, lda, b, ldb, kt, c, ldc, accumulate);
      return;
    default:
      MicroKernelAvx2<MR, 1>(a, lda, b, ldb, kt, c, ldc, accumulate);
      return;
  }
}

DUET_TARGET_AVX2 void BlockAvx2(const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                std::int64_t kt, float* c, std::int64_t ldc, int mr, int nr,
                                bool accumulate) {
  switch (mr) {
    case 4:
      MicroKernelRowsAvx2<4>(a, lda, b, ldb, kt, c, ldc, nr, accumulate);
      return;
    case 3:
      MicroKernelRowsAvx2<3>(a, lda, b, ldb, kt, c, ldc, nr, accumulate);
      return;
    case 2:
      MicroKernelRowsAvx2<2>(a, lda, b, ldb, kt, c, ldc, nr, accumulate);
      return;
    default:
      MicroKernelRowsAvx2<1>(a, lda, b, ldb, kt, c, ldc, nr, accumulate);
      return;
  }
}

#endif  // DUET_KERNELS_X86

// ---------------------------------------------------------------------------------------------

using GemvFn = void (*)(const Weight&, const float*, std::int64_t, std::int64_t, std::int64_t,
                        float*);
using BlockFn = void (*)(const float*, std::int64_t, const float*, std::int64_t, std::int64_t,
                         float*, std::int64_t, int, int, bool);

GemvFn SelectGemv() {
#if DUET_KERNELS_X86
  if (ActiveIsa() == Isa::kAvx2) return GemvAvx2;
#endif
  return GemvBaseline;
}

BlockFn SelectBlock() {
#if DUET_KERNELS_X86
  if (ActiveIsa() == Isa::kAvx2) return BlockAvx2;
#endif
  return BlockBaseline;
}

// One GEMM work item: out[m0:m1][n0:n1] for all of K.
void GemmItem(float* out, const float* in, const Weight& w, std::int64_t m0, std::int64_t m1,
              std::int64_t n0, std::int64_t n1, BlockFn block) {
  const std::int64_t cols = w.cols;
  const std::int64_t out_cols = w.rows;
  float* tile = nullptr;
  if (w.dtype != WeightDtype::kF32) tile = ThreadScratch(kTileN * kTileK).data();
  for (std::int64_t k0 = 0; k0 < cols; k0 += kTileK) {
    const std::int64_t kt = std::min(kTileK, cols - k0);
    // fp32 weights are used in place; 16-bit ones are widened once per item and k-tile.
    const float* b;
    std::int64_t ldb;
    if (tile == nullptr) {
      b = reinterpret_cast<const float*>(RowBytes(w, n0)) + k0;
      ldb = cols;
    } else {
      for (std::int64_t n = n0; n < n1; ++n) {
        ConvertToF32(RowBytes(w, n) + k0 * 2, w.dtype, kt, tile + (n - n0) * kTileK);
      }
      b = tile;
      ldb = kTileK;
    }
    for (std::int64_t m = m0; m < m1; m += kMr) {
      const int mr = static_cast<int>(std::min<std::int64_t>(kMr, m1 - m));
      for (std::int64_t n = n0; n < n1; n += kNr) {
        const int nr = static_cast<int>(std::min<std::int64_t>(kNr, n1 - n));
        block(in + m * cols + k0, cols, b + (n - n0) * ldb, ldb, kt, out + m * out_cols + n,
              out_cols, mr, nr, /*accumulate=*/k0 > 0);
      }
    }
  }
}

void AddBias(float* out, std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1,
             std::int64_t out_cols, const float* bias) {
  for (std::int64_t m = m0; m < m1; ++m) {
    float* row = out + m * out_cols;
    for (std::int64_t n = n0; n < n1; ++n) row[n] += bias[n];
  }
}

std::atomic<bool>& LibrarySlot() {
  static std::atomic<bool> slot{[] {
    const char* forced = std::getenv("DUET_KERNELS_GEMM");
    return forced == nullptr || std::strcmp(forced, "duet") != 0;
  }()};
  return slot;
}

// The kernel ForceMatMulKernelForTesting set, as an int; -1: none.
std::atomic<int>& ForcedSlot() {
  static std::atomic<int> slot{-1};
  return slot;
}

}  // namespace

bool GemmLibraryEnabled() {
  return ActiveIsa() != Isa::kBaseline && LibrarySlot().load(std::memory_order_relaxed);
}

bool SetGemmLibraryForTesting(bool enabled) {
  return LibrarySlot().exchange(enabled, std::memory_order_relaxed);
}

MatMulKernel MatMulKernelFor(std::int64_t m, WeightDtype dtype) {
  const int forced = ForcedSlot().load(std::memory_order_relaxed);
  // Row counts the GEMV takes either way decide without asking oneDNN (whose first question
  // probes it), so decode alone never starts the library.
  if (forced < 0 && m < std::min(kLibraryMinRows, kGemmMinRows)) return MatMulKernel::kGemv;
  const bool library = GemmLibraryEnabled() && OneDnnSupports(dtype);
  if (forced >= 0) {
    const auto kernel = static_cast<MatMulKernel>(forced);
    return kernel == MatMulKernel::kLibrary && !library ? MatMulKernel::kGemm : kernel;
  }
  if (library) return m < kLibraryMinRows ? MatMulKernel::kGemv : MatMulKernel::kLibrary;
  return m < kGemmMinRows ? MatMulKernel::kGemv : MatMulKernel::kGemm;
}

const char* ToString(MatMulKernel kernel) {
  switch (kernel) {
    case MatMulKernel::kGemv:
      return "gemv";
    case MatMulKernel::kGemm:
      return "gemm";
    case MatMulKernel::kLibrary:
      break;
  }
  return "onednn";
}

bool MatMulUsesLibrary(std::int64_t m, WeightDtype dtype) {
  return MatMulKernelFor(m, dtype) == MatMulKernel::kLibrary;
}

std::optional<MatMulKernel> ForceMatMulKernelForTesting(std::optional<MatMulKernel> kernel) {
  const int previous =
      ForcedSlot().exchange(kernel ? static_cast<int>(*kernel) : -1, std::memory_order_relaxed);
  if (previous < 0) return std::nullopt;
  return static_cast<MatMulKernel>(previous);
}

void MatMul(float* out, const float* in, std::int64_t m, const Weight& w, const Weight* bias,
            ThreadPool* pool) {
  DUET_CHECK(out != nullptr && in != nullptr && w.data != nullptr);
  DUET_CHECK(m >= 0 && w.rows > 0 && w.cols > 0);
  if (m == 0) return;
  const std::int64_t n_out = w.rows;
  // A 16-bit bias is widened once per call into the caller's scratch; fp32 is used in place.
  thread_local std::vector<float> bias_widened;
  const float* bias_f32 = nullptr;
  if (bias != nullptr) {
    DUET_CHECK(bias->data != nullptr && bias->elements() == n_out);
    if (bias->dtype == WeightDtype::kF32) {
      bias_f32 = static_cast<const float*>(bias->data);
    } else {
      if (bias_widened.size() < static_cast<std::size_t>(n_out)) {
        bias_widened.resize(static_cast<std::size_t>(n_out));
      }
      ConvertToF32(bias->data, bias->dtype, n_out, bias_widened.data());
      bias_f32 = bias_widened.data();
    }
  }

  const MatMulKernel kernel = MatMulKernelFor(m, w.dtype);
  if (kernel == MatMulKernel::kGemv) {
    const GemvFn gemv = SelectGemv();
    const std::int64_t steps = (n_out + kGemvRowsPerStep - 1) / kGemvRowsPerStep;
    ParallelFor(
        pool, steps,
        [&](std::int64_t s0, std::int64_t s1) {
          const std::int64_t n0 = s0 * kGemvRowsPerStep;
          const std::int64_t n1 = std::min(n_out, s1 * kGemvRowsPerStep);
          gemv(w, in, m, n0, n1, out);
          if (bias_f32 != nullptr) AddBias(out, 0, m, n0, n1, n_out, bias_f32);
        },
        /*min_chunk=*/16);
    return;
  }

  if (kernel == MatMulKernel::kLibrary) {
    OneDnnMatMul(out, in, m, w, pool);
    if (bias_f32 != nullptr) {
      ParallelFor(pool, m, [&](std::int64_t m0, std::int64_t m1) {
        AddBias(out, m0, m1, 0, n_out, n_out, bias_f32);
      });
    }
    return;
  }

  const BlockFn block = SelectBlock();
  const std::int64_t m_tiles = (m + kTileM - 1) / kTileM;
  const std::int64_t n_tiles = (n_out + kTileN - 1) / kTileN;
  // Items run m-tile-major, so the items one thread takes in a row share their rows of `in`.
  ParallelFor(pool, m_tiles * n_tiles, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t item = i0; item < i1; ++item) {
      const std::int64_t m0 = (item / n_tiles) * kTileM;
      const std::int64_t n0 = (item % n_tiles) * kTileN;
      const std::int64_t m1 = std::min(m, m0 + kTileM);
      const std::int64_t n1 = std::min(n_out, n0 + kTileN);
      GemmItem(out, in, w, m0, m1, n0, n1, block);
      if (bias_f32 != nullptr) AddBias(out, m0, m1, n0, n1, n_out, bias_f32);
    }
  });
}

}  // namespace duet::kernels::cpu
