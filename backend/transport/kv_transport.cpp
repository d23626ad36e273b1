// The checks every KV transport shares, the loopback transport and the fault-injecting
// wrapper (see kv_transport.h).
#include "backend/transport/kv_transport.h"

#include <chrono>
#include <cstring>

#include "common/status.h"

namespace duet::backend {

using policies::TransferId;
using policies::TransferStatus;

std::string CheckKvTransfer(const policies::KvTransferRequest& transfer, const KvRegion* src,
                            const KvRegion* dst) {
  auto layout = [](const KvRegion& r) {
    return policies::KvBlockLayout{r.block_bytes, r.num_blocks};
  };
  const policies::KvBlockLayout s = src ? layout(*src) : policies::KvBlockLayout{},
                                d = dst ? layout(*dst) : policies::KvBlockLayout{};
  return policies::CheckKvTransfer(transfer, src ? &s : nullptr, dst ? &d : nullptr);
}

void LoopbackKvTransport::Register(policies::InstanceId instance, KvRegion region) {
  DUET_CHECK(region.base != nullptr && region.block_bytes > 0 && region.num_blocks > 0);
  regions_[instance] = region;
}

TransferId LoopbackKvTransport::Post(const policies::KvTransferRequest& transfer) {
  const auto start = std::chrono::steady_clock::now();
  auto find = [&](policies::InstanceId id) -> const KvRegion* {
    auto it = regions_.find(id);
    return it == regions_.end() ? nullptr : &it->second;
  };
  const KvRegion* src = find(transfer.src);
  const KvRegion* dst = find(transfer.dst);
  KvTransferRecord record{
      transfer.request, transfer.src, transfer.dst, 0, 0, "loopback", false, {}};
  record.error = CheckKvTransfer(transfer, src, dst);
  if (record.error.empty()) {
    ForEachBlockRun(transfer.src_blocks, transfer.dst_blocks, [&](const BlockRun& run) {
      std::memcpy(static_cast<char*>(dst->base) + run.dst_block * dst->block_bytes,
                  static_cast<const char*>(src->base) + run.src_block * src->block_bytes,
                  static_cast<std::size_t>(run.blocks * src->block_bytes));
      return true;
    });
    record.bytes = static_cast<std::int64_t>(transfer.src_blocks.size()) * src->block_bytes;
    record.ok = true;
  }
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const TransferId id = next_++;
  finished_[id] = record.ok ? TransferStatus::kDone : TransferStatus::kFailed;
  Record(std::move(record));
  return id;
}

TransferStatus LoopbackKvTransport::Poll(TransferId id) {
  auto it = finished_.find(id);
  DUET_CHECK_MSG(it != finished_.end(), "poll of an unknown or finished transfer");
  const TransferStatus status = it->second;
  finished_.erase(it);
  return status;
}

FaultInjectingKvTransport::FaultInjectingKvTransport(policies::KvTransport& inner, Rule rule,
                                                     int delay_polls)
    : inner_(inner), rule_(std::move(rule)), delay_polls_(delay_polls) {}

TransferId FaultInjectingKvTransport::Post(const policies::KvTransferRequest& transfer) {
  Spoiled s;
  s.fault = rule_ ? rule_(transfer) : Fault::kNone;
  if (s.fault == Fault::kTruncate) {
    policies::KvTransferRequest half = transfer;
    half.src_blocks = transfer.src_blocks.first(transfer.src_blocks.size() / 2);
    half.dst_blocks = transfer.dst_blocks.first(half.src_blocks.size());
    half.bytes = 0;
    s.inner = inner_.Post(half);
  } else if (s.fault != Fault::kFail) {
    s.inner = inner_.Post(transfer);
  }
  const TransferId id = next_++;
  transfers_[id] = s;
  return id;
}

TransferStatus FaultInjectingKvTransport::Poll(TransferId id) {
  auto it = transfers_.find(id);
  DUET_CHECK_MSG(it != transfers_.end(), "poll of an unknown or finished transfer");
  Spoiled& s = it->second;
  ++s.polls;
  if (s.inner != 0 && s.inner_status == TransferStatus::kInProgress) {
    s.inner_status = inner_.Poll(s.inner);
  }
  TransferStatus status = s.inner_status;
  switch (s.fault) {
    case Fault::kNone:
      break;
    case Fault::kFail:
      status = TransferStatus::kFailed;
      break;
    case Fault::kDelay:
      if (s.polls <= delay_polls_) return TransferStatus::kInProgress;
      break;
    case Fault::kDrop:
      return TransferStatus::kInProgress;
    case Fault::kTruncate:
      if (status != TransferStatus::kInProgress) status = TransferStatus::kFailed;
      break;
  }
  if (status != TransferStatus::kInProgress) transfers_.erase(it);
  return status;
}

}  // namespace duet::backend
