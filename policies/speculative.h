// Speculative decoding as the engine loop sees it: each decode row of a step verifies k draft
// tokens (a draft model's or the model's own multi-token-prediction layers') beside its own,
// and keeps the drafts up to the first one rejected, so it gains 1 to k + 1 tokens a step.
// The simulator draws how many each row keeps from per-position acceptance rates: draft i is
// accepted with probability acceptance[i] when those before it were, as the acceptance rates
// engines report (vLLM's spec_decode metrics, SGLang's accept length) describe it.
#pragma once

#include <vector>

#include "common/units.h"
#include "policies/request.h"

namespace duet::policies {

// Drafts a decode row of `r` verifies with k per step: k, or fewer near the end of its output
// (a draft past the last token would be wasted work and KV).
Tokens DraftTokens(int k, const Request& r);

struct SpeculativeConfig {
  int tokens = 0;  // draft tokens verified per decode row and step (k); 0: off
  // Per draft position, the probability it is accepted given every one before it was.
  std::vector<double> acceptance;

  bool enabled() const { return tokens > 0; }
  Tokens DraftsFor(const Request& r) const { return DraftTokens(tokens, r); }
  // Drafts request `id` keeps in the step that follows its `generated`-th token: a function of
  // the two alone (one uniform draw per position from a hash of them), so a run is
  // reproducible and a request's luck does not depend on what it was batched with.
  int Accepted(RequestId id, Tokens generated) const;
  // Expected drafts kept a step: the sum over positions of the chance to reach and pass them.
  double MeanAccepted() const;
};

}  // namespace duet::policies
