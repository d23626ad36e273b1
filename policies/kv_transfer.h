// What every KvTransport shares, simulated or real: the check of a transfer against the block
// layouts of the instances it names, and the record each finished transfer leaves (bytes,
// seconds, path): the measured costs that calibration fits the simulator's links to, and the
// simulator's own, in the same form.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "policies/ports.h"

namespace duet::policies {

// An instance's KV blocks as a transport sees them: num_blocks blocks of block_bytes each.
struct KvBlockLayout {
  std::int64_t block_bytes = 0;
  std::int64_t num_blocks = 0;
};

// Why a transfer between these instances cannot proceed; empty when it can: both instances
// are known (non-null) and share a block size, the lists name blocks inside their layouts, the
// destination list is at least as long as the source's, and `bytes` is at most what the source
// blocks hold. A transport checks before it moves anything, and one that fails the check fails
// on its first poll, with the reason in its record.
std::string CheckKvTransfer(const KvTransferRequest& transfer, const KvBlockLayout* src,
                            const KvBlockLayout* dst);

struct KvTransferRecord {
  RequestId request = 0;
  InstanceId src = kNoInstance;
  InstanceId dst = kNoInstance;
  std::int64_t bytes = 0;  // moved (0 when the transfer failed before moving)
  double seconds = 0;      // from Post to the poll that saw it finish (simulated or wall)
  std::string path;        // "loopback", "ucx:tcp", "sim", ...
  bool ok = false;
  std::string error;  // why it failed
};

// What a transport moved since it started, by every record it ever made.
struct KvTransferTotals {
  std::int64_t transfers = 0;
  std::int64_t failed = 0;
  std::int64_t bytes = 0;
  double seconds = 0;
};

// Records of the transfers a transport finished, oldest first: the last kMaxRecords of them
// (a server runs for days), and totals over all. Read on the thread that uses the transport.
class KvTransferLog {
 public:
  static constexpr std::size_t kMaxRecords = 1 << 16;
  const std::deque<KvTransferRecord>& records() const { return records_; }
  const KvTransferTotals& totals() const { return totals_; }

 protected:
  void Record(KvTransferRecord record);

 private:
  std::deque<KvTransferRecord> records_;
  KvTransferTotals totals_;
};

}  // namespace duet::policies
