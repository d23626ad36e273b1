// Paged KV cache and causal grouped-query attention over it, on the CPU. The cache of one layer
// is a pool of fixed-size blocks; a sequence owns the blocks its block table lists, in position
// order, so token position p lives in block block_table[p / block_tokens], slot p % block_tokens.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight.h"

namespace duet::kernels::cpu {

// One layer's cache, borrowed: elements of `dtype` (fp32, bf16 or f16). Block b of K starts
// b * block_stride elements after k, likewise for V; within a block the layout is
// [slot][kv_head][head_dim]. block_stride 0 means the blocks are back to back (one K and one V
// array per layer); a block-major cache that keeps every layer's K and V of a block together
// gives each layer k = base + 2 * layer * block_elements(), v = k + block_elements() and
// block_stride = 2 * layers * block_elements(). Attention reads 16-bit caches widened to fp32.
struct PagedKvLayer {
  void* k = nullptr;
  void* v = nullptr;
  std::int32_t block_tokens = 0;
  std::int32_t kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int64_t num_blocks = 0;
  WeightDtype dtype = WeightDtype::kF32;
  std::int64_t block_stride = 0;

  std::int64_t block_elements() const {
    return static_cast<std::int64_t>(block_tokens) * kv_heads * head_dim;
  }
  std::int64_t stride() const { return block_stride == 0 ? block_elements() : block_stride; }
};

// Stores the keys and values of tokens at positions start_position .. start_position +
// n_tokens - 1 of the sequence whose blocks are block_table. k_new and v_new are
// [n_tokens][kv_heads * head_dim] (the k/v projections after RoPE), rounded to the cache's dtype
// as F32ToBf16 / F32ToF16 do. The table must cover the last position and name blocks in
// [0, num_blocks).
void WriteKv(const PagedKvLayer& layer, std::span<const std::int32_t> block_table,
             std::int64_t start_position, std::int64_t n_tokens, const float* k_new,
             const float* v_new);

// out[i][h] = softmax_j(scale * q[i][h] . K[j][g(h)]) . V[j][g(h)] over j = 0 ..
// context_before + i, where g(h) = h / (heads / kv_heads) (grouped-query attention) and q[i] is
// the token at position context_before + i. The cache must already hold positions 0 ..
// context_before + n_tokens - 1 (call WriteKv for the new tokens first). out and q are
// [n_tokens][heads][head_dim]; heads must be a multiple of kv_heads. Only blocks listed in
// block_table are read, and only their filled slots. The softmax is computed in fp32 over
// fixed partitions of 128 positions, each max-subtracted, then combined with the usual
// rescaling (flash-decoding); exp is vectorised on the AVX2 path (within 2 ulp of expf).
// Results are bit-identical for any pool size and, below kTiledMinTokens (see below), for any
// split of a prompt into chunks.
// pool: decode (few tokens) is spread over context partitions, prefill over tokens.
void PagedAttention(float* out, const float* q, std::int64_t n_tokens, std::int64_t heads,
                    const PagedKvLayer& layer, std::span<const std::int32_t> block_table,
                    std::int64_t context_before, float scale, ThreadPool* pool);

// From kTiledMinTokens tokens on, where MatMul may use oneDNN (GemmLibraryEnabled) and oneDNN
// takes the cache's dtype (fp32, bf16), PagedAttention instead computes tiles of tokens with
// two matrix products per tile (scores, then probabilities times values) and an exact causal
// softmax in between: prefill at matrix-multiply speed. The products read queries and
// probabilities rounded to the cache dtype, as bf16 attention in PyTorch does. Still
// bit-identical for any pool size; a prompt split into chunks differs from the unsplit one
// within rounding (the products' sums run over each chunk's own context length).
inline constexpr std::int64_t kTiledMinTokens = 32;
bool PagedAttentionIsTiled(std::int64_t n_tokens, WeightDtype cache_dtype);

}  // namespace duet::kernels::cpu
