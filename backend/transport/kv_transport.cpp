// The checks every KV transport shares, the loopback transport and the fault-injecting
// wrapper (see kv_transport.h).
#include "backend/transport/kv_transport.h"

#include <unistd.h>

#include <chrono>
#include <cstring>

#include "backend/transport/descriptor_bytes.h"
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

namespace {

// A loopback side's descriptor: "DKVL", version (u32, 1), the owner's process id (u32), the
// region's address (u64), block_bytes (i64), num_blocks (i64); nothing after.
constexpr std::string_view kLoopbackMagic = "DKVL";
constexpr std::uint32_t kLoopbackVersion = 1;

std::uint32_t ThisProcess() { return static_cast<std::uint32_t>(::getpid()); }

Result<KvRegion> ParseLoopbackDescriptor(std::string_view in) {
  namespace b = descriptor_bytes;
  const std::string what = "loopback KV descriptor: ";
  if (Status s = b::TakeHeader(in, kLoopbackMagic, kLoopbackVersion, what); !s.ok()) return s;
  std::uint32_t pid = 0;
  std::uint64_t base = 0;
  KvRegion region;
  if (!b::Take(in, &pid) || !b::Take(in, &base) || !b::Take(in, &region.block_bytes) ||
      !b::Take(in, &region.num_blocks))
    return Status::Error(what + "truncated");
  if (!in.empty()) return Status::Error(what + std::to_string(in.size()) + " bytes after its end");
  if (Status s = b::CheckRegion(region.block_bytes, region.num_blocks, what); !s.ok()) return s;
  if (base == 0) return Status::Error(what + "a region at address 0");
  if (pid != ThisProcess())
    return Status::Error(what + "of process " + std::to_string(pid) +
                         ": loopback moves KV within one process");
  region.base = reinterpret_cast<void*>(static_cast<std::uintptr_t>(base));
  return region;
}

}  // namespace

LoopbackKvTransport::LoopbackKvTransport(policies::InstanceId self, KvRegion region)
    : self_(std::make_pair(self, region)) {
  Register(self, region);
}

void LoopbackKvTransport::Register(policies::InstanceId instance, KvRegion region) {
  DUET_CHECK(region.base != nullptr && region.block_bytes > 0 && region.num_blocks > 0);
  regions_[instance] = region;
}

std::string LoopbackKvTransport::Descriptor() const {
  if (!self_) return "";
  namespace b = descriptor_bytes;
  const KvRegion& region = self_->second;
  std::string out(kLoopbackMagic);
  b::Put(out, kLoopbackVersion);
  b::Put(out, ThisProcess());
  b::Put(out, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(region.base)));
  b::Put(out, region.block_bytes);
  b::Put(out, region.num_blocks);
  return out;
}

void LoopbackKvTransport::SetSelf(policies::InstanceId self) {
  if (!self_) return;
  regions_.erase(self_->first);
  self_->first = self;
  Register(self, self_->second);
}

Status LoopbackKvTransport::Connect(policies::InstanceId peer, std::string_view descriptor) {
  if (regions_.count(peer))
    return Status::Error("instance " + std::to_string(peer) + " is connected already");
  auto region = ParseLoopbackDescriptor(descriptor);
  if (!region.ok()) return region.status();
  Register(peer, *region);
  return Status::Ok();
}

void LoopbackKvTransport::Disconnect(policies::InstanceId peer) {
  if (self_ && peer == self_->first) return;
  regions_.erase(peer);
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
