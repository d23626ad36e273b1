// CUDA kernels of a Llama-family layer (see cuda_kernels.h). Written for clarity first: each
// kernel is the CPU reference's loop with one thread (or one block) per independent piece.
// Attention and argmax use block reductions; everything accumulates in fp32.
#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <type_traits>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_buffer.h"

namespace duet::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ float Bf16ToFloat(Bf16 bits) {
  return __uint_as_float(static_cast<unsigned>(bits) << 16);
}

__device__ __forceinline__ Bf16 FloatToBf16(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

template <typename Out>
// Stores v as fp32, or rounded to bf16.
__device__ __forceinline__ void StoreAs(Out* p, float v) {
  if constexpr (std::is_same_v<Out, float>) {
    *p = v;
  } else {
    *p = FloatToBf16(v);
  }
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

template <typename Out>
__global__ void RmsNormKernel(Out* out, const float* in, std::int64_t dim, const Bf16* gamma,
                              float eps) {
  __shared__ float scratch[32];
  const float* x = in + blockIdx.x * dim;
  float sum = 0.0f;
  for (std::int64_t d = threadIdx.x; d < dim; d += blockDim.x) sum += x[d] * x[d];
  sum = BlockReduce<false>(sum, scratch);
  const float inv = rsqrtf(sum / static_cast<float>(dim) + eps);
  Out* y = out + blockIdx.x * dim;
  for (std::int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    StoreAs(y + d, (x[d] * inv) * Bf16ToFloat(gamma[d]));
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

template <typename Out>
__global__ void SwiGluFusedKernel(Out* out, const float* gate_up, std::int64_t n,
                                  std::int64_t inter) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * inter) return;
  const std::int64_t t = i / inter, c = i % inter;
  StoreAs(out + i, Silu(gate_up[t * 2 * inter + c]) * gate_up[t * 2 * inter + inter + c]);
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

// Attention (see PagedAttention in cuda_kernels.h). A block of kAttnWarps warps serves one
// token, kG query heads that share one KV head (their K and V rows are read once for all), and
// one split of the positions (several splits when few tokens would leave the device idle:
// flash-decoding). A warp takes every kAttnWarps-th position of the split, two at a time so that
// four row loads are in flight: the 32 lanes hold kE consecutive elements of each row, the
// score of each head is a warp-wide sum, and each warp keeps an online softmax in the log2
// domain (scores pre-scaled by log2(e) / sqrt(head_dim)). The warps then merge in shared
// memory; with one split the block writes the output, else a partial (sum of weighted values,
// max, sum of weights) that AttentionCombineKernel merges.
constexpr int kAttnWarps = 4;
constexpr int kMinSplitPositions = 128;

template <int kE>
__device__ __forceinline__ void LoadRow(float (&x)[kE], const Bf16* row, int lane, int hd,
                                        bool vector) {
  const int base = lane * kE;
  if (vector && base < hd) {  // hd % kE == 0: the row start is aligned to kE elements
    if constexpr (kE == 8) {
      const uint4 w = *reinterpret_cast<const uint4*>(row + base);
      const unsigned words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[2 * i] = __uint_as_float(words[i] << 16);
        x[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
      }
      return;
    } else if constexpr (kE == 4) {
      const uint2 w = *reinterpret_cast<const uint2*>(row + base);
      x[0] = __uint_as_float(w.x << 16);
      x[1] = __uint_as_float(w.x & 0xffff0000u);
      x[2] = __uint_as_float(w.y << 16);
      x[3] = __uint_as_float(w.y & 0xffff0000u);
      return;
    } else if constexpr (kE == 2) {
      const unsigned w = *reinterpret_cast<const unsigned*>(row + base);
      x[0] = __uint_as_float(w << 16);
      x[1] = __uint_as_float(w & 0xffff0000u);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) x[e] = base + e < hd ? Bf16ToFloat(row[base + e]) : 0.0f;
}

template <int kE, int kG, typename Out>
__global__ void __launch_bounds__(kAttnWarps * 32)
    PagedAttentionKernel(Out* out, float* partial, const float* q, int heads, PagedKvLayer layer,
                         const std::int32_t* block_tables, const std::int32_t* table_offset,
                         const std::int32_t* positions, float scale_log2, int splits,
                         std::int64_t split_len) {
  __shared__ float sm_max[kAttnWarps][kG], sm_sum[kAttnWarps][kG];
  __shared__ float sm_acc[kAttnWarps][kG][kMaxHeadDim];
  const std::int64_t t = blockIdx.x;
  const int head0 = blockIdx.y * kG;  // the first of this block's query heads
  const int split = blockIdx.z;
  const int hd = layer.head_dim, bt = layer.block_tokens;
  const int kv_head = head0 / (heads / layer.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool vector = hd % kE == 0;
  const std::int64_t row_width = static_cast<std::int64_t>(layer.kv_heads) * hd;
  const std::int32_t* table = block_tables + table_offset[t];
  const std::int64_t context = static_cast<std::int64_t>(positions[t]) + 1;
  const std::int64_t begin = split * split_len;
  const std::int64_t end = min(context, begin + split_len);

  float qr[kG][kE], acc[kG][kE], run_max[kG], run_sum[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const float* row = q + (t * heads + head0 + g) * hd;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int d = lane * kE + e;
      qr[g][e] = d < hd ? row[d] * scale_log2 : 0.0f;
      acc[g][e] = 0.0f;
    }
    run_max[g] = -INFINITY;
    run_sum[g] = 0.0f;
  }
  auto row_of = [&](const Bf16* cache, std::int64_t p) {
    const std::int64_t slot = static_cast<std::int64_t>(table[p / bt]) * bt + p % bt;
    return cache + slot * row_width + static_cast<std::int64_t>(kv_head) * hd;
  };
  auto accumulate = [&](const float (&k)[kE], const float (&v)[kE]) {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < kE; ++e) s += qr[g][e] * k[e];
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
      const float new_max = fmaxf(run_max[g], s);
      const float correction = exp2f(run_max[g] - new_max);  // 0 on the first position
      const float w = exp2f(s - new_max);
      run_sum[g] = run_sum[g] * correction + w;
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[g][e] = acc[g][e] * correction + w * v[e];
      run_max[g] = new_max;
    }
  };
  std::int64_t p = begin + warp;
  for (; p + kAttnWarps < end; p += 2 * kAttnWarps) {
    float k0[kE], v0[kE], k1[kE], v1[kE];
    LoadRow<kE>(k0, row_of(layer.k, p), lane, hd, vector);
    LoadRow<kE>(v0, row_of(layer.v, p), lane, hd, vector);
    LoadRow<kE>(k1, row_of(layer.k, p + kAttnWarps), lane, hd, vector);
    LoadRow<kE>(v1, row_of(layer.v, p + kAttnWarps), lane, hd, vector);
    accumulate(k0, v0);
    accumulate(k1, v1);
  }
  if (p < end) {
    float k0[kE], v0[kE];
    LoadRow<kE>(k0, row_of(layer.k, p), lane, hd, vector);
    LoadRow<kE>(v0, row_of(layer.v, p), lane, hd, vector);
    accumulate(k0, v0);
  }

  // Merge the warps' softmax states.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int d = lane * kE + e;
      if (d < hd) sm_acc[warp][g][d] = acc[g][e];
    }
    if (lane == 0) {
      sm_max[warp][g] = run_max[g];
      sm_sum[warp][g] = run_sum[g];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kG * hd; i += blockDim.x) {
    const int g = i / hd, d = i % hd;
    float m = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) m = fmaxf(m, sm_max[w][g]);
    float sum = 0.0f, value = 0.0f;
    if (m != -INFINITY) {  // else no position of this split is in the context
      for (int w = 0; w < kAttnWarps; ++w) {
        const float f = exp2f(sm_max[w][g] - m);
        sum += sm_sum[w][g] * f;
        value += sm_acc[w][g][d] * f;
      }
    }
    const std::int64_t row = t * heads + head0 + g;
    if (splits == 1) {
      StoreAs(out + row * hd + d, value / sum);  // sum > 0: position 0 is always in context
    } else {
      float* part = partial + (row * splits + split) * (hd + 2);
      part[d] = value;
      if (d == 0) {
        part[hd] = m;
        part[hd + 1] = sum;
      }
    }
  }
}

// One block per (token, head): merges the splits' partials into the output row.
template <typename Out>
__global__ void AttentionCombineKernel(Out* out, const float* partial, int heads, int hd,
                                       int splits) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * heads + blockIdx.y;
  const float* parts = partial + row * splits * (hd + 2);
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, parts[s * (hd + 2) + hd]);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f, value = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* part = parts + s * (hd + 2);
      if (part[hd + 1] == 0.0f) continue;  // an empty split (its max is -inf)
      const float f = exp2f(part[hd] - m);
      sum += part[hd + 1] * f;
      value += part[d] * f;
    }
    StoreAs(out + row * hd + d, value / sum);
  }
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

template <typename Out>
void RmsNormAs(Out* out, const float* in, std::int64_t rows, std::int64_t dim, const Bf16* gamma,
               float eps, cudaStream_t stream) {
  if (rows == 0) return;
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(out, in, dim, gamma, eps);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void RmsNorm(float* out, const float* in, std::int64_t rows, std::int64_t dim, const Bf16* gamma,
             float eps, cudaStream_t stream) {
  RmsNormAs(out, in, rows, dim, gamma, eps, stream);
}

void RmsNorm(Bf16* out, const float* in, std::int64_t rows, std::int64_t dim, const Bf16* gamma,
             float eps, cudaStream_t stream) {
  RmsNormAs(out, in, rows, dim, gamma, eps, stream);
}

void Rope(float* q, std::int64_t heads, float* k, std::int64_t kv_heads, std::int64_t head_dim,
          const std::int32_t* positions, std::int64_t n, const float* inv_freq,
          float attention_scaling, cudaStream_t stream) {
  if (n == 0) return;
  RopeKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      q, heads, k, k ? kv_heads : 0, head_dim, positions, inv_freq, attention_scaling);
  DUET_CUDA_CHECK(cudaGetLastError());
}

template <typename Out>
void SwiGluFusedAs(Out* out, const float* gate_up, std::int64_t n, std::int64_t inter,
                   cudaStream_t stream) {
  if (n * inter == 0) return;
  SwiGluFusedKernel<<<Blocks(n * inter), kThreads, 0, stream>>>(out, gate_up, n, inter);
  DUET_CUDA_CHECK(cudaGetLastError());
}

void SwiGluFused(float* out, const float* gate_up, std::int64_t n, std::int64_t inter,
                 cudaStream_t stream) {
  SwiGluFusedAs(out, gate_up, n, inter, stream);
}

void SwiGluFused(Bf16* out, const float* gate_up, std::int64_t n, std::int64_t inter,
                 cudaStream_t stream) {
  SwiGluFusedAs(out, gate_up, n, inter, stream);
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

namespace {

int MultiprocessorCount() {
  static const int count = [] {
    int device = 0, n = 0;
    DUET_CUDA_CHECK(cudaGetDevice(&device));
    DUET_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }();
  return count;
}

template <int kE, typename Out>
void LaunchAttention(Out* out, float* partial, const float* q, std::int64_t n, int heads,
                     int group_heads, const PagedKvLayer& layer, const std::int32_t* block_tables,
                     const std::int32_t* table_offset, const std::int32_t* positions,
                     float scale_log2, int splits, std::int64_t split_len, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(heads / group_heads),
                  static_cast<unsigned>(splits));
  const unsigned threads = kAttnWarps * 32;
  auto launch = [&](auto kernel) {
    kernel<<<grid, threads, 0, stream>>>(out, partial, q, heads, layer, block_tables, table_offset,
                                         positions, scale_log2, splits, split_len);
  };
  switch (group_heads) {
    case 8: launch(PagedAttentionKernel<kE, 8, Out>); break;
    case 4: launch(PagedAttentionKernel<kE, 4, Out>); break;
    case 2: launch(PagedAttentionKernel<kE, 2, Out>); break;
    default: launch(PagedAttentionKernel<kE, 1, Out>); break;
  }
}

template <typename Out>
void PagedAttentionAs(Out* out, const float* q, std::int64_t n, std::int64_t heads,
                      const PagedKvLayer& layer, const std::int32_t* block_tables,
                      const std::int32_t* table_offset, const std::int32_t* positions,
                      std::int64_t max_context, float scale, DeviceBuffer<float>* workspace,
                      int splits, cudaStream_t stream) {
  DUET_CHECK(layer.head_dim <= kMaxHeadDim && layer.kv_heads > 0 && heads % layer.kv_heads == 0);
  DUET_CHECK(max_context >= 1 && splits >= 0);
  if (n == 0) return;
  const std::int64_t group = heads / layer.kv_heads;
  int group_heads = 1;  // query heads per block: the largest of 8, 4, 2 dividing the group
  for (int g : {8, 4, 2})
    if (group % g == 0) {
      group_heads = g;
      break;
    }
  if (splits == 0) {  // enough blocks for every multiprocessor a few times over
    const std::int64_t blocks = n * (heads / group_heads);
    const std::int64_t wanted = (4 * MultiprocessorCount() + blocks - 1) / blocks;
    const std::int64_t most = (max_context + kMinSplitPositions - 1) / kMinSplitPositions;
    splits = static_cast<int>(std::max<std::int64_t>(1, std::min(wanted, most)));
  }
  const std::int64_t split_len = (max_context + splits - 1) / splits;
  splits = static_cast<int>((max_context + split_len - 1) / split_len);
  float* partial = nullptr;
  if (splits > 1) {
    workspace->Reserve(static_cast<std::size_t>(n * heads * splits * (layer.head_dim + 2)));
    partial = workspace->get();
  }
  const float scale_log2 = scale * 1.4426950408889634f;  // log2(e)
  const int hd = layer.head_dim, h = static_cast<int>(heads);
  auto launch = [&](auto e) {
    LaunchAttention<decltype(e)::value>(out, partial, q, n, h, group_heads, layer, block_tables,
                                        table_offset, positions, scale_log2, splits, split_len,
                                        stream);
  };
  if (hd <= 32) {
    launch(std::integral_constant<int, 1>{});
  } else if (hd <= 64) {
    launch(std::integral_constant<int, 2>{});
  } else if (hd <= 128) {
    launch(std::integral_constant<int, 4>{});
  } else {
    launch(std::integral_constant<int, 8>{});
  }
  DUET_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(heads));
    AttentionCombineKernel<Out><<<grid, 128, 0, stream>>>(out, partial, h, hd, splits);
    DUET_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void PagedAttention(float* out, const float* q, std::int64_t n, std::int64_t heads,
                    const PagedKvLayer& layer, const std::int32_t* block_tables,
                    const std::int32_t* table_offset, const std::int32_t* positions,
                    std::int64_t max_context, float scale, DeviceBuffer<float>* workspace,
                    int splits, cudaStream_t stream) {
  PagedAttentionAs(out, q, n, heads, layer, block_tables, table_offset, positions, max_context,
                   scale, workspace, splits, stream);
}

void PagedAttention(Bf16* out, const float* q, std::int64_t n, std::int64_t heads,
                    const PagedKvLayer& layer, const std::int32_t* block_tables,
                    const std::int32_t* table_offset, const std::int32_t* positions,
                    std::int64_t max_context, float scale, DeviceBuffer<float>* workspace,
                    int splits, cudaStream_t stream) {
  PagedAttentionAs(out, q, n, heads, layer, block_tables, table_offset, positions, max_context,
                   scale, workspace, splits, stream);
}

void Argmax(std::int32_t* tokens, const float* logits, std::int64_t rows, std::int64_t vocab,
            cudaStream_t stream) {
  if (rows == 0) return;
  ArgmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(tokens, logits, vocab);
  DUET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace duet::kernels::cuda
