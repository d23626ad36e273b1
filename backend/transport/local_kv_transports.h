// The KV transports of the instances one process serves (the live frontend's PD instances):
// every decode instance gets a transport that pulls from the KV region of every prefill
// instance; prefill instances are only pulled from. Whichever registered transport the options
// name (kv_transport_registry.h), each non-colocated instance gets a side of its own, connected
// through the descriptors they publish, as separate worker processes are; where the transport
// needs the side pulled from to make progress (UCX: over tcp a get needs the target's help,
// which an engine thread busy with a long prefill step could not give), a thread of its own
// progresses the prefill instances' sides, asleep on their wake-up descriptors while nothing
// happens.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/engine/forward_model.h"
#include "backend/transport/kv_transport_registry.h"
#include "common/status.h"
#include "policies/engine.h"
#include "policies/ports.h"

namespace duet::policies {
class KvTransferLog;
}

namespace duet::backend {

using policies::KvTransferLog;

// Progresses the sides of instances that are only pulled from (see above).
class ProgressThread;

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
  // The transport's name; for ucx, "ucx:<tls>".
  const std::string& path() const { return path_; }

 private:
  struct Side;
  LocalKvTransports() = default;

  std::vector<std::unique_ptr<Side>> sides_;
  std::string path_;
  std::unique_ptr<ProgressThread> progress_;
};

// The KV transport of one worker process's instance (`duet worker`, PD): over a transport that
// serves worker processes (ucx, cuda-ipc), it publishes a descriptor of its KV region; a decode
// instance connects to prefill peers as the frontend announces them (any thread: connections are
// made on the engine thread at its next Post or Poll, so they never race a pull), and a prefill
// instance is progressed by a thread of its own. Colocated instances get a transport that fails
// every pull.
class WorkerKvTransport final : public policies::KvTransport {
 public:
  static Result<std::unique_ptr<WorkerKvTransport>> Create(policies::InstanceRole role,
                                                           std::optional<KvRegion> region,
                                                           const KvTransportOptions& options);
  ~WorkerKvTransport() override;

  // Where peers pull this instance's KV from (prefill); empty otherwise.
  const std::string& descriptor() const { return descriptor_; }
  const std::string& path() const { return path_; }
  // The records of its pulls; null for a colocated instance's.
  const KvTransferLog* log() const;
  // Before the engine starts: the instance id the frontend gave it.
  void SetSelf(policies::InstanceId self);
  // Any thread: a prefill peer to pull from joined (or rejoined with a new descriptor), or
  // left (empty descriptor: pulls from it in flight fail).
  void SetPeer(policies::InstanceId peer, std::string descriptor);

  policies::TransferId Post(const policies::KvTransferRequest& transfer) override;
  policies::TransferStatus Poll(policies::TransferId id) override;

 private:
  WorkerKvTransport() = default;
  void ApplyPeers();

  std::unique_ptr<policies::KvTransport> own_;  // peer_, or (colocated) one failing every pull
  PeerKvTransport* peer_ = nullptr;             // own_, unless colocated
  std::string descriptor_;
  std::string path_;
  std::unique_ptr<ProgressThread> progress_;
  std::set<policies::InstanceId> wired_;  // peers pulled from since they (re)connected
  std::mutex mu_;
  std::vector<std::pair<policies::InstanceId, std::string>> pending_peers_;  // under mu_
  std::atomic<bool> peers_pending_{false};  // pending_peers_ may be non-empty
};

}  // namespace duet::backend
