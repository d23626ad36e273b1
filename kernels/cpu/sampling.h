// Choosing the next token from logits: greedy, or temperature / top-k / top-p sampling driven by
// a counter-based random number, so a (seed, step) pair always gives the same token regardless
// of threads, batching or what was sampled before.
#pragma once

#include <cstdint>

#include "common/mix.h"

namespace duet::kernels::cpu {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax); otherwise logits are divided by it
  std::int32_t top_k = 0;    // 0: off; else keep the k most likely tokens
  float top_p = 1.0f;        // 1: off; else keep the smallest most-likely set with mass >= top_p
  std::uint64_t seed = 0;
};

using duet::SplitMix64;  // the counter-based generator's mix (common/mix.h)

// The uniform double in [0, 1) used for draw `step_index` of `seed` (53 random bits).
double SampleUniform(std::uint64_t seed, std::uint64_t step_index);

// The token to emit. Greedy (temperature 0): the largest logit, the lowest id among equal ones.
// Otherwise, in Hugging Face's warper order: scale by 1 / temperature, keep the top_k largest
// (ties: lower id first), softmax over what is left, keep the smallest prefix of tokens sorted
// by probability (ties: lower id first) whose mass reaches top_p (at least one token), then pick
// by inverse CDF with SampleUniform(seed, step_index) over that prefix in that order. NaN logits
// are never chosen; -inf logits only when nothing else is left.
std::int32_t Sample(const float* logits, std::int32_t vocab, const SamplingParams& params,
                    std::uint64_t step_index);

}  // namespace duet::kernels::cpu
