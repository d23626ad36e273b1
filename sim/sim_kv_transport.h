// The simulated KV transport (the KvTransport port on SimGrid): a transfer is one host-to-host
// communication of its bytes per TP shard, between corresponding GPUs of the two instances, all
// at once and sharing the platform's links with everything else in flight. It checks each
// transfer as the real transports do (policies::CheckKvTransfer against the instances' block
// layouts) and leaves the same records; it moves no bytes, only time.
//
// One per instance: only the actor that posted a transfer polls it (SimGrid 3.32 crashes when
// another actor tests a communication). Outside a simulation's actors (tests), post and poll
// from the main thread and advance the clock with Engine::run_until.
#pragma once

#include <simgrid/s4u.hpp>

#include <map>
#include <vector>

#include "policies/kv_transfer.h"
#include "policies/ports.h"
#include "sim/comms.h"
#include "sim/timeline.h"

namespace duet::sim {

// One instance as the transport sees it: its GPUs (one host per TP shard) and its KV blocks.
struct SimKvEndpoint {
  std::vector<simgrid::s4u::Host*> gpus;
  policies::KvBlockLayout blocks;
};

class SimKvTransport final : public policies::KvTransport, public policies::KvTransferLog {
 public:
  // `endpoints[i]` is instance i; they outlive the transport. Transfers start with `start`.
  // Finished transfers also go to `timeline` where it is not null.
  SimKvTransport(const std::vector<SimKvEndpoint>& endpoints, StartComm start,
                 Timeline* timeline = nullptr);

  policies::TransferId Post(const policies::KvTransferRequest& transfer) override;
  policies::TransferStatus Poll(policies::TransferId id) override;
  // The communications of the transfers in flight (to wait on).
  void AppendWaitables(std::vector<simgrid::s4u::CommPtr>* out) const;

 private:
  struct InFlight {
    std::vector<simgrid::s4u::CommPtr> comms;  // one per TP shard; none when it failed its check
    policies::KvTransferRecord record;
    Bytes bytes;  // asked for
    Seconds posted_s;
  };
  const std::vector<SimKvEndpoint>& endpoints_;
  StartComm start_;
  Timeline* timeline_;
  std::map<policies::TransferId, InFlight> transfers_;
  policies::TransferId next_ = 1;
};

}  // namespace duet::sim
