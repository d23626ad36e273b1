// The frontend's policy, one for both worlds: what becomes of a request that arrives (admitted
// and routed, or rejected and why) and of one whose instance was lost (sent again elsewhere,
// or ended). It decides and charges its router; it performs nothing. Its drivers act on the
// decisions through their own ports: the simulator's frontend actor, the live frontend (engine
// threads and worker processes) and `LocalEngine` send a dispatched request to its prefill
// instance through their Outbox, and answer a rejection in their own way (a record in
// requests.csv, a 4xx or 503 to the client, a rejected record).
#pragma once

#include <optional>
#include <string>

#include "common/units.h"
#include "policies/admission.h"
#include "policies/request.h"
#include "policies/router.h"

namespace duet::policies {

// What the frontend decided for a request that arrived.
struct FrontendDecision {
  enum class Verdict {
    kDispatch,    // routed: send it to `prefill`
    kInvalid,     // no prompt token or no output token to make
    kTooLong,     // the admission rule: beyond the model's context or every instance's KV
    kUnroutable,  // the router refused it: no instance available, or over its TTFT SLO
  };
  Verdict verdict = Verdict::kDispatch;
  // kDispatch: the instance that prefills it (colocated: serves it) and the one that decodes
  // it (colocated: the same), and the router's score of the first (RoutingDecision::score).
  InstanceId prefill = kNoInstance;
  InstanceId decode = kNoInstance;
  std::optional<double> score;
  // Otherwise why, as "<class>: <detail>" for kTooLong (outputs count rejections by class).
  std::string reason;

  bool dispatched() const { return verdict == Verdict::kDispatch; }
};

// What the frontend decided for a request whose worker was lost while it served it.
struct RecoveryDecision {
  enum class Verdict {
    kResend,     // `attempt` continues it: send it to `route.prefill`
    kEndLength,  // its client already has every token it asked for
    kEndStop,    // the last token its client got is a stop token
    kEndError,   // it cannot go on: `message` says why
  };
  Verdict verdict = Verdict::kEndError;
  std::string message;
  // kResend: the new attempt (its prompt is the old prompt and every token the client got, its
  // output what is still to come), already routed (`route`).
  std::optional<Request> attempt;
  FrontendDecision route;
};

class FrontendPolicy {
 public:
  // A request is sent again after the loss of a worker serving it at most this often: one
  // that crashes every worker it reaches (a bug an engine invariant catches) ends with an
  // error after taking down this many, instead of spending every worker's restarts.
  static constexpr int kMaxWorkersLost = 2;

  // `router` (not owned) routes and counts what is dispatched.
  FrontendPolicy(AdmissionLimits limits, Router& router);

  // Admission, then routing: Check, and Route if it passes.
  FrontendDecision Admit(Request& request);
  // Admission alone, which reads nothing but the request: why it can never be served
  // (kInvalid, kTooLong), or nullopt. A server checks this before its own capacity, so that a
  // request too long for it is told so rather than told to come back later.
  std::optional<FrontendDecision> Check(const Request& request) const;
  // Routing of a request that passed Check. On kDispatch the router has charged it to its
  // instances and `request`'s route (prefill and decode instance, router score) is set.
  FrontendDecision Route(Request& request);

  // `lost` (the attempt the lost worker held: its output_ids every token its client got in this
  // attempt) is uncharged from the router and then, unless it is done or was lost too often,
  // continued by a new attempt with id `next_id`, routed like a new request. The client asked
  // for `max_tokens` and got `tokens_before` in earlier attempts; `workers_lost` counts this
  // loss. Prefix hashes are of `block_tokens`-token blocks.
  RecoveryDecision Recover(const Request& lost, RequestId next_id, Tokens tokens_before,
                           Tokens max_tokens, int workers_lost, Tokens block_tokens);

  const AdmissionLimits& limits() const { return limits_; }

 private:
  AdmissionLimits limits_;
  Router& router_;
};

}  // namespace duet::policies
