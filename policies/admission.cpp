// The frontend's admission rule (see admission.h).
#include "policies/admission.h"

#include <algorithm>

namespace duet::policies {

AdmissionLimits AdmissionLimits::For(std::span<const InstanceRole> roles,
                                     std::span<const Tokens> admissible, Tokens context,
                                     std::string model_name) {
  AdmissionLimits limits;
  limits.context = context > 0 ? context : kNoLimit;
  limits.model_name = std::move(model_name);
  for (std::size_t i = 0; i < roles.size() && i < admissible.size(); ++i) {
    if (roles[i] != InstanceRole::kDecode) limits.prefill = std::min(limits.prefill, admissible[i]);
    if (roles[i] != InstanceRole::kPrefill) limits.serve = std::min(limits.serve, admissible[i]);
  }
  return limits;
}

std::optional<std::string> AdmissionLimits::Check(Tokens prompt, Tokens output) const {
  const Tokens footprint = output > kNoLimit - prompt ? kNoLimit : prompt + output;
  if (footprint > context) {
    return "exceeds the model's context: needs " + std::to_string(footprint) +
           " positions (prompt and output); " + model_name + " has max_position_embeddings " +
           std::to_string(context);
  }
  if (prompt > prefill || footprint > serve) {
    return "exceeds KV capacity: needs " + std::to_string(footprint) +
           " KV tokens; an instance admits at most " + std::to_string(std::min(prefill, serve));
  }
  return std::nullopt;
}

Tokens AdmissionLimits::max_request_tokens() const { return std::min(context, serve); }

Tokens AdmissionLimits::prompt_limit() const { return std::min(prefill, max_request_tokens()); }

Tokens AdmissionLimits::RequiredOf(InstanceRole role) const {
  return role == InstanceRole::kPrefill ? std::min(prefill, context) : max_request_tokens();
}

}  // namespace duet::policies
