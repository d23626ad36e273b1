// CUDA kernels of a Llama-family layer (see cuda_kernels.h). Written for clarity first: each
// kernel is the CPU reference's loop with one thread (or one block) per independent piece.
// Attention and argmax use block reductions; everything accumulates in fp32.
#include <cuda_bf16.h>
#include <mma.h>

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
  for (std::int64_t i = blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.y) * blockDim.x) {
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
constexpr int kMinSplitPositions = 32;  // fewer: the warps wait on one row after another

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
                         const std::int32_t* positions, const std::int32_t* rows, float scale_log2,
                         int splits, std::int64_t split_len) {
  __shared__ float sm_max[kAttnWarps][kG], sm_sum[kAttnWarps][kG];
  __shared__ float sm_acc[kAttnWarps][kG][kMaxHeadDim];
  const std::int64_t t = rows ? rows[blockIdx.x] : blockIdx.x;
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
  auto accumulate = [&](const float(&k)[kE], const float(&v)[kE]) {
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
    if (splits == 1) {  // sum > 0: position 0 is always in context
      StoreAs(out + (t * heads + head0 + g) * hd + d, value / sum);
    } else {
      const std::int64_t slot = static_cast<std::int64_t>(blockIdx.x) * heads + head0 + g;
      float* part = partial + (slot * splits + split) * (hd + 2);
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
__global__ void AttentionCombineKernel(Out* out, const float* partial, const std::int32_t* rows,
                                       int heads, int hd, int splits) {
  const std::int64_t t = rows ? rows[blockIdx.x] : blockIdx.x;
  const std::int64_t row = t * heads + blockIdx.y;
  const float* parts =
      partial + (static_cast<std::int64_t>(blockIdx.x) * heads + blockIdx.y) * splits * (hd + 2);
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

// Prefill attention on the tensor cores (see PrefillAttention in cuda_kernels.h). A block of 4
// warps takes one tile of up to 64 consecutive query tokens of one sequence and one head, and
// walks the keys 64 at a time up to the tile's last position (the causal triangle): the tile's
// K and V rows are gathered from the paged cache into shared memory, S = Q K^T (bf16 operands,
// fp32 sums) for 16 query rows per warp, an online softmax per row in fp32 (two lanes a row,
// log2 domain), then O += P V with O kept in shared memory in fp32 and rescaled per row.
constexpr int kTileRows = kPrefillTileRows, kTileKeys = 64;

template <int kHd>
struct PrefillSmem {
  static constexpr int kQkv = kHd + 8;      // bf16 row stride of Q, K and V (bank spread)
  static constexpr int kS = kTileKeys + 4;  // fp32 row stride of the scores
  static constexpr int kP = kTileKeys + 8;  // bf16 row stride of the weights
  static constexpr int kO = kHd + 4;        // fp32 row stride of the output
  static constexpr std::size_t kBytes = 3 * kTileRows * kQkv * 2 + kTileRows * kS * 4 +
                                        kTileRows * kP * 2 + kTileRows * kO * 4 + 3 * kTileRows * 4;
};

template <int kHd, typename Out>
__global__ void __launch_bounds__(128)
    PrefillAttentionKernel(Out* out, const float* q, int heads, PagedKvLayer layer,
                           const std::int32_t* block_tables, const std::int32_t* table_offset,
                           const std::int32_t* positions, const PrefillTile* tiles,
                           float scale_log2) {
  namespace wmma = nvcuda::wmma;
  using S = PrefillSmem<kHd>;
  using bf16 = __nv_bfloat16;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTileRows * S::kQkv;
  bf16* vs = ks + kTileKeys * S::kQkv;
  float* ss = reinterpret_cast<float*>(vs + kTileKeys * S::kQkv);
  bf16* ps = reinterpret_cast<bf16*>(ss + kTileRows * S::kS);
  float* os = reinterpret_cast<float*>(ps + kTileRows * S::kP);
  float* row_max = os + kTileRows * S::kO;
  float* row_sum = row_max + kTileRows;
  float* row_corr = row_sum + kTileRows;

  const PrefillTile tile = tiles[blockIdx.x];
  const int h = blockIdx.y;
  const int kv_head = h / (heads / layer.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int32_t first_pos = positions[tile.first_token];
  const std::int32_t last_pos = first_pos + tile.rows - 1;
  const std::int32_t* table = block_tables + table_offset[tile.first_token];
  const int bt = layer.block_tokens;
  const std::int64_t row_width = static_cast<std::int64_t>(layer.kv_heads) * kHd;

  for (int i = threadIdx.x; i < kTileRows * kHd; i += blockDim.x) {
    const int r = i / kHd, d = i % kHd;
    const float x =
        r < tile.rows ? q[(static_cast<std::int64_t>(tile.first_token + r) * heads + h) * kHd + d] *
                            scale_log2
                      : 0.0f;
    qs[r * S::kQkv + d] = __float2bfloat16_rn(x);
    os[r * S::kO + d] = 0.0f;
  }
  if (threadIdx.x < kTileRows) {
    row_max[threadIdx.x] = -INFINITY;
    row_sum[threadIdx.x] = 0.0f;
  }
  constexpr int kPieces = kHd / 8;  // 16-byte pieces of a row
  for (int key0 = 0; key0 <= last_pos; key0 += kTileKeys) {
    __syncthreads();  // the last tile's K and V are consumed; Q and O are initialized
    for (int i = threadIdx.x; i < kTileKeys * kPieces; i += blockDim.x) {
      const int j = i / kPieces, c = i % kPieces, p = key0 + j;
      uint4 k = {0, 0, 0, 0}, v = {0, 0, 0, 0};  // zeros past the tile's last position
      if (p <= last_pos) {
        const std::int64_t slot = static_cast<std::int64_t>(table[p / bt]) * bt + p % bt;
        const std::int64_t at = slot * row_width + static_cast<std::int64_t>(kv_head) * kHd + c * 8;
        k = *reinterpret_cast<const uint4*>(layer.k + at);
        v = *reinterpret_cast<const uint4*>(layer.v + at);
      }
      *reinterpret_cast<uint4*>(ks + j * S::kQkv + c * 8) = k;
      *reinterpret_cast<uint4*>(vs + j * S::kQkv + c * 8) = v;
    }
    __syncthreads();
    // S = Q K^T for this warp's 16 rows.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kTileKeys / 16];
#pragma unroll
      for (int n = 0; n < kTileKeys / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
      for (int k = 0; k < kHd; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::load_matrix_sync(a, qs + warp * 16 * S::kQkv + k, S::kQkv);
#pragma unroll
        for (int n = 0; n < kTileKeys / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
          wmma::load_matrix_sync(b, ks + n * 16 * S::kQkv + k, S::kQkv);
          wmma::mma_sync(acc[n], a, b, acc[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kTileKeys / 16; ++n)
        wmma::store_matrix_sync(ss + warp * 16 * S::kS + n * 16, acc[n], S::kS,
                                wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax of this warp's rows: two lanes a row, 32 keys each.
    {
      const int r = warp * 16 + lane / 2, half = lane % 2;
      const int query_pos = first_pos + r;
      const float* srow = ss + r * S::kS + half * 32;
      const int key_base = key0 + half * 32;
      float m = -INFINITY;
      for (int c = 0; c < 32; ++c)
        if (key_base + c <= query_pos) m = fmaxf(m, srow[c]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      const float old_max = row_max[r];
      const float new_max = fmaxf(old_max, m);  // finite: key 0 is in every row's first tile
      bf16* prow = ps + r * S::kP + half * 32;
      float sum = 0.0f;
      for (int c = 0; c < 32; ++c) {
        const float w = key_base + c <= query_pos ? exp2f(srow[c] - new_max) : 0.0f;
        sum += w;
        prow[c] = __float2bfloat16_rn(w);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      const float correction = exp2f(old_max - new_max);
      __syncwarp();
      if (half == 0) {
        row_max[r] = new_max;
        row_sum[r] = row_sum[r] * correction + sum;
        row_corr[r] = correction;
      }
    }
    __syncwarp();
    for (int i = lane; i < 16 * kHd; i += 32) {
      const int r = warp * 16 + i / kHd;
      os[r * S::kO + i % kHd] *= row_corr[r];
    }
    __syncwarp();
    // O += P V for this warp's rows.
#pragma unroll
    for (int n = 0; n < kHd / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::load_matrix_sync(o, os + warp * 16 * S::kO + n * 16, S::kO, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kTileKeys; k += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::load_matrix_sync(a, ps + warp * 16 * S::kP + k, S::kP);
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
        wmma::load_matrix_sync(b, vs + k * S::kQkv + n * 16, S::kQkv);
        wmma::mma_sync(o, a, b, o);
      }
      wmma::store_matrix_sync(os + warp * 16 * S::kO + n * 16, o, S::kO, wmma::mem_row_major);
    }
  }
  __syncwarp();
  for (int i = lane; i < 16 * kHd; i += 32) {
    const int r = warp * 16 + i / kHd, d = i % kHd;
    if (r < tile.rows)
      StoreAs(out + (static_cast<std::int64_t>(tile.first_token + r) * heads + h) * kHd + d,
              os[r * S::kO + d] / row_sum[r]);
  }
}

// One block per row: each thread keeps its best (value, index), then the block reduces with
// "larger value, else lower index" so that ties and the scan order agree with the CPU.
constexpr int kArgmaxThreads = 1024;

__global__ void __launch_bounds__(kArgmaxThreads)
    ArgmaxKernel(std::int32_t* tokens, const float* logits, std::int64_t vocab) {
  __shared__ float best_value[kArgmaxThreads];
  __shared__ std::int32_t best_index[kArgmaxThreads];
  const float* row = logits + blockIdx.x * vocab;
  float value = -INFINITY;
  std::int32_t index = -1;
  auto consider = [&](float x, std::int64_t i) {
    if (isnan(x)) return;
    if (index < 0 || x > value) {  // strict: within a thread, ids only grow
      value = x;
      index = static_cast<std::int32_t>(i);
    }
  };
  if (vocab % 4 == 0) {  // rows 16-byte aligned: four logits a load
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (std::int64_t i = threadIdx.x; i < vocab / 4; i += blockDim.x) {
      const float4 x = row4[i];
      consider(x.x, 4 * i);
      consider(x.y, 4 * i + 1);
      consider(x.z, 4 * i + 2);
      consider(x.w, 4 * i + 3);
    }
  } else {
    for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) consider(row[i], i);
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
  // Few rows (decode): more threads per row, so that the row is read in a few waves.
  const int threads = rows < 128 ? 1024 : kThreads;
  RmsNormKernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(out, in, dim, gamma, eps);
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
  // A token's (head, pair) grid over several blocks: decode steps have a token or a few.
  const std::int64_t pairs = (heads + (k ? kv_heads : 0)) * (head_dim / 2);
  const dim3 grid(static_cast<unsigned>(n), Blocks(pairs));
  RopeKernel<<<grid, kThreads, 0, stream>>>(q, heads, k, k ? kv_heads : 0, head_dim, positions,
                                            inv_freq, attention_scaling);
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
                     const std::int32_t* rows, float scale_log2, int splits, std::int64_t split_len,
                     cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(heads / group_heads),
                  static_cast<unsigned>(splits));
  const unsigned threads = kAttnWarps * 32;
  auto launch = [&](auto kernel) {
    kernel<<<grid, threads, 0, stream>>>(out, partial, q, heads, layer, block_tables, table_offset,
                                         positions, rows, scale_log2, splits, split_len);
  };
  switch (group_heads) {
    case 8:
      launch(PagedAttentionKernel<kE, 8, Out>);
      break;
    case 4:
      launch(PagedAttentionKernel<kE, 4, Out>);
      break;
    case 2:
      launch(PagedAttentionKernel<kE, 2, Out>);
      break;
    default:
      launch(PagedAttentionKernel<kE, 1, Out>);
      break;
  }
}

template <typename Out>
void PagedAttentionAs(Out* out, const float* q, std::int64_t n, const std::int32_t* rows,
                      std::int64_t heads, const PagedKvLayer& layer,
                      const std::int32_t* block_tables, const std::int32_t* table_offset,
                      const std::int32_t* positions, std::int64_t max_context, float scale,
                      DeviceBuffer<float>* workspace, int splits, cudaStream_t stream) {
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
                                        table_offset, positions, rows, scale_log2, splits,
                                        split_len, stream);
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
    AttentionCombineKernel<Out><<<grid, 128, 0, stream>>>(out, partial, rows, h, hd, splits);
    DUET_CUDA_CHECK(cudaGetLastError());
  }
}

template <int kHd, typename Out>
void LaunchPrefill(Out* out, const float* q, int heads, const PagedKvLayer& layer,
                   const std::int32_t* block_tables, const std::int32_t* table_offset,
                   const std::int32_t* positions, const PrefillTile* tiles, std::int64_t num_tiles,
                   float scale_log2, cudaStream_t stream) {
  constexpr std::size_t bytes = PrefillSmem<kHd>::kBytes;
  static const bool sized = [] {  // shared memory beyond 48 KB must be asked for
    DUET_CUDA_CHECK(cudaFuncSetAttribute(PrefillAttentionKernel<kHd, Out>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
    return true;
  }();
  (void)sized;
  const dim3 grid(static_cast<unsigned>(num_tiles), static_cast<unsigned>(heads));
  PrefillAttentionKernel<kHd, Out><<<grid, 128, bytes, stream>>>(
      out, q, heads, layer, block_tables, table_offset, positions, tiles, scale_log2);
  DUET_CUDA_CHECK(cudaGetLastError());
}

template <typename Out>
void PrefillAttentionAs(Out* out, const float* q, std::int64_t heads, const PagedKvLayer& layer,
                        const std::int32_t* block_tables, const std::int32_t* table_offset,
                        const std::int32_t* positions, const PrefillTile* tiles,
                        std::int64_t num_tiles, float scale, cudaStream_t stream) {
  DUET_CHECK(PrefillAttentionSupports(layer.head_dim) && layer.kv_heads > 0 &&
             heads % layer.kv_heads == 0);
  if (num_tiles == 0) return;
  const float scale_log2 = scale * 1.4426950408889634f;
  const int h = static_cast<int>(heads);
  switch (layer.head_dim) {
    case 16:
      LaunchPrefill<16>(out, q, h, layer, block_tables, table_offset, positions, tiles, num_tiles,
                        scale_log2, stream);
      break;
    case 64:
      LaunchPrefill<64>(out, q, h, layer, block_tables, table_offset, positions, tiles, num_tiles,
                        scale_log2, stream);
      break;
    default:
      LaunchPrefill<128>(out, q, h, layer, block_tables, table_offset, positions, tiles, num_tiles,
                         scale_log2, stream);
      break;
  }
}

}  // namespace

void PagedAttention(float* out, const float* q, std::int64_t n, const std::int32_t* rows,
                    std::int64_t heads, const PagedKvLayer& layer, const std::int32_t* block_tables,
                    const std::int32_t* table_offset, const std::int32_t* positions,
                    std::int64_t max_context, float scale, DeviceBuffer<float>* workspace,
                    int splits, cudaStream_t stream) {
  PagedAttentionAs(out, q, n, rows, heads, layer, block_tables, table_offset, positions,
                   max_context, scale, workspace, splits, stream);
}

void PagedAttention(Bf16* out, const float* q, std::int64_t n, const std::int32_t* rows,
                    std::int64_t heads, const PagedKvLayer& layer, const std::int32_t* block_tables,
                    const std::int32_t* table_offset, const std::int32_t* positions,
                    std::int64_t max_context, float scale, DeviceBuffer<float>* workspace,
                    int splits, cudaStream_t stream) {
  PagedAttentionAs(out, q, n, rows, heads, layer, block_tables, table_offset, positions,
                   max_context, scale, workspace, splits, stream);
}

bool PrefillAttentionSupports(std::int64_t head_dim) {
  return head_dim == 16 || head_dim == 64 || head_dim == 128;
}

void PrefillAttention(float* out, const float* q, std::int64_t heads, const PagedKvLayer& layer,
                      const std::int32_t* block_tables, const std::int32_t* table_offset,
                      const std::int32_t* positions, const PrefillTile* tiles,
                      std::int64_t num_tiles, float scale, cudaStream_t stream) {
  PrefillAttentionAs(out, q, heads, layer, block_tables, table_offset, positions, tiles, num_tiles,
                     scale, stream);
}

void PrefillAttention(Bf16* out, const float* q, std::int64_t heads, const PagedKvLayer& layer,
                      const std::int32_t* block_tables, const std::int32_t* table_offset,
                      const std::int32_t* positions, const PrefillTile* tiles,
                      std::int64_t num_tiles, float scale, cudaStream_t stream) {
  PrefillAttentionAs(out, q, heads, layer, block_tables, table_offset, positions, tiles, num_tiles,
                     scale, stream);
}

void Argmax(std::int32_t* tokens, const float* logits, std::int64_t rows, std::int64_t vocab,
            cudaStream_t stream) {
  if (rows == 0) return;
  ArgmaxKernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream>>>(tokens, logits, vocab);
  DUET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace duet::kernels::cuda
