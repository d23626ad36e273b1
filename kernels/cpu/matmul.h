// Linear layers on the CPU: out[m][n] = sum_k in[m][k] * W[n][k] (+ bias[n]), i.e. x · W^T with
// W stored [out_features][in_features] as Hugging Face does, in F32, BF16 or F16. Few rows (decode
// batches) run a weight-streaming GEMV that reads W once per call whatever m is; more rows run
// oneDNN (onednn_gemm.h: AMX and AVX-512 where the CPU has them), which rounds the inputs of a
// bf16 product to bf16 as PyTorch does, or, where oneDNN does not take the product, Duet's
// cache-blocked GEMM. Duet's kernels accumulate in fp32.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight.h"

namespace duet::kernels::cpu {

// out: [m][w.rows], in: [m][w.cols] (both fp32, row-major, not overlapping). bias: null or
// w.rows values of any WeightDtype (Qwen2's q/k/v biases are stored in the model dtype).
// pool: null runs on the calling thread. Results do not depend on the pool's thread count.
void MatMul(float* out, const float* in, std::int64_t m, const Weight& w, const Weight* bias,
            ThreadPool* pool);

// Rows from which MatMul hands fp32 and bf16 products to oneDNN; fewer run the GEMV. The GEMV
// costs about as much for 2-4 rows as for 1 (it streams W once; decode is memory-bound) and then
// grows with m, FMA-bound, while oneDNN costs about the same for any m from 2 to 32, 2.5-3.3x the
// one-row GEMV (its cost goes with W, not with m). Measured on the bench model's decode shapes
// (bf16, 2 threads, on the 2-core development VM, a Xeon with AMX; bench/kernels BM_SmallM),
// GEMV time / oneDNN time: 768x2048 0.66 at 8 rows, 0.90 at 11, 0.95 at 12, 1.08 at 13;
// 2048x768 0.75, 0.99, 1.05, 1.21; 32000x768 (lm_head) 0.78, 0.98, 1.03, 1.18; 768x768 and
// 256x768 (k, v) still below 1 at 13. So 11 rows is the largest count where the GEMV was not
// slower on any of them. The sum over the bench model's decode step (BM_DecodeMatMuls) agrees:
// GEMV 20.1 ms, oneDNN 23.2 at 11 rows, level within noise at 12 and 13 (the small projections
// favour the GEMV a little longer; the larger shapes, which bigger models are made of, do not).
// (fp32 weights, twice the bytes, stay memory-bound longer: 2048x768 fp32 crossed at ~16 rows.)
inline constexpr std::int64_t kLibraryMinRows = 12;
// Where oneDNN does not take the product (fp16 weights, the baseline path, DUET_KERNELS_GEMM=
// duet), rows from which Duet's GEMM runs instead of the GEMV. The GEMM widens W into fp32
// tiles that it then rereads; it was slower than the GEMV at every m up to 31 on the shapes
// above in bf16 except the lm_head, where it drew level (within 2%) from 27 rows, and on
// 2048x768 in fp16 and fp32 (GEMV/GEMM 0.86 and 0.93 at 32). On the baseline path bf16 and fp32
// were at least as fast up to ~28 rows; fp16, whose scalar widening dominates there, ran 15-20%
// slower than the GEMM below 8 rows, as the one-row GEMV already did.
inline constexpr std::int64_t kGemmMinRows = 32;
// Whether MatMul uses oneDNN at all: yes unless DUET_KERNELS_GEMM=duet is set in the
// environment or the baseline instruction-set path is active. Tests and benchmarks switch it.
// SetGemmLibraryForTesting returns the setting it replaced (false on the baseline path only
// because of the path: the setting itself may be true).
bool GemmLibraryEnabled();
bool SetGemmLibraryForTesting(bool enabled);
// The kernels MatMul chooses between.
enum class MatMulKernel {
  kGemv,     // weight-streaming: W read once per call, widened in registers
  kGemm,     // Duet's cache-blocked GEMM
  kLibrary,  // oneDNN
};
// "gemv", "gemm" or "onednn" (benchmark labels, test messages).
const char* ToString(MatMulKernel kernel);
// The kernel MatMul of m rows and weights of this dtype runs now, on this CPU.
MatMulKernel MatMulKernelFor(std::int64_t m, WeightDtype dtype);
// Whether that is oneDNN.
bool MatMulUsesLibrary(std::int64_t m, WeightDtype dtype);
// Makes MatMul run `kernel` for every m (kLibrary only where oneDNN takes the dtype, Duet's
// GEMM elsewhere), or choose by m again (nullopt). Returns the forcing it replaced.
std::optional<MatMulKernel> ForceMatMulKernelForTesting(std::optional<MatMulKernel> kernel);

}  // namespace duet::kernels::cpu
