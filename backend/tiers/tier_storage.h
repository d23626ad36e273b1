// The real TierStorage (policies/ports.h): the I/Os the tier manager posts, run on this host
// against the instances' KV regions and the tiers' real blocks (tier_blocks.h), off the engine
// threads.
//
// One I/O thread runs the posted I/Os in the order they were posted, so an I/O sees the effects
// of every one posted before it: a write-back reads the blocks a tier evicted before the write
// that takes their room drops them. An I/O fails as a whole: a write that failed part way drops
// what it had stored (the tier manager then forgets the whole write), and a read that failed
// leaves the destination blocks' contents unspecified (the engine recomputes them).
//
// The engine must not touch an instance's blocks named by an I/O in flight: a write's source
// blocks until it finished (the tier manager's pending write), a read's destination blocks until
// its load finished. Thread-safe: Post and Poll from any engine thread.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/engine/forward_model.h"
#include "backend/tiers/tier_blocks.h"
#include "deploy/tiers.h"
#include "policies/ports.h"

namespace duet::backend {

// What one tier's I/Os did (through this storage).
struct TierIoCounters {
  std::int64_t ios = 0, failed_ios = 0;
  std::int64_t read_blocks = 0, written_blocks = 0;
  std::int64_t read_bytes = 0, written_bytes = 0;
  double busy_s = 0;  // time the I/O thread spent on this tier's I/Os
};

class HostTierStorage final : public policies::TierStorage {
 public:
  HostTierStorage();
  // Runs what was posted, then stops the I/O thread.
  ~HostTierStorage() override;
  HostTierStorage(const HostTierStorage&) = delete;
  HostTierStorage& operator=(const HostTierStorage&) = delete;

  // Before the first Post: where an instance's blocks live, and a tier's blocks on a node (the
  // remote store at node 0). Every tier's block_bytes must equal the regions'.
  void RegisterInstance(policies::InstanceId instance, KvRegion region);
  void AddTier(policies::TierKind kind, int node, std::unique_ptr<TierBlocks> blocks);

  policies::TierIoId Post(const policies::TierIo& io) override;
  policies::TransferStatus Poll(policies::TierIoId id) override;

  // Waits until every I/O posted so far has run.
  void Drain();
  // Why the last failed I/O failed ("" if none has).
  std::string last_error() const;
  TierIoCounters counters(policies::TierKind kind) const;
  // Each tier within its capacity and consistent (tier_blocks.h). Call after Drain.
  Status CheckInvariants() const;
  // The tier's blocks (tests; after Drain, never while I/Os run).
  TierBlocks* blocks(policies::TierKind kind, int node);

 private:
  struct Job {
    policies::TierIoId id = 0;
    policies::TierIo io;  // its spans empty: the vectors below hold what they named
    std::vector<BlockHash> hashes, evicted;
    std::vector<policies::KvBlockManager::BlockId> gpu_blocks;
  };
  void Loop();
  // Runs one I/O on the I/O thread (no lock held).
  Status Run(const Job& job);
  std::span<std::byte> GpuBlock(policies::InstanceId instance, policies::KvBlockManager::BlockId b);

  std::map<policies::InstanceId, KvRegion> regions_;
  std::map<std::pair<int, int>, std::unique_ptr<TierBlocks>> tiers_;  // (kind, node)
  std::vector<std::byte> staging_;  // one block, tier to tier (I/O thread only)

  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<Job> queue_;
  bool running_job_ = false;
  bool stop_ = false;
  std::map<policies::TierIoId, policies::TransferStatus> finished_;
  policies::TierIoId next_ = 1;
  std::string last_error_;
  std::array<TierIoCounters, policies::kNumLowerTiers> counters_{};
  std::thread thread_;
};

// The storage of a cluster file's tiers on this host (node 0): DRAM and SSD with the capacity
// the file gives a node, the remote store at its endpoint. The SSD tier's blocks go under its
// "directory", or `default_ssd_dir` where the file names none. Instances are registered after.
Result<std::unique_ptr<HostTierStorage>> MakeHostTierStorage(
    const deploy::TiersSpec& tiers, StoredBlockLayout layout,
    const std::filesystem::path& default_ssd_dir);

}  // namespace duet::backend
