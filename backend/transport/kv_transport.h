// Real KV transports behind the engine's policies::KvTransport port (post, then poll). A
// transfer moves a request's KV blocks from the source instance's KV region into the
// destination's (ForwardModel::kv_region(): block b is block_bytes bytes at base + b *
// block_bytes): block i of src_blocks into block i of dst_blocks. Every transport checks a
// transfer before moving anything and leaves a record of every finished transfer, as
// policies/kv_transfer.h says (the simulated transport, sim/sim_kv_transport.h, does too).
//
// Here: PeerKvTransport (what the transports a command chooses from share,
// kv_transport_registry.h), LoopbackKvTransport (instances in one process, memcpy) and
// FaultInjectingKvTransport (fails, delays, drops or truncates the transfers of the transport it
// wraps, for tests); ucx_kv_transport.h has UCX, backend/cuda/cuda_ipc_kv_transport.h CUDA IPC.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/engine/forward_model.h"
#include "common/status.h"
#include "policies/kv_transfer.h"
#include "policies/ports.h"

namespace duet::backend {

using BlockId = policies::KvBlockManager::BlockId;

using policies::KvTransferLog;
using policies::KvTransferRecord;
using policies::KvTransferTotals;

// policies::CheckKvTransfer over the regions' block layouts (null: unknown instance).
std::string CheckKvTransfer(const policies::KvTransferRequest& transfer, const KvRegion* src,
                            const KvRegion* dst);

// A transfer's blocks as runs that are consecutive on both sides (one copy or one RMA each).
struct BlockRun {
  std::int64_t src_block = 0;
  std::int64_t dst_block = 0;
  std::int64_t blocks = 0;
};
// Calls `f(run)` for the runs of src[i] -> dst[i] (i < src.size(); dst at least as long), in
// order, until f returns false. Allocates nothing: it runs once per transfer.
template <typename F>
void ForEachBlockRun(std::span<const BlockId> src, std::span<const BlockId> dst, F&& f) {
  for (std::size_t i = 0; i < src.size();) {
    BlockRun run{src[i], dst[i], 1};
    for (std::size_t j = i + 1; j < src.size() && src[j] == run.src_block + run.blocks &&
                                dst[j] == run.dst_block + run.blocks;
         ++j) {
      ++run.blocks;
    }
    if (!f(run)) return;
    i += static_cast<std::size_t>(run.blocks);
  }
}

// One instance's side of a transport whose sides find each other by descriptor: it publishes a
// descriptor of its own KV region, and a side that pulls connects to each peer with the peer's
// (relayed by whoever knows both: LocalKvTransports within one process, the frontend between
// worker processes). Every transport of the registry (kv_transport_registry.h) is one, so the
// code that wires instances up is written once for all of them. Not thread-safe: one thread at
// a time uses a side.
class PeerKvTransport : public policies::KvTransport, public KvTransferLog {
 public:
  virtual std::string Descriptor() const = 0;
  // The instance id this side pulls as (a worker learns it only once registered).
  virtual void SetSelf(policies::InstanceId self) = 0;
  // A peer to pull from.
  virtual Status Connect(policies::InstanceId peer, std::string_view descriptor) = 0;
  // Forgets a peer (gone, or about to reconnect with a new descriptor): pulls from it in flight
  // fail. No effect for an unknown peer.
  virtual void Disconnect(policies::InstanceId peer) = 0;
  // Waits up to `timeout_s` for the connection to `peer` to be usable, for a transport that
  // sets it up after Connect returns (UCX); the others have nothing to wait for.
  virtual Status Flush(policies::InstanceId /*peer*/, double /*timeout_s*/) { return Status::Ok(); }
  // Whether a side that is only pulled from must make progress for its peers' pulls to finish
  // (UCX over tcp serves a get with the target's help). Such a side calls Progress() now and
  // then, or sleeps between calls: Arm() after Progress(); when it returns true, WakeupFd()
  // (-1: none) becomes readable when there is work; when false, there is work already.
  virtual bool NeedsProgress() const { return false; }
  virtual void Progress() {}
  virtual int WakeupFd() { return -1; }
  virtual bool Arm() { return true; }
};

// Instances in one process: a transfer is one memcpy per block run, done in Post. Its
// descriptor names the process and the region's address, so a side of another process refuses
// it (loopback cannot cross processes).
class LoopbackKvTransport final : public PeerKvTransport {
 public:
  // A side that knows no region yet: Register them (tests).
  LoopbackKvTransport() = default;
  // `self`'s side over its region.
  LoopbackKvTransport(policies::InstanceId self, KvRegion region);
  // The region an instance's blocks live in (its model's kv_region()).
  void Register(policies::InstanceId instance, KvRegion region);

  // Empty for a side made without a region of its own.
  std::string Descriptor() const override;
  void SetSelf(policies::InstanceId self) override;
  Status Connect(policies::InstanceId peer, std::string_view descriptor) override;
  void Disconnect(policies::InstanceId peer) override;

  policies::TransferId Post(const policies::KvTransferRequest& transfer) override;
  policies::TransferStatus Poll(policies::TransferId id) override;

 private:
  std::optional<std::pair<policies::InstanceId, KvRegion>> self_;
  std::map<policies::InstanceId, KvRegion> regions_;
  std::map<policies::TransferId, policies::TransferStatus> finished_;
  policies::TransferId next_ = 1;
};

// Wraps a transport and spoils the transfers a rule picks (tests of the recovery paths):
//   kFail      never forwarded; fails on its first poll
//   kDelay     forwarded; reported in progress for `delay_polls` polls before its status
//   kDrop      forwarded, its completion lost: in progress on every poll, forever
//   kTruncate  only the first half of its blocks forwarded; fails once they have moved, as a
//              transport that counts what arrived must report a short transfer
class FaultInjectingKvTransport final : public policies::KvTransport {
 public:
  enum class Fault { kNone, kFail, kDelay, kDrop, kTruncate };
  using Rule = std::function<Fault(const policies::KvTransferRequest&)>;

  FaultInjectingKvTransport(policies::KvTransport& inner, Rule rule, int delay_polls = 3);
  policies::TransferId Post(const policies::KvTransferRequest& transfer) override;
  policies::TransferStatus Poll(policies::TransferId id) override;

 private:
  struct Spoiled {
    Fault fault = Fault::kNone;
    policies::TransferId inner = 0;  // 0: not forwarded
    int polls = 0;
    policies::TransferStatus inner_status = policies::TransferStatus::kInProgress;
  };
  policies::KvTransport& inner_;
  Rule rule_;
  int delay_polls_;
  std::map<policies::TransferId, Spoiled> transfers_;
  policies::TransferId next_ = 1;
};

}  // namespace duet::backend
