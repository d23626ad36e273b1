// The tier storage port on SimGrid (see sim_tier_storage.h).
#include "sim/sim_tier_storage.h"

#include <algorithm>
#include <utility>

#include "common/status.h"

namespace duet::sim {

namespace sg4 = simgrid::s4u;

SimTierStorage::SimTierStorage(const Platform& platform,
                               const std::vector<SimKvEndpoint>& instances, StartComm start,
                               Timeline* timeline)
    : platform_(platform), instances_(instances), start_(std::move(start)), timeline_(timeline) {}

sg4::Host* SimTierStorage::TierHost(policies::TierKind kind, int node) const {
  auto at = [node](const std::vector<sg4::Host*>& hosts) -> sg4::Host* {
    return node >= 0 && static_cast<std::size_t>(node) < hosts.size()
               ? hosts[static_cast<std::size_t>(node)]
               : nullptr;
  };
  switch (kind) {
    case policies::TierKind::kDram:
      return at(platform_.node_hosts);
    case policies::TierKind::kSsd:
      return at(platform_.ssds);
    case policies::TierKind::kRemote:
      return platform_.remote_store;
  }
  return nullptr;
}

policies::TierIoId SimTierStorage::Post(const policies::TierIo& io) {
  Op op;
  op.owner = sg4::Actor::self();
  op.io = io;
  op.posted_s = sg4::Engine::get_clock();
  // Between the tier and an instance's GPUs, or from another tier of the node (write-back,
  // write-through below the first tier, prefetch).
  sg4::Host* tier = TierHost(io.tier, io.node);
  const bool to_instance =
      io.instance >= 0 && static_cast<std::size_t>(io.instance) < instances_.size();
  sg4::Host* from = io.instance == policies::kNoInstance ? TierHost(io.from, io.node) : nullptr;
  op.started = tier != nullptr && io.bytes >= 0 && (to_instance || (from && from != tier));
  if (op.started && to_instance) {
    // A shard each.
    const auto& gpus = instances_[static_cast<std::size_t>(io.instance)].gpus;
    const std::uint64_t shard = ShardBytes(io.bytes, gpus.size());
    for (sg4::Host* gpu : gpus) {
      op.comms.push_back(io.read ? start_(tier, gpu, shard) : start_(gpu, tier, shard));
    }
  } else if (op.started) {
    op.comms.push_back(start_(from, tier, static_cast<std::uint64_t>(io.bytes)));
  }
  const policies::TierIoId id = next_++;
  by_owner_[op.owner].push_back(id);
  ops_.emplace(id, std::move(op));
  return id;
}

policies::TransferStatus SimTierStorage::Poll(policies::TierIoId id) {
  auto it = ops_.find(id);
  DUET_CHECK_MSG(it != ops_.end(), "poll of an unknown or finished tier I/O");
  if (it->second.owner != sg4::Actor::self()) return policies::TransferStatus::kInProgress;
  const bool failed = !it->second.started || !DropFinished(it->second.comms).empty();
  if (!failed && !it->second.comms.empty()) return policies::TransferStatus::kInProgress;
  const policies::TransferStatus status =
      failed ? policies::TransferStatus::kFailed : policies::TransferStatus::kDone;
  // The owner waits on its I/O, so it polls at the instant the I/O ends.
  const policies::TierIo& io = it->second.io;
  const Seconds now = sg4::Engine::get_clock(), took = now - it->second.posted_s;
  if (timeline_) {
    timeline_->Add(Timeline::TierIo{io.tier, io.node, io.read, io.instance, io.bytes,
                                    it->second.posted_s, now, failed});
  }
  if (!failed) {  // then io.tier named a tier
    IoTimes& t = times_[static_cast<std::size_t>(io.tier)][io.read ? 1 : 0];
    ++t.count;
    t.total_s += took;
    t.max_s = std::max(t.max_s, took);
  }
  auto& ids = by_owner_[it->second.owner];
  ids.erase(std::find(ids.begin(), ids.end(), id));
  ops_.erase(it);
  return status;
}

void SimTierStorage::AppendWaitables(std::vector<sg4::CommPtr>* out) const {
  auto it = by_owner_.find(sg4::Actor::self());
  if (it == by_owner_.end()) return;
  for (policies::TierIoId id : it->second) {
    for (const auto& c : ops_.at(id).comms) out->push_back(c);
  }
}

}  // namespace duet::sim
