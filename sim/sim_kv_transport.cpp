// The simulated KV transport (see sim_kv_transport.h).
#include "sim/sim_kv_transport.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/status.h"

namespace duet::sim {

namespace sg4 = simgrid::s4u;
using policies::TransferId;
using policies::TransferStatus;

SimKvTransport::SimKvTransport(const std::vector<SimKvEndpoint>& endpoints, StartComm start,
                               Timeline* timeline)
    : endpoints_(endpoints), start_(std::move(start)), timeline_(timeline) {}

TransferId SimKvTransport::Post(const policies::KvTransferRequest& transfer) {
  auto find = [&](policies::InstanceId id) -> const SimKvEndpoint* {
    return id >= 0 && static_cast<std::size_t>(id) < endpoints_.size()
               ? &endpoints_[static_cast<std::size_t>(id)]
               : nullptr;
  };
  const SimKvEndpoint* src = find(transfer.src);
  const SimKvEndpoint* dst = find(transfer.dst);
  InFlight t;
  t.record = {transfer.request, transfer.src, transfer.dst, 0, 0, "sim", false, {}};
  t.record.error = policies::CheckKvTransfer(transfer, src ? &src->blocks : nullptr,
                                             dst ? &dst->blocks : nullptr);
  t.bytes = transfer.bytes;
  t.posted_s = sg4::Engine::get_clock();
  if (t.record.error.empty()) {
    // Each TP shard moves between corresponding GPUs, in parallel.
    const std::size_t shards = std::max(src->gpus.size(), dst->gpus.size());
    const std::uint64_t shard_bytes = ShardBytes(transfer.bytes, shards);
    for (std::size_t s = 0; s < shards; ++s) {
      t.comms.push_back(
          start_(src->gpus[s % src->gpus.size()], dst->gpus[s % dst->gpus.size()], shard_bytes));
    }
  }
  const TransferId id = next_++;
  transfers_.emplace(id, std::move(t));
  return id;
}

TransferStatus SimKvTransport::Poll(TransferId id) {
  auto it = transfers_.find(id);
  DUET_CHECK_MSG(it != transfers_.end(), "poll of an unknown or finished transfer");
  InFlight& t = it->second;
  if (t.record.error.empty()) {
    const std::string failed = DropFinished(t.comms);
    if (!failed.empty()) {
      t.record.error = "the simulated transfer failed: " + failed;
    } else if (!t.comms.empty()) {
      return TransferStatus::kInProgress;
    } else {
      t.record.ok = true;
      t.record.bytes = t.bytes;
    }
  }
  const Seconds now = sg4::Engine::get_clock();
  t.record.seconds = now - t.posted_s;
  if (timeline_) {
    timeline_->Add(Timeline::Transfer{t.record.request, t.record.src, t.record.dst, t.bytes,
                                      t.posted_s, now, !t.record.ok});
  }
  const TransferStatus status = t.record.ok ? TransferStatus::kDone : TransferStatus::kFailed;
  Record(std::move(t.record));
  transfers_.erase(it);
  return status;
}

void SimKvTransport::AppendWaitables(std::vector<sg4::CommPtr>* out) const {
  for (const auto& [id, t] : transfers_) out->insert(out->end(), t.comms.begin(), t.comms.end());
}

}  // namespace duet::sim
