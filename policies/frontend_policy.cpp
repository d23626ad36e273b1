// The frontend's policy (see frontend_policy.h).
#include "policies/frontend_policy.h"

#include <algorithm>
#include <utility>

#include "policies/block_hash.h"

namespace duet::policies {

FrontendPolicy::FrontendPolicy(AdmissionLimits limits, Router& router)
    : limits_(std::move(limits)), router_(router) {}

FrontendDecision FrontendPolicy::Admit(Request& request) {
  if (std::optional<FrontendDecision> refused = Check(request)) return std::move(*refused);
  return Route(request);
}

std::optional<FrontendDecision> FrontendPolicy::Check(const Request& request) const {
  using Verdict = FrontendDecision::Verdict;
  if (request.input_tokens < 1 || request.output_tokens < 1)
    return FrontendDecision{Verdict::kInvalid, kNoInstance, kNoInstance, std::nullopt,
                            "empty: needs a prompt token and an output token at least"};
  if (auto too_long = limits_.Check(request.input_tokens, request.output_tokens))
    return FrontendDecision{Verdict::kTooLong, kNoInstance, kNoInstance, std::nullopt,
                            std::move(*too_long)};
  return std::nullopt;
}

FrontendDecision FrontendPolicy::Route(Request& request) {
  using Verdict = FrontendDecision::Verdict;
  RoutingDecision d = router_.Route(request);
  if (!d.reject_reason.empty())
    return {Verdict::kUnroutable, kNoInstance, kNoInstance, std::nullopt,
            std::move(d.reject_reason)};
  request.prefill_instance = d.prefill;
  request.decode_instance = d.decode;  // colocated: the router names the same instance
  request.router_score = d.score;
  return {Verdict::kDispatch, request.prefill_instance, request.decode_instance, d.score, ""};
}

RecoveryDecision FrontendPolicy::Recover(const Request& lost, RequestId next_id,
                                         Tokens tokens_before, Tokens max_tokens, int workers_lost,
                                         Tokens block_tokens) {
  using Verdict = RecoveryDecision::Verdict;
  router_.OnFinished(lost, lost);  // uncharges its instances
  const Tokens delivered = static_cast<Tokens>(lost.output_ids.size());
  const Tokens got = tokens_before + delivered;
  const auto& stops = lost.sampling.stop_token_ids;
  if (got >= max_tokens) return {Verdict::kEndLength, "", std::nullopt, {}};
  if (delivered > 0 && std::ranges::find(stops, lost.output_ids.back()) != stops.end())
    return {Verdict::kEndStop, "", std::nullopt, {}};
  if (workers_lost > kMaxWorkersLost) {
    return {Verdict::kEndError,
            "the workers serving it were lost " + std::to_string(workers_lost) +
                " times; it is not retried again (a request that crashes its worker would take "
                "every worker down)",
            std::nullopt,
            {}};
  }
  Request r;
  r.id = next_id;
  r.arrival_s = lost.arrival_s;
  r.frontend_s = lost.frontend_s;  // the frontend took it once: the first attempt's time
  r.prompt_ids = lost.prompt_ids;
  r.prompt_ids.insert(r.prompt_ids.end(), lost.output_ids.begin(), lost.output_ids.end());
  r.input_tokens = static_cast<Tokens>(r.prompt_ids.size());
  r.output_tokens = max_tokens - got;
  r.block_hashes = TokenBlockHashes(r.prompt_ids, block_tokens);
  r.sampling = lost.sampling;
  FrontendDecision route = Admit(r);
  if (!route.dispatched()) {
    return {Verdict::kEndError, "its worker was lost and it cannot be retried: " + route.reason,
            std::nullopt, std::move(route)};
  }
  return {Verdict::kResend, "", std::move(r), std::move(route)};
}

}  // namespace duet::policies
