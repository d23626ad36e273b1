// Linear layers on cuBLAS (see cuda_kernels.h): bf16 inputs and weights, fp32 output and
// accumulation, tensor cores chosen by cuBLAS.
#include "kernels/cuda/cuda_kernels.h"

namespace duet::kernels::cuda {

void MatMul(cublasHandle_t handle, float* out, const Bf16* in, std::int64_t m, const Bf16* w,
            std::int64_t n, std::int64_t k, bool accumulate) {
  if (m == 0) return;
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
