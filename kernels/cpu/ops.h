// The element-wise and per-row kernels of a Llama-family layer on the CPU: token embedding,
// RMSNorm, rotary position embedding (Hugging Face rotate_half convention) and SwiGLU. All
// activations are fp32 and row-major; weights are read through Weight in their stored dtype.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight.h"

namespace duet::kernels::cpu {

// out[i][:] = table row ids[i] as fp32; out is [ids.size()][table.cols]. An id outside
// [0, table.rows) is a broken invariant (DUET_CHECK), as the tokenizer only makes valid ids.
void Embedding(float* out, std::span<const std::int32_t> ids, const Weight& table);

// For each of `rows` rows of `dim` values: y = (x * (1 / sqrt(mean(x^2) + eps))) * gamma, in
// fp32 as Hugging Face's LlamaRMSNorm does (x * rsqrt first, then gamma). gamma holds `dim`
// values as a 1-D tensor: rows = 1, cols = dim (the way a safetensors [dim] tensor is wrapped);
// rows = dim, cols = 1 is accepted too. out may equal in.
void RmsNorm(float* out, const float* in, std::int64_t rows, std::int64_t dim, const Weight& gamma,
             float eps, ThreadPool* pool = nullptr);

// Rotary embedding in place on q [n_tokens][heads][head_dim] and k [n_tokens][kv_heads][head_dim]
// (k may be null with kv_heads = 0). Token t is at positions[t] (positions.size() == n_tokens).
// inv_freq holds head_dim / 2 frequencies, already including any rope scaling (llama3, linear).
// As in HF: freqs = float(position) * inv_freq[i] in fp32, cos/sin of it in fp32 times
// attention_scaling (1 except for YaRN-style scaling), and the pairs are (i, i + head_dim / 2):
//   x'[i] = x[i] cos - x[i + h/2] sin,   x'[i + h/2] = x[i + h/2] cos + x[i] sin.
void Rope(float* q, std::int64_t heads, float* k, std::int64_t kv_heads, std::int64_t head_dim,
          std::span<const std::int32_t> positions, const float* inv_freq,
          float attention_scaling = 1.0f, ThreadPool* pool = nullptr);

// out[t][i] = silu(gate[t][i]) * up[t][i] with silu(x) = x / (1 + exp(-x)); all three are
// [n_tokens][intermediate]. out may equal gate or up.
void SwiGlu(float* out, const float* gate, const float* up, std::int64_t n_tokens,
            std::int64_t intermediate, ThreadPool* pool = nullptr);

// The same from one fused buffer gate_up [n_tokens][2 * intermediate] whose row t holds gate in
// columns [0, intermediate) and up in [intermediate, 2 * intermediate) (the output of one MatMul
// with gate_proj and up_proj stacked [gate; up]). out is [n_tokens][intermediate] and must not
// overlap gate_up.
void SwiGluFused(float* out, const float* gate_up, std::int64_t n_tokens, std::int64_t intermediate,
                 ThreadPool* pool = nullptr);

}  // namespace duet::kernels::cpu
