// Faults on a worker's link to the frontend, for tests (issue 41, part 6), as
// FaultInjectingModel is for the forward pass: a wrapper of the link's send path that does to
// the worker's frames what a network or a bug can do to them.
//   corrupt: the instance's Nth events frame goes out with a body no parser takes (the frontend
//            must cut the worker off and move its requests, never act on the bytes);
//   silence: from its Nth events frame on the instance sends nothing more, heartbeats included
//            (a partition: the frontend must notice the silence and move its requests).
// Test-only hook of `duet worker`: DUET_FAULT_INJECTION_WORKER_LINK=PATH, the file holding
// "INSTANCE FAULT N" (e.g. "1 corrupt 3"). The fault fires once, and PATH is removed when it
// does, so a worker started again runs clean.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "backend/cluster/wire.h"
#include "common/status.h"
#include "policies/request.h"

namespace duet::backend::cluster {

inline constexpr char kWorkerLinkFaultEnv[] = "DUET_FAULT_INJECTION_WORKER_LINK";

struct LinkFault {
  enum class Kind { kCorrupt, kSilence };
  policies::InstanceId instance = 0;
  Kind kind = Kind::kCorrupt;
  std::int64_t nth_events = 1;  // 1: the first events frame
  std::string path;             // removed when the fault fires
};

// "INSTANCE FAULT N" (FAULT: corrupt or silence, N >= 1); `where` starts the error.
Result<LinkFault> ParseLinkFault(const std::string& text, const std::string& where);
// The fault the environment asks for: none when kWorkerLinkFaultEnv is unset or empty; an error
// when its file cannot be read or says something else than a fault.
Result<std::optional<LinkFault>> LinkFaultFromEnvironment();

// Sends a worker's frames through `send` (the connection's), applying `fault` once this worker
// is the fault's instance. Any thread.
class FaultInjectingLink {
 public:
  using Send = std::function<void(MessageKind, const std::string&)>;
  FaultInjectingLink(Send send, std::optional<LinkFault> fault)
      : send_(std::move(send)), fault_(std::move(fault)) {}

  // The instance the frontend gave this worker (its welcome).
  void SetInstance(policies::InstanceId instance);
  void operator()(MessageKind kind, const std::string& body);

 private:
  Send send_;
  std::mutex mu_;
  std::optional<LinkFault> fault_;  // under mu_; reset once fired (but for silence)
  policies::InstanceId instance_ = policies::kNoInstance;
  std::int64_t events_sent_ = 0;
  bool silent_ = false;
};

}  // namespace duet::backend::cluster
