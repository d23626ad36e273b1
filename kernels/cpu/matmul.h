// Linear layers on the CPU: out[m][n] = sum_k in[m][k] * W[n][k] (+ bias[n]), i.e. x · W^T with
// W stored [out_features][in_features] as Hugging Face does, in F32, BF16 or F16. M = 1 (decode)
// is a weight-streaming GEMV; M > 1 a cache-blocked GEMM. Both accumulate in fp32. From
// kLibraryMinRows rows on, fp32 and bf16 products go to oneDNN (onednn_gemm.h: AMX and AVX-512
// where the CPU has them), which rounds the inputs of a bf16 product to bf16 as PyTorch does.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight.h"

namespace duet::kernels::cpu {

// out: [m][w.rows], in: [m][w.cols] (both fp32, row-major, not overlapping). bias: null or
// w.rows values of any WeightDtype (Qwen2's q/k/v biases are stored in the model dtype).
// pool: null runs on the calling thread. Results do not depend on the pool's thread count.
void MatMul(float* out, const float* in, std::int64_t m, const Weight& w, const Weight* bias,
            ThreadPool* pool);

// Rows from which MatMul hands fp32 and bf16 products to oneDNN: from 4 rows on it was faster
// than Duet's GEMM on the development machine (bf16 2304x768: 1.4x at 4 rows, 2.1x at 8, 7.4x
// at 512; bench/kernels BM_Gemm, docs/benchmarks.md). Below it, products stay on Duet's
// kernels, which allocate nothing per call.
inline constexpr std::int64_t kLibraryMinRows = 4;
// Whether MatMul uses oneDNN at all: yes unless DUET_KERNELS_GEMM=duet is set in the
// environment or the baseline instruction-set path is active. Tests and benchmarks switch it.
// SetGemmLibraryForTesting returns the setting it replaced (false on the baseline path only
// because of the path: the setting itself may be true).
bool GemmLibraryEnabled();
bool SetGemmLibraryForTesting(bool enabled);
// Whether MatMul of m rows and weights of this dtype runs on oneDNN now, on this CPU.
bool MatMulUsesLibrary(std::int64_t m, WeightDtype dtype);

}  // namespace duet::kernels::cpu
