// Linear layers (see cuda_kernels.h): bf16 inputs and weights, fp32 output and accumulation.
// One row (a decode step of one sequence) is a matrix-vector product bound by reading the
// weights once: a kernel of our own, a warp per output feature reading its weight row in 16-byte
// pieces, streams them at close to the copy bandwidth, where cuBLAS splits k and adds a
// reduction launch (Llama-3.1-8B on an H100: a decode step in 7.5 ms against 9.2 ms on cuBLAS;
// docs/benchmarks.md). More rows go to cuBLAS, on the tensor cores: with 8 rows this kernel,
// which reloads the input rows for every weight piece, was slower than cuBLAS (12.5 ms against
// 9.5), and a variant with 4 features a warp left too few warps in flight.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

namespace duet::kernels::cuda {

namespace {

constexpr int kGemvWarps = 8;

__device__ __forceinline__ void Unpack(const uint4& v, float (&x)[8]) {
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(words[i] << 16);
    x[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvKernel(float* out, const Bf16* in, const Bf16* w, std::int64_t n, std::int64_t k,
               bool accumulate) {
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  if (col >= n) return;
  const int lane = threadIdx.x % 32;
  const uint4* row = reinterpret_cast<const uint4*>(w + col * k);
  const uint4* x = reinterpret_cast<const uint4*>(in);
  const std::int64_t pieces = k / 8;
  float acc = 0.0f;
#pragma unroll 4
  for (std::int64_t p = lane; p < pieces; p += 32) {
    float wf[8], xf[8];
    Unpack(__ldg(row + p), wf);
    Unpack(__ldg(x + p), xf);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += wf[i] * xf[i];
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (lane == 0) out[col] = accumulate ? out[col] + acc : acc;
}

bool Aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

void MatMul(cublasHandle_t handle, float* out, const Bf16* in, std::int64_t m, const Bf16* w,
            std::int64_t n, std::int64_t k, bool accumulate) {
  if (m == 0) return;
  if (m == 1 && k % 8 == 0 && Aligned16(in) && Aligned16(w)) {
    cudaStream_t stream = nullptr;
    DUET_CUBLAS_CHECK(cublasGetStream(handle, &stream));
    const auto blocks = static_cast<unsigned>((n + kGemvWarps - 1) / kGemvWarps);
    GemvKernel<<<blocks, kGemvWarps * 32, 0, stream>>>(out, in, w, n, k, accumulate);
    DUET_CUDA_CHECK(cudaGetLastError());
    return;
  }
  // cuBLAS is column-major: row-major out [m][n] is column-major out^T (n x m), which is
  // W (n x k: the column-major k x n matrix W^T, transposed) times in^T (k x m).
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  DUET_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                                 static_cast<int>(m), static_cast<int>(k), &alpha, w, CUDA_R_16BF,
                                 static_cast<int>(k), in, CUDA_R_16BF, static_cast<int>(k), &beta,
                                 out, CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

}  // namespace duet::kernels::cuda
