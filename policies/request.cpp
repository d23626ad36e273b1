// Names of request states, as written to requests.csv and logs.
#include "policies/request.h"

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

}  // namespace duet::policies
