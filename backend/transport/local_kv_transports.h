// The KV transports of the instances one process serves (the live frontend's PD instances):
// every decode instance gets a transport that pulls from the KV region of every prefill
// instance; prefill instances are only pulled from. Loopback copies; UCX gives each instance a
// UCP context and worker of its own, connected through the descriptors they publish, as
// separate worker processes are, and progresses the prefill instances' workers on a thread of
// its own (over tcp a get needs the target's help, which an engine thread busy with a long
// prefill step could not give), asleep on their wake-up descriptors while nothing happens.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/engine/forward_model.h"
#include "common/status.h"
#include "policies/engine.h"
#include "policies/ports.h"

namespace duet::backend {

class UcxKvTransport;

enum class KvTransportKind { kLoopback, kUcx };
// "loopback", "ucx" (the latter only where this build has UCX).
Result<KvTransportKind> ParseKvTransportKind(const std::string& name);

struct KvTransportOptions {
  KvTransportKind kind = KvTransportKind::kLoopback;
  std::string ucx_tls;  // UCX_TLS for every instance ("tcp", "posix,cma", ...); empty: UCX's
  // Tests: wraps each decode instance's transport (fault injection); null: none.
  std::function<std::unique_ptr<policies::KvTransport>(policies::KvTransport& inner,
                                                       policies::InstanceId instance)>
      wrap;
};

class LocalKvTransports {
 public:
  // One region and role per instance id (0, 1, ...). Colocated instances get a transport
  // that fails every pull.
  static Result<std::unique_ptr<LocalKvTransports>> Create(
      const std::vector<KvRegion>& regions, const std::vector<policies::InstanceRole>& roles,
      const KvTransportOptions& options);
  ~LocalKvTransports();

  // What the engine of `instance` pulls with; used on its engine thread only.
  policies::KvTransport& transport(policies::InstanceId instance);
  // "loopback" or "ucx:<tls>".
  const std::string& path() const { return path_; }

 private:
  struct Side;
  LocalKvTransports() = default;
  void ProgressLoop(std::vector<UcxKvTransport*> pulled_from);

  std::vector<std::unique_ptr<Side>> sides_;
  std::string path_;
  int stop_fd_ = -1;  // eventfd: ends the progress thread
  std::thread progress_thread_;
};

}  // namespace duet::backend
