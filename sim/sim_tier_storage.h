// The tier storage port on SimGrid: a tier write or read is one communication between the
// GPU (one per TP shard), the node host (DRAM), the node's SSD or the remote store; the bytes
// stream through every link on the route at once. An I/O that names no such tier, node or
// instance fails on its first poll, as a transfer that fails its check does.
//
// Only the actor that posted an I/O tests it (SimGrid 3.32 crashes when another actor tests a
// communication), and each engine also waits on its own I/O, so it notices completions at the
// instant they happen. Outside a simulation's actors (tests), post and poll from the main
// thread and advance the clock with Engine::run_until.
#pragma once

#include <simgrid/s4u.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "policies/ports.h"
#include "sim/comms.h"
#include "sim/platform.h"
#include "sim/sim_kv_transport.h"
#include "sim/timeline.h"

namespace duet::sim {

class SimTierStorage final : public policies::TierStorage {
 public:
  // The tiers are the platform's hosts; `instances[i]` is instance i (its GPUs). Both outlive
  // the storage. I/O starts with `start`; finished I/O also goes to `timeline` where not null.
  SimTierStorage(const Platform& platform, const std::vector<SimKvEndpoint>& instances,
                 StartComm start, Timeline* timeline = nullptr);

  policies::TierIoId Post(const policies::TierIo& io) override;
  policies::TransferStatus Poll(policies::TierIoId id) override;
  // The communications in flight that the calling actor posted.
  void AppendWaitables(std::vector<simgrid::s4u::CommPtr>* out) const;

  // Time from posting to completion of the I/O of one tier, in one direction (failed I/O not
  // counted).
  struct IoTimes {
    std::int64_t count = 0;
    Seconds total_s = 0, max_s = 0;
  };
  const IoTimes& times(policies::TierKind kind, bool read) const {
    return times_[static_cast<std::size_t>(kind)][read ? 1 : 0];
  }

 private:
  struct Op {
    const simgrid::s4u::Actor* owner;
    policies::TierIo io;
    Seconds posted_s;
    std::vector<simgrid::s4u::CommPtr> comms;
    bool started;  // false: it named no such tier, node or instance
  };
  // The host of a tier, or null when the platform has none there.
  simgrid::s4u::Host* TierHost(policies::TierKind kind, int node) const;

  const Platform& platform_;
  const std::vector<SimKvEndpoint>& instances_;
  StartComm start_;
  Timeline* timeline_;
  std::unordered_map<policies::TierIoId, Op> ops_;
  std::map<const simgrid::s4u::Actor*, std::vector<policies::TierIoId>> by_owner_;
  policies::TierIoId next_ = 1;
  std::array<std::array<IoTimes, 2>, policies::kNumLowerTiers> times_{};
};

}  // namespace duet::sim
