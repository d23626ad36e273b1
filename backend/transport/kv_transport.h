// Real KV transports behind the engine's policies::KvTransport port (post, then poll). A
// transfer moves a request's KV blocks from the source instance's KV region into the
// destination's (ForwardModel::kv_region(): block b is block_bytes bytes at base + b *
// block_bytes): block i of src_blocks into block i of dst_blocks. Every transport checks a
// transfer before moving anything and leaves a record of every finished transfer, as
// policies/kv_transfer.h says (the simulated transport, sim/sim_kv_transport.h, does too).
//
// Here: LoopbackKvTransport (instances in one process, memcpy) and FaultInjectingKvTransport
// (fails, delays, drops or truncates the transfers of the transport it wraps, for tests);
// ucx_kv_transport.h has UCX.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "backend/engine/forward_model.h"
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

// Instances in one process: a transfer is one memcpy per block run, done in Post.
class LoopbackKvTransport final : public policies::KvTransport, public KvTransferLog {
 public:
  // The region an instance's blocks live in (its model's kv_region()).
  void Register(policies::InstanceId instance, KvRegion region);
  policies::TransferId Post(const policies::KvTransferRequest& transfer) override;
  policies::TransferStatus Poll(policies::TransferId id) override;

 private:
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
