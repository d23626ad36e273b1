// The frontend's admission rule, one for both worlds: what a request needs of the instances
// that may serve it. Its prompt and output need positions in the model's context; its prompt
// needs KV on the instance that prefills it (PD: the prefill side), its prompt and output on the
// one that decodes it (PD: the decode side; colocated: the same instance). A request must fit
// on every candidate, since the router may pick any. The simulator's frontend, the live
// server's (engine threads and worker processes) and `duet generate` all ask this.
#pragma once

#include <limits>
#include <optional>
#include <span>
#include <string>

#include "common/units.h"
#include "policies/engine.h"

namespace duet::policies {

struct AdmissionLimits {
  static constexpr Tokens kNoLimit = std::numeric_limits<Tokens>::max();
  Tokens context = kNoLimit;  // the model's positions (max_position_embeddings; 0: none)
  Tokens prefill = kNoLimit;  // KV tokens the prefill side's smallest instance admits
  Tokens serve = kNoLimit;    // KV tokens the decode (or colocated) side's smallest admits
  std::string model_name;     // for messages

  // Limits over instances of `roles`, instance i admitting `admissible[i]` KV tokens
  // (SchedulerConfig::AdmissibleTokens of its blocks).
  static AdmissionLimits For(std::span<const InstanceRole> roles,
                             std::span<const Tokens> admissible, Tokens context,
                             std::string model_name);

  // Why a request of `prompt` tokens and at most `output` more cannot be admitted, as a reason
  // "<class>: <detail>" (the classes that outputs count rejections by: "exceeds the model's
  // context", "exceeds KV capacity"); nullopt when it fits.
  std::optional<std::string> Check(Tokens prompt, Tokens output) const;
  // The most tokens (prompt and output) one request may have: the model's context and the
  // serving side's KV. A PD prompt is bounded by the prefill side's too (prompt_limit).
  Tokens max_request_tokens() const;
  Tokens prompt_limit() const;
  // The KV tokens an instance of `role` must admit for these limits to hold on it.
  Tokens RequiredOf(InstanceRole role) const;
};

}  // namespace duet::policies
