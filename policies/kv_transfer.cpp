// The transfer check and the transfer log every KV transport shares (see kv_transfer.h).
#include "policies/kv_transfer.h"

#include <span>
#include <utility>

namespace duet::policies {

std::string CheckKvTransfer(const KvTransferRequest& transfer, const KvBlockLayout* src,
                            const KvBlockLayout* dst) {
  if (src == nullptr) return "unknown source instance " + std::to_string(transfer.src);
  if (dst == nullptr) return "unknown destination instance " + std::to_string(transfer.dst);
  if (src->block_bytes != dst->block_bytes) {
    return "block sizes differ: " + std::to_string(src->block_bytes) + " bytes at the source, " +
           std::to_string(dst->block_bytes) + " at the destination";
  }
  if (transfer.dst_blocks.size() < transfer.src_blocks.size()) {
    return std::to_string(transfer.src_blocks.size()) + " source blocks but only " +
           std::to_string(transfer.dst_blocks.size()) + " destination blocks";
  }
  auto outside = [](std::span<const KvBlockManager::BlockId> ids, const KvBlockLayout& layout) {
    for (KvBlockManager::BlockId id : ids) {
      if (id < 0 || id >= layout.num_blocks) return std::to_string(id);
    }
    return std::string();
  };
  if (std::string id = outside(transfer.src_blocks, *src); !id.empty()) {
    return "source block " + id + " outside its " + std::to_string(src->num_blocks) + " blocks";
  }
  if (std::string id = outside(transfer.dst_blocks, *dst); !id.empty()) {
    return "destination block " + id + " outside its " + std::to_string(dst->num_blocks) +
           " blocks";
  }
  const std::int64_t held =
      static_cast<std::int64_t>(transfer.src_blocks.size()) * src->block_bytes;
  if (transfer.bytes < 0 || transfer.bytes > held) {
    return std::to_string(transfer.bytes) + " bytes asked of " +
           std::to_string(transfer.src_blocks.size()) + " blocks holding " + std::to_string(held);
  }
  return {};
}

void KvTransferLog::Record(KvTransferRecord record) {
  ++totals_.transfers;
  if (!record.ok) ++totals_.failed;
  totals_.bytes += record.bytes;
  totals_.seconds += record.seconds;
  if (records_.size() == kMaxRecords) records_.pop_front();
  records_.push_back(std::move(record));
}

}  // namespace duet::policies
