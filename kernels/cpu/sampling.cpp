// Sample (see sampling.h). Work is proportional to the vocabulary only for the pass that scales
// and exponentiates; top-k sorts only the k kept, and top-p without top-k sorts a growing prefix
// (64, 256, ... tokens) until it holds the nucleus instead of sorting the whole vocabulary.
#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/status.h"

namespace duet::kernels::cpu {
namespace {

struct Candidate {
  float logit;  // as given: dividing by the temperature preserves the order (and could merge
                // neighbouring values, making top_k = 1 disagree with greedy)
  std::int32_t id;
};

// Most likely first; equal logits: lower id first. A strict total order, so every sort and
// selection below has one answer.
bool MoreLikely(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

std::int32_t Greedy(const float* logits, std::int32_t vocab) {
  std::int32_t best = -1;
  for (std::int32_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;  // strict: ties keep the lower id
  }
  return best < 0 ? 0 : best;
}

}  // namespace

double SampleUniform(std::uint64_t seed, std::uint64_t step_index) {
  // Mixing the seed first keeps (seed, step) and (seed ^ d, step ^ d) apart.
  const std::uint64_t bits = SplitMix64(SplitMix64(seed) ^ step_index);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

std::int32_t Sample(const float* logits, std::int32_t vocab, const SamplingParams& params,
                    std::uint64_t step_index) {
  DUET_CHECK(logits != nullptr && vocab > 0);
  DUET_CHECK(params.temperature >= 0.0f && std::isfinite(params.temperature));
  DUET_CHECK(params.top_k >= 0);
  DUET_CHECK(params.top_p > 0.0f && params.top_p <= 1.0f);
  if (params.temperature == 0.0f) return Greedy(logits, vocab);

  thread_local std::vector<Candidate> candidates;
  candidates.clear();
  for (std::int32_t i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) candidates.push_back({logits[i], i});
  }
  if (candidates.empty()) return 0;
  auto begin = candidates.begin();
  auto end = candidates.end();
  auto count = static_cast<std::int64_t>(candidates.size());

  if (params.top_k > 0 && params.top_k < count) {
    // Sorted: the order the draw walks must be canonical, not whatever selection leaves.
    std::partial_sort(begin, begin + params.top_k, end, MoreLikely);
    count = params.top_k;
    end = begin + count;
  }
  float max_logit = -std::numeric_limits<float>::infinity();
  for (auto it = begin; it != end; ++it) max_logit = std::max(max_logit, it->logit);
  if (std::isinf(max_logit)) {
    // All -inf (nothing has weight) or some +inf (all the weight): the most likely in order.
    return std::min_element(begin, end, MoreLikely)->id;
  }

  // Softmax weights of logit / temperature, max-subtracted; (l - max) / T rather than
  // l / T - max / T so that a tiny temperature cannot overflow. fp32 like HF, summed in double.
  const float temperature = params.temperature;
  auto weight_of = [&](const Candidate& c) {
    return std::exp((c.logit - max_logit) / temperature);
  };
  double total = 0.0;
  for (auto it = begin; it != end; ++it) total += weight_of(*it);

  if (params.top_p < 1.0f) {
    const double mass = static_cast<double>(params.top_p) * total;
    // Sort a growing prefix until the nucleus fits in it (usually the first try).
    std::int64_t prefix = std::min<std::int64_t>(count, 64);
    for (;;) {
      std::partial_sort(begin, begin + prefix, end, MoreLikely);
      double cumulative = 0.0;
      std::int64_t kept = 0;
      while (kept < prefix && cumulative < mass) cumulative += weight_of(begin[kept++]);
      if (cumulative >= mass || prefix == count) {
        end = begin + std::max<std::int64_t>(kept, 1);
        break;
      }
      prefix = std::min(count, prefix * 4);
    }
    total = 0.0;
    for (auto it = begin; it != end; ++it) total += weight_of(*it);
  }

  // Inverse CDF. cumulative ends at exactly `total` (same terms, same order) and the uniform
  // is < 1, so the loop returns unless rounding put target at the very top.
  const double target = SampleUniform(params.seed, step_index) * total;
  double cumulative = 0.0;
  auto last_with_weight = begin;
  for (auto it = begin; it != end; ++it) {
    const float w = weight_of(*it);
    cumulative += w;
    if (w > 0.0f) last_with_weight = it;
    if (target < cumulative) return it->id;
  }
  return last_with_weight->id;
}

}  // namespace duet::kernels::cpu
