// The CUDA kernels of a Llama-family layer, the GPU counterparts of kernels/cpu (the reference
// they are tested against): embedding, RMSNorm, RoPE, SwiGLU, the paged KV cache with
// attention for prefill chunks and decode tokens, greedy sampling, and matrix multiplies on
// cuBLAS. Storage is bf16 (weights, KV cache, matmul inputs), accumulation fp32; activations
// between kernels are fp32 and row-major. Every pointer is device memory unless said
// otherwise. All calls are asynchronous on the given stream; errors in launching are broken
// invariants (DUET_CUDA_CHECK aborts with file and line).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/status.h"

#define DUET_CUDA_CHECK(expr)                                                      \
  do {                                                                             \
    const cudaError_t duet_cuda_err = (expr);                                      \
    DUET_CHECK_MSG(duet_cuda_err == cudaSuccess,                                   \
                   std::string(#expr) + ": " + cudaGetErrorString(duet_cuda_err)); \
  } while (0)
#define DUET_CUBLAS_CHECK(expr)                                               \
  do {                                                                        \
    const cublasStatus_t duet_cublas_status = (expr);                         \
    DUET_CHECK_MSG(duet_cublas_status == CUBLAS_STATUS_SUCCESS,               \
                   std::string(#expr) + ": cuBLAS status " +                  \
                       std::to_string(static_cast<int>(duet_cublas_status))); \
  } while (0)

namespace duet::kernels::cuda {

using Bf16 = std::uint16_t;  // raw bf16 bits, as stored in safetensors

// Number of CUDA devices usable here (0 without a driver or a device); never fails.
int DeviceCount();
// "NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB" for device 0, or why there is none.
std::string DescribeDevice();

// out[t][:] = table row ids[t] (bf16) as fp32; table is [vocab][dim]. Ids must be valid.
void Embedding(float* out, const std::int32_t* ids, std::int64_t n, const Bf16* table,
               std::int64_t dim, cudaStream_t stream);

// Per row: y = (x * rsqrt(mean(x^2) + eps)) * gamma, fp32 math, gamma bf16 [dim]; y fp32, or
// rounded to bf16 for a matrix multiply to read.
void RmsNorm(float* out, const float* in, std::int64_t rows, std::int64_t dim, const Bf16* gamma,
             float eps, cudaStream_t stream);
void RmsNorm(Bf16* out, const float* in, std::int64_t rows, std::int64_t dim, const Bf16* gamma,
             float eps, cudaStream_t stream);

// Rotary embedding in place (HF rotate_half pairs (i, i + head_dim / 2)) on q [n][heads][hd]
// and k [n][kv_heads][hd]; token t at positions[t]; inv_freq [hd / 2] (device).
void Rope(float* q, std::int64_t heads, float* k, std::int64_t kv_heads, std::int64_t head_dim,
          const std::int32_t* positions, std::int64_t n, const float* inv_freq,
          float attention_scaling, cudaStream_t stream);

// out [n][inter] = silu(gate) * up from gate_up [n][2 * inter] (gate, then up: one multiply
// by the stacked weights makes both), fp32 or rounded to bf16.
void SwiGluFused(float* out, const float* gate_up, std::int64_t n, std::int64_t inter,
                 cudaStream_t stream);
void SwiGluFused(Bf16* out, const float* gate_up, std::int64_t n, std::int64_t inter,
                 cudaStream_t stream);

// A bias row added to every row of out [rows][cols] (bias bf16 [cols]).
void AddBias(float* out, const Bf16* bias, std::int64_t rows, std::int64_t cols,
             cudaStream_t stream);

// out[i][:] = in[rows[i]][:] for i < n; rows of `width` floats.
void GatherRows(float* out, const float* in, const std::int32_t* rows, std::int64_t n,
                std::int64_t width, cudaStream_t stream);

// One layer's paged KV cache in device memory, bf16, [block][slot][kv_head][head_dim] as on
// the CPU.
struct PagedKvLayer {
  Bf16* k = nullptr;
  Bf16* v = nullptr;
  std::int32_t block_tokens = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int64_t num_blocks = 0;
};

// Stores n tokens' keys and values (fp32 [n][kv_heads * head_dim], rounded to bf16) at the
// physical slots slot_of[t] = block * block_tokens + slot that the host computed from each
// sequence's block table.
void WriteKv(const PagedKvLayer& layer, const std::int64_t* slot_of, std::int64_t n,
             const float* k_new, const float* v_new, cudaStream_t stream);

// Causal grouped-query attention over the paged cache for a mixed batch of tokens of many
// sequences: token t (query q[t], [heads][head_dim]) attends over positions 0 .. positions[t]
// of its sequence, whose block table starts at block_tables + table_offset[t]; only those
// blocks are read, each K and V row once for all the query heads that share it. Online softmax
// in fp32. Computes n rows: rows[0 .. n) (nullptr: tokens 0 .. n). max_context bounds their
// positions[t] + 1. The positions are cut into `splits` ranges computed in parallel and merged
// (0: as many as keep every multiprocessor busy, for decode batches of few tokens); their
// partial results go to `workspace`, grown as needed. out is [tokens][heads][head_dim], fp32 or
// rounded to bf16. head_dim <= 256, heads a multiple of kv_heads.
template <typename T>
class DeviceBuffer;
void PagedAttention(float* out, const float* q, std::int64_t n, const std::int32_t* rows,
                    std::int64_t heads, const PagedKvLayer& layer, const std::int32_t* block_tables,
                    const std::int32_t* table_offset, const std::int32_t* positions,
                    std::int64_t max_context, float scale, DeviceBuffer<float>* workspace,
                    int splits, cudaStream_t stream);
void PagedAttention(Bf16* out, const float* q, std::int64_t n, const std::int32_t* rows,
                    std::int64_t heads, const PagedKvLayer& layer, const std::int32_t* block_tables,
                    const std::int32_t* table_offset, const std::int32_t* positions,
                    std::int64_t max_context, float scale, DeviceBuffer<float>* workspace,
                    int splits, cudaStream_t stream);

// The same attention for prefill chunks, on the tensor cores: each tile is up to kPrefillTileRows
// consecutive tokens of one sequence at consecutive positions (first_token indexes q, positions
// and table_offset, as above). Q and the softmax weights are rounded to bf16 for the products
// (as flash attention does), so results agree with PagedAttention to bf16 precision, not
// exactly. Only for the head sizes PrefillAttentionSupports; tiles is device memory.
constexpr int kPrefillTileRows = 64;
struct PrefillTile {
  std::int32_t first_token = 0;
  std::int32_t rows = 0;  // 1 .. kPrefillTileRows
};
bool PrefillAttentionSupports(std::int64_t head_dim);
void PrefillAttention(float* out, const float* q, std::int64_t heads, const PagedKvLayer& layer,
                      const std::int32_t* block_tables, const std::int32_t* table_offset,
                      const std::int32_t* positions, const PrefillTile* tiles,
                      std::int64_t num_tiles, float scale, cudaStream_t stream);
void PrefillAttention(Bf16* out, const float* q, std::int64_t heads, const PagedKvLayer& layer,
                      const std::int32_t* block_tables, const std::int32_t* table_offset,
                      const std::int32_t* positions, const PrefillTile* tiles,
                      std::int64_t num_tiles, float scale, cudaStream_t stream);

// tokens[r] = the index of the largest of logits[r][0 .. vocab), the lowest among equal ones,
// NaN never chosen (0 for a row of NaNs): kernels::cpu::Sample at temperature 0.
void Argmax(std::int32_t* tokens, const float* logits, std::int64_t rows, std::int64_t vocab,
            cudaStream_t stream);

// out[m][n] (fp32) = in[m][k] (bf16) x W^T with W bf16 [n][k] as Hugging Face stores Linear
// weights, on cuBLAS with fp32 accumulation; with `accumulate`, out += in x W^T (a residual
// connection in the same pass). The handle must be bound to the stream.
void MatMul(cublasHandle_t handle, float* out, const Bf16* in, std::int64_t m, const Bf16* w,
            std::int64_t n, std::int64_t k, bool accumulate = false);

}  // namespace duet::kernels::cuda
