// Prefill-sized matrix multiplies through oneDNN (Debian's libdnnl), which reaches AMX and
// AVX-512 where the CPU has them: on the development machine (Sapphire Rapids, 2 cores) about
// 1 TFLOP/s in bf16 against ~0.14 for Duet's own AVX2 GEMM (docs/benchmarks.md). Used by
// MatMul (matmul.h); not part of the kernels' public surface.
//
// Threading: Duet's pool runs the work, not oneDNN's OpenMP runtime. Output columns are cut
// into fixed slices of kSliceColumns (independent of the thread count, so results are too), and
// each pool thread runs a single-threaded oneDNN primitive on its slices. No OpenMP team is
// ever started, so nothing spins beside the pool.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight.h"

namespace duet::kernels::cpu {

// Whether OneDnnMatMul takes weights of this dtype on this CPU: fp32 and bf16 where oneDNN has
// an optimised (not reference) kernel for them, probed once per dtype.
bool OneDnnSupports(WeightDtype dtype);

// out[m][w.rows] = in[m][w.cols] . W^T, as MatMul without the bias. For bf16 weights the inputs
// are rounded to bf16 (round to nearest even, as PyTorch's bf16 Linear does) and the products
// accumulate in fp32; fp32 weights multiply fp32 inputs. Allocates (oneDNN memory objects, and
// primitives the first time a shape is seen): meant for prefill-sized m.
void OneDnnMatMul(float* out, const float* in, std::int64_t m, const Weight& w, ThreadPool* pool);

// The two products of tiled attention, single-threaded on the calling thread (a pool job), with
// every operand already in `dtype` (OneDnnSupports) and fp32 results, all row-contiguous:
//   scores[m][n] = queries[m][head_dim] . keys[n][head_dim]^T
//   out[m][head_dim] = probs[m][n] . values[n][head_dim]
void OneDnnAttentionScores(float* scores, const void* queries, std::int64_t m, const void* keys,
                           std::int64_t n, std::int64_t head_dim, WeightDtype dtype);
void OneDnnAttentionValues(float* out, const void* probs, std::int64_t m, const void* values,
                           std::int64_t n, std::int64_t head_dim, WeightDtype dtype);

// The two products of tiled attention, single-threaded on the calling thread (a pool job), with
// every operand already in `dtype` (fp32 or bf16, OneDnnSupports) and fp32 results; head_dim is
// the reduction (scores) resp. output (values) width, row-contiguous everywhere:
//   scores[m][n] (row stride n) = queries[m][head_dim] . keys[n][head_dim]^T
//   out[m][head_dim] = probs[m][n] . values[n][head_dim]
void OneDnnAttentionScores(float* scores, const void* queries, std::int64_t m, const void* keys,
                           std::int64_t n, std::int64_t head_dim, WeightDtype dtype);
void OneDnnAttentionValues(float* out, const void* probs, std::int64_t m, const void* values,
                           std::int64_t n, std::int64_t head_dim, WeightDtype dtype);

}  // namespace duet::kernels::cpu
