// Linear layers on the CPU: out[m][n] = sum_k in[m][k] * W[n][k] (+ bias[n]), i.e. x · W^T with
// W stored [out_features][in_features] as Hugging Face does, in F32, BF16 or F16. M = 1 (decode)
// is a weight-streaming GEMV; M > 1 a cache-blocked GEMM. Both accumulate in fp32.
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

}  // namespace duet::kernels::cpu
