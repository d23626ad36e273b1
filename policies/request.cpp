// Names of request states, as written to requests.csv and logs, and the check of a request's
// sampling settings in the engine's types.
#include "policies/request.h"

#include <cmath>
#include <cstdio>

namespace duet::policies {

const char* ToString(RequestState state) {
  switch (state) {
    case RequestState::kArrived:
      return "arrived";
    case RequestState::kQueued:
      return "queued";
    case RequestState::kLoading:
      return "loading";
    case RequestState::kPrefilling:
      return "prefilling";
    case RequestState::kTransferring:
      return "transferring";
    case RequestState::kDecoding:
      return "decoding";
    case RequestState::kCompleted:
      return "completed";
    case RequestState::kRejected:
      return "rejected";
    case RequestState::kFailed:
      return "failed";
  }
  return "unknown";
}

const char* ToString(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

bool IsFinished(RequestState state) {
  return state == RequestState::kCompleted || state == RequestState::kRejected ||
         state == RequestState::kFailed;
}

namespace {

std::string AsFloat(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

}  // namespace

std::optional<SamplingProblem> CheckSampling(const SamplingParams& s) {
  // Written so that NaN fails every comparison and so every check.
  if (!(s.temperature >= 0.0f && std::isfinite(s.temperature)))
    return SamplingProblem{"temperature", "must be finite and at least 0, got " +
                                              AsFloat(s.temperature) +
                                              " as the engine's 32-bit float"};
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
    return SamplingProblem{
        "top_p", "must be in (0, 1], got " + AsFloat(s.top_p) + " as the engine's 32-bit float"};
  if (s.top_k < 0) return SamplingProblem{"top_k", "must be at least 0 (0: off)"};
  for (std::int32_t id : s.stop_token_ids) {
    if (id < 0) return SamplingProblem{"stop_token_ids", "holds a negative token id"};
  }
  return std::nullopt;
}

}  // namespace duet::policies
