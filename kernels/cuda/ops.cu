// CUDA kernels of a Llama-family layer (see cuda_kernels.h). Written for clarity first: each
// kernel is the CPU reference's loop with one thread (or one block) per independent piece.
// Attention and argmax use block reductions; everything accumulates in fp32.
#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>
#include <cstdio>

#include "kernels/cuda/cuda_kernels.h"

namespace duet::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kAttentionThreads = 128;  // = the partition of positions, as on the CPU
constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ float Bf16ToFloat(Bf16 bits) {
  return __uint_as_float(static_cast<unsigned>(bits) << 16);
}

__device__ __forceinline__ Bf16 FloatToBf16(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

unsigned Blocks(std::int64_t count, int threads = kThreads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

// Sum (or max) of `v` over the block; every thread gets the result. blockDim.x <= 1024 and a
// multiple of 32. `scratch` holds 32 floats.
template <bool kMax>
__device__ float BlockReduce(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
  for (int offset = 16; offset > 0; offset /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  return v;
}

__global__ void EmbeddingKernel(float* out, const std::int32_t* ids, const Bf16* table,
                                std::int64_t dim) {
  const std::int64_t t = blockIdx.x;
  const Bf16* row = table + static_cast<std::int64_t>(ids[t]) * dim;
  for (std::int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    out[t * dim + d] = Bf16ToFloat(row[d]);
}

__global__ void RmsNormKernel(float* out, const float* in, std::int64_t dim, const Bf16* gamma,
                              float eps) {
  __shared__ float scratch[32];
  const float* x = in + blockIdx.x * dim;
  float sum = 0.0f;
  for (std::int64_t d = threadIdx.x; d < dim; d += blockDim.x) sum += x[d] * x[d];
  sum = BlockReduce<false>(sum, scratch);
  const float inv = rsqrtf(sum / static_cast<float>(dim) + eps);
  float* y = out + blockIdx.x * dim;
  for (std::int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    y[d] = (x[d] * inv) * Bf16ToFloat(gamma[d]);
}

// One block per token; threads walk the (head, pair) grid of q, then of k.
__global__ void RopeKernel(float* q, std::int64_t heads, float* k, std::int64_t kv_heads,
                           std::int64_t head_dim, const std::int32_t* positions,
                           const float* inv_freq, float attention_scaling) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  const std::int64_t total = (heads + kv_heads) * half;
  for (std::int64_t i = threadIdx.x; i < total; i += blockDim.x) {
    const std::int64_t head = i / half, j = i % half;
    float* x = head < heads ? q + (t * heads + head) * head_dim
                            : k + (t * kv_heads + (head - heads)) * head_dim;
    const float freq = pos * inv_freq[j];
    const float c = cosf(freq) * attention_scaling, s = sinf(freq) * attention_scaling;
    const float a = x[j], b = x[j + half];
    x[j] = a * c - b * s;
    x[j + half] = b * c + a * s;
  }
}

__device__ __forceinline__ float Silu(float x) { return x / (1.0f + expf(-x)); }

__global__ void SwiGluKernel(float* out, const float* gate, const float* up, std::int64_t count) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = Silu(gate[i]) * up[i];
}

__global__ void SwiGluFusedKernel(float* out, const float* gate_up, std::int64_t n,
                                  std::int64_t inter) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * inter) return;
  const std::int64_t t = i / inter, c = i % inter;
  out[i] = Silu(gate_up[t * 2 * inter + c]) * gate_up[t * 2 * inter + inter + c];
}

__global__ void ToBf16Kernel(Bf16* out, const float* in, std::int64_t count) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) out[i] = FloatToBf16(in[i]);
}

__global__ void AddInPlaceKernel(float* x, const float* y, std::int64_t count) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) x[i] += y[i];
}

__global__ void AddBiasKernel(float* out, const Bf16* bias, std::int64_t rows, std::int64_t cols) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * cols) out[i] += Bf16ToFloat(bias[i % cols]);
}

__global__ void GatherRowsKernel(float* out, const float* in, const std::int32_t* rows,
                                 std::int64_t width) {
  const float* src = in + static_cast<std::int64_t>(rows[blockIdx.x]) * width;
  float* dst = out + static_cast<std::int64_t>(blockIdx.x) * width;
  for (std::int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

__global__ void WriteKvKernel(PagedKvLayer layer, const std::int64_t* slot_of, const float* k_new,
                              const float* v_new) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t width = static_cast<std::int64_t>(layer.kv_heads) * layer.head_dim;
  const std::int64_t base = slot_of[t] * width;
  for (std::int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    layer.k[base + i] = FloatToBf16(k_new[t * width + i]);
    layer.v[base + i] = FloatToBf16(v_new[t * width + i]);
  }
}

// One block of 128 threads per (token, head). Positions are taken 128 at a time: thread i
// scores position start + i against the query, the block forms the partition's max and
// exp-sum, rescales the running sums (online softmax), and then every thread accumulates the
// value rows of the partition for its own output dimensions (d = tid, tid + 128).
__global__ void PagedAttentionKernel(float* out, const float* q, std::int64_t heads,
                                     PagedKvLayer layer, const std::int32_t* block_tables,
                                     const std::int32_t* table_offset,
                                     const std::int32_t* positions, float scale) {
  __shared__ float q_row[kMaxHeadDim];
  __shared__ float weights[kAttentionThreads];
  __shared__ float scratch[32];
  const std::int64_t t = blockIdx.x, h = blockIdx.y;
  const int tid = threadIdx.x;
  const std::int64_t hd = layer.head_dim;
  const std::int64_t group = heads / layer.kv_heads;
  const std::int64_t kv_head = h / group;
  const std::int64_t row_width = static_cast<std::int64_t>(layer.kv_heads) * hd;
  const std::int32_t* table = block_tables + table_offset[t];
  const std::int64_t context = static_cast<std::int64_t>(positions[t]) + 1;
  for (std::int64_t d = tid; d < hd; d += blockDim.x) q_row[d] = q[(t * heads + h) * hd + d];
  __syncthreads();

  float running_max = -INFINITY, running_sum = 0.0f;
  float acc0 = 0.0f, acc1 = 0.0f;  // output dims tid and tid + 128
  for (std::int64_t start = 0; start < context; start += kAttentionThreads) {
    const std::int64_t p = start + tid;
    float score = -INFINITY;
    if (p < context) {
      const std::int64_t slot =
          static_cast<std::int64_t>(table[p / layer.block_tokens]) * layer.block_tokens +
          p % layer.block_tokens;
      const Bf16* key = layer.k + slot * row_width + kv_head * hd;
      float dot = 0.0f;
      for (std::int64_t d = 0; d < hd; ++d) dot += q_row[d] * Bf16ToFloat(key[d]);
      score = dot * scale;
    }
    const float chunk_max = BlockReduce<true>(score, scratch);
    const float new_max = fmaxf(running_max, chunk_max);
    const float w = p < context ? expf(score - new_max) : 0.0f;
    const float chunk_sum = BlockReduce<false>(w, scratch);
    const float correction = expf(running_max - new_max);  // 0 on the first partition
    running_sum = running_sum * correction + chunk_sum;
    acc0 *= correction;
    acc1 *= correction;
    running_max = new_max;
    weights[tid] = w;
    __syncthreads();
    const std::int64_t rows = min(static_cast<std::int64_t>(kAttentionThreads), context - start);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t pos = start + r;
      const std::int64_t slot =
          static_cast<std::int64_t>(table[pos / layer.block_tokens]) * layer.block_tokens +
          pos % layer.block_tokens;
      const Bf16* value = layer.v + slot * row_width + kv_head * hd;
      const float wr = weights[r];
      if (tid < hd) acc0 += wr * Bf16ToFloat(value[tid]);
      if (tid + kAttentionThreads < hd) acc1 += wr * Bf16ToFloat(value[tid + kAttentionThreads]);
    }
    __syncthreads();  // weights is rewritten by the next partition
  }
  float* o = out + (t * heads + h) * hd;
  const float inv = 1.0f / running_sum;
  if (tid < hd) o[tid] = acc0 * inv;
  if (tid + kAttentionThreads < hd) o[tid + kAttentionThreads] = acc1 * inv;
}

// One block per row: each thread keeps its best (value, index), then the block reduces with
// "larger value, else lower index" so that ties and the scan order agree with the CPU.
__global__ void ArgmaxKernel(std::int32_t* tokens, const float* logits, std::int64_t vocab) {
  __shared__ float best_value[kThreads];
  __shared__ std::int32_t best_index[kThreads];
  const float* row = logits + blockIdx.x * vocab;
  float value = -INFINITY;
  std::int32_t index = -1;
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float x = row[i];
    if (isnan(x)) continue;
    if (index < 0 || x > value) {  // strict: within a thread, ids only grow
      value = x;
      index = static_cast<std::int32_t>(i);
    }
  }
  best_value[threadIdx.x] = value;
  best_index[threadIdx.x] = index;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float v = best_value[threadIdx.x + stride];
      const std::int32_t j = best_index[threadIdx.x + stride];
      const std::int32_t i = best_index[threadIdx.x];
      const bool take = j >= 0 && (i < 0 || v > best_value[threadIdx.x] ||
                                   (v == best_value[threadIdx.x] && j < i));
      if (take) {
        best_value[threadIdx.x] = v;
        best_index[threadIdx.x] = j;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) tokens[blockIdx.x] = best_index[0] < 0 ? 0 : best_index[0];
}

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" / "no device" error
    return 0;
  }
  return n;
}

std::string DescribeDevice() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(err);
  }
  if (n == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "CUDA device 0: properties unknown";
  char memory[32];
  std::snprintf(memory, sizeof memory, "%.1f GiB",
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return std::string(prop.name) + ", sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + memory;
}

void Embedding(float* out, const std::int32_t* ids, std::int64_t n, const Bf16* table,
               std::int64_t dim, cudaStream_t stream) {
  if (n == 0) return;
  EmbeddingKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(out, ids, table, dim);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void RmsNorm(float* out, const float* in, std::int64_t rows, std::int64_t dim, const Bf16* gamma,
             float eps, cudaStream_t stream) {
  if (rows == 0) return;
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(out, in, dim, gamma, eps);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void Rope(float* q, std::int64_t heads, float* k, std::int64_t kv_heads, std::int64_t head_dim,
          const std::int32_t* positions, std::int64_t n, const float* inv_freq,
          float attention_scaling, cudaStream_t stream) {
  if (n == 0) return;
  RopeKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      q, heads, k, k ? kv_heads : 0, head_dim, positions, inv_freq, attention_scaling);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void SwiGlu(float* out, const float* gate, const float* up, std::int64_t n, std::int64_t inter,
            cudaStream_t stream) {
  if (n * inter == 0) return;
  SwiGluKernel<<<Blocks(n * inter), kThreads, 0, stream>>>(out, gate, up, n * inter);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void SwiGluFused(float* out, const float* gate_up, std::int64_t n, std::int64_t inter,
                 cudaStream_t stream) {
  if (n * inter == 0) return;
  SwiGluFusedKernel<<<Blocks(n * inter), kThreads, 0, stream>>>(out, gate_up, n, inter);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void ToBf16(Bf16* out, const float* in, std::int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  ToBf16Kernel<<<Blocks(count), kThreads, 0, stream>>>(out, in, count);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void AddInPlace(float* x, const float* y, std::int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  AddInPlaceKernel<<<Blocks(count), kThreads, 0, stream>>>(x, y, count);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void AddBias(float* out, const Bf16* bias, std::int64_t rows, std::int64_t cols,
             cudaStream_t stream) {
  if (rows * cols == 0) return;
  AddBiasKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(out, bias, rows, cols);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void GatherRows(float* out, const float* in, const std::int32_t* rows, std::int64_t n,
                std::int64_t width, cudaStream_t stream) {
  if (n == 0) return;
  GatherRowsKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(out, in, rows, width);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void WriteKv(const PagedKvLayer& layer, const std::int64_t* slot_of, std::int64_t n,
             const float* k_new, const float* v_new, cudaStream_t stream) {
  if (n == 0) return;
  WriteKvKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(layer, slot_of, k_new, v_new);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void PagedAttention(float* out, const float* q, std::int64_t n, std::int64_t heads,
                    const PagedKvLayer& layer, const std::int32_t* block_tables,
                    const std::int32_t* table_offset, const std::int32_t* positions, float scale,
                    cudaStream_t stream) {
  DUET_CHECK(layer.head_dim <= kMaxHeadDim && layer.kv_heads > 0 && heads % layer.kv_heads == 0);
  if (n == 0) return;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(heads));
  PagedAttentionKernel<<<grid, kAttentionThreads, 0, stream>>>(out, q, heads, layer, block_tables,
                                                               table_offset, positions, scale);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void Argmax(std::int32_t* tokens, const float* logits, std::int64_t rows, std::int64_t vocab,
            cudaStream_t stream) {
  if (rows == 0) return;
  ArgmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(tokens, logits, vocab);
  DUET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace duet::kernels::cuda
