// The KV transports of the instances one process serves (the live frontend's PD instances):
// every decode instance gets a transport that pulls from the KV region of every prefill
// instance; prefill instances are pulled from, and with UCX must let UCX progress. Loopback
// copies; UCX gives each instance a UCP context and worker of its own, connected through the
// descriptors they publish, as separate worker processes are.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/engine/forward_model.h"
#include "common/status.h"
#include "policies/engine.h"
#include "policies/ports.h"

namespace duet::backend {

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
  // What the engine thread of `instance` must call now and then while it holds KV for a pull
  // (UCX over transports that need the target's help); empty when nothing needs it.
  std::function<void()> progress(policies::InstanceId instance);
  // "loopback" or "ucx:<tls>".
  const std::string& path() const { return path_; }

 private:
  struct Side;
  LocalKvTransports() = default;
  std::vector<std::unique_ptr<Side>> sides_;
  std::string path_;
};

}  // namespace duet::backend
