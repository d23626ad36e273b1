// MatMul (see matmul.h). GEMV (m = 1): W read once, four prefetched row streams per thread,
// bf16/f16 widened in registers, eight FMA chains. GEMM (m > 1): items of (64 rows of in) x (48
// rows of W) widen W 512 columns at a time into a small fp32 tile and run a 4x3 register-blocked
// dot-product micro-kernel over it (in and W are both k-contiguous, so no packing is needed).
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

void GemvBaseline(const Weight& w, const float* x, std::int64_t n0, std::int64_t n1, float* out) {
  if (w.dtype == WeightDtype::kF32) {
    for (std::int64_t n = n0; n < n1; ++n) {
      out[n] = DotBaseline(reinterpret_cast<const float*>(RowBytes(w, n)), x, w.cols);
    }
    return;
  }
  constexpr std::int64_t kPiece = 256;
  float converted[kPiece];
  for (std::int64_t n = n0; n < n1; ++n) {
    const char* row = RowBytes(w, n);
    float sum = 0.0f;
    for (std::int64_t k = 0; k < w.cols; k += kPiece) {
      const std::int64_t len = std::min(kPiece, w.cols - k);
      ConvertToF32(row + k * 2, w.dtype, len, converted);
      sum += DotBaseline(converted, x + k, len);
    }
    out[n] = sum;
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

DUET_TARGET_AVX2 void GemvAvx2(const Weight& w, const float* x, std::int64_t n0, std::int64_t n1,
                               float* out) {
  switch (w.dtype) {
    case WeightDtype::kF32:
      GemvAvx2Typed<WeightDtype::kF32>(w, x, n0, n1, out);
      return;
    case WeightDtype::kBF16:
      GemvAvx2Typed<WeightDtype::kBF16>(w, x, n0, n1, out);
      return;
    case WeightDtype::kF16:
      GemvAvx2Typed<WeightDtype::kF16>(w, x, n0, n1, out);
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

using GemvFn = void (*)(const Weight&, const float*, std::int64_t, std::int64_t, float*);
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

}  // namespace

bool GemmLibraryEnabled() {
  return ActiveIsa() != Isa::kBaseline && LibrarySlot().load(std::memory_order_relaxed);
}

bool SetGemmLibraryForTesting(bool enabled) {
  return LibrarySlot().exchange(enabled, std::memory_order_relaxed);
}

bool MatMulUsesLibrary(std::int64_t m, WeightDtype dtype) {
  return m >= kLibraryMinRows && GemmLibraryEnabled() && OneDnnSupports(dtype);
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

  if (m == 1) {
    const GemvFn gemv = SelectGemv();
    const std::int64_t steps = (n_out + kGemvRowsPerStep - 1) / kGemvRowsPerStep;
    ParallelFor(
        pool, steps,
        [&](std::int64_t s0, std::int64_t s1) {
          const std::int64_t n0 = s0 * kGemvRowsPerStep;
          const std::int64_t n1 = std::min(n_out, s1 * kGemvRowsPerStep);
          gemv(w, in, n0, n1, out);
          if (bias_f32 != nullptr) AddBias(out, 0, 1, n0, n1, n_out, bias_f32);
        },
        /*min_chunk=*/16);
    return;
  }

  if (MatMulUsesLibrary(m, w.dtype)) {
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
