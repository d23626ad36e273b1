// The tier manager: write-through and write-back placement and their cascades, lookups that
// see only the tiers an instance can reach, loads that pin, and idleness at the end. The
// storage here is a plain list of posted I/O that the test completes when it chooses.
#include "policies/kv_tiers.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <map>

namespace duet::policies {
namespace {

// Records what the manager posts; an I/O is done once the test marks it so.
class ListStorage final : public TierStorage {
 public:
  TierIoId Post(const TierIo& io) override {
    posted.push_back(io);
    // The spans are valid during Post only: keep what they name.
    hashes.emplace_back(io.hashes.begin(), io.hashes.end());
    evicted.emplace_back(io.evicted.begin(), io.evicted.end());
    gpu.emplace_back(io.gpu_blocks.begin(), io.gpu_blocks.end());
    posted.back().hashes = posted.back().evicted = {};
    posted.back().gpu_blocks = {};
    status[posted.size()] = TransferStatus::kInProgress;
    return posted.size();
  }
  TransferStatus Poll(TierIoId id) override { return status.at(id); }
  void CompleteAll() {
    for (auto& [id, s] : status) s = TransferStatus::kDone;
  }
  std::vector<TierIo> posted;
  std::vector<std::vector<BlockHash>> hashes, evicted;  // of each posted I/O
  std::vector<std::vector<KvBlockManager::BlockId>> gpu;
  std::map<TierIoId, TransferStatus> status;
};

constexpr Bytes kBlockBytes = 1000;

TierSetup Tiers(std::int64_t dram_blocks, TierPlacement dram, std::int64_t ssd_blocks,
                TierPlacement ssd, std::int64_t remote_blocks = 0) {
  TierSetup s;
  s.block_bytes = kBlockBytes;
  s.num_nodes = 2;
  s.instance_node = {0, 1};  // instance 0 on node 0, instance 1 on node 1
  auto set = [&](TierKind k, std::int64_t blocks, TierPlacement p) {
    TierConfig& c = s.tiers[static_cast<std::size_t>(k)];
    c.enabled = blocks > 0;
    c.capacity_bytes = blocks * kBlockBytes;
    c.placement = p;
    c.read_bandwidth = 1e6;
  };
  set(TierKind::kDram, dram_blocks, dram);
  set(TierKind::kSsd, ssd_blocks, ssd);
  set(TierKind::kRemote, remote_blocks, TierPlacement::kWriteThrough);
  return s;
}

std::int64_t DramHits(const TierManager& m, InstanceId i, std::vector<BlockHash> hashes) {
  return m.Lookup(i, hashes, 0, 100).blocks[0];
}

TEST(TierManager, WriteThroughCopiesComputedBlocksDownAndShowsThemOnceWritten) {
  ListStorage storage;
  TierManager m(Tiers(8, TierPlacement::kWriteThrough, 8, TierPlacement::kWriteThrough), &storage);
  const std::vector<BlockHash> prompt = {11, 12, 13};
  m.OnComputed(0, prompt);
  // GPU -> DRAM and, streaming on, DRAM -> SSD, both posted at once.
  ASSERT_EQ(storage.posted.size(), 2u);
  EXPECT_EQ(storage.posted[0].tier, TierKind::kDram);
  EXPECT_EQ(storage.posted[0].instance, 0);
  EXPECT_EQ(storage.posted[0].bytes, 3 * kBlockBytes);
  EXPECT_EQ(storage.hashes[0], prompt) << "a tier names blocks by their hashes";
  EXPECT_EQ(storage.posted[1].tier, TierKind::kSsd);
  EXPECT_EQ(storage.hashes[1], prompt);
  EXPECT_EQ(storage.posted[1].instance, kNoInstance);
  EXPECT_EQ(storage.posted[1].from, TierKind::kDram);
  // Nothing is readable before its write finished.
  EXPECT_EQ(m.Lookup(0, prompt, 0, 100).total(), 0);
  EXPECT_FALSE(m.CheckInvariants(/*expect_idle=*/true).ok());
  EXPECT_TRUE(m.HasPendingWrites(0));
  storage.CompleteAll();
  m.Progress(0);
  EXPECT_FALSE(m.HasPendingWrites(0));
  EXPECT_EQ(DramHits(m, 0, prompt), 3) << "the fastest tier holding each block wins";
  EXPECT_EQ(m.counters(TierKind::kSsd).written_blocks, 3);
  // Computing the same blocks again writes nothing.
  m.OnComputed(0, prompt);
  EXPECT_EQ(storage.posted.size(), 2u);
  EXPECT_TRUE(m.CheckInvariants(true).ok()) << m.CheckInvariants(true).message();
}

// A write from the GPU reads its blocks until it ends: a step that writes KV into one of them
// waits for it, a step that writes other blocks (the next ones of the same requests) does not.
TEST(TierManager, AStepWaitsOnlyForTheWritesThatReadABlockItWrites) {
  ListStorage storage;
  TierManager m(Tiers(8, TierPlacement::kWriteThrough, 8, TierPlacement::kWriteThrough), &storage);
  using Blocks = std::vector<KvBlockManager::BlockId>;
  m.OnComputed(0, std::vector<BlockHash>{11, 12, 13}, Blocks{4, 5, 6});
  ASSERT_EQ(storage.gpu[0], (Blocks{4, 5, 6}));
  EXPECT_TRUE(m.ReadingGpu(0, Blocks{5}));
  EXPECT_TRUE(m.ReadingGpu(0, Blocks{1, 2, 6}));
  EXPECT_FALSE(m.ReadingGpu(0, Blocks{1, 2, 3, 7})) << "the blocks after them: no wait";
  EXPECT_FALSE(m.ReadingGpu(1, Blocks{4, 5, 6})) << "another instance's blocks 4 to 6";
  storage.CompleteAll();
  EXPECT_FALSE(m.ReadingGpu(0, Blocks{4, 5, 6})) << "written: the blocks are free to change";
}

// A router looks one request up on several instances of a node in a row: the manager reuses
// its last lookup of a node, but never past a change of the stores or of the hashes.
TEST(TierManager, RepeatedLookupsSeeEveryChangeOfTheStoresAndOfTheHashes) {
  ListStorage storage;
  TierManager m(Tiers(3, TierPlacement::kWriteThrough, 0, TierPlacement::kWriteThrough), &storage);
  std::vector<BlockHash> prompt = {11, 12, 13};
  m.OnComputed(0, prompt);
  storage.CompleteAll();
  m.Progress(0);
  EXPECT_EQ(m.Lookup(0, prompt, 0, 100).total(), 3);
  EXPECT_EQ(m.Lookup(0, prompt, 0, 100).total(), 3);
  prompt[1] = 99;  // same vector, same place, other content
  EXPECT_EQ(m.Lookup(0, prompt, 0, 100).total(), 1);
  prompt[1] = 12;
  EXPECT_EQ(m.Lookup(0, prompt, 1, 100).total(), 2);
  EXPECT_EQ(m.Lookup(0, prompt, 0, 100).total(), 3);
  // Writing three other blocks evicts all three (the write has only started: not readable).
  m.OnComputed(0, std::vector<BlockHash>{21, 22, 23});
  EXPECT_EQ(m.Lookup(0, prompt, 0, 100).total(), 0);
  EXPECT_EQ(m.Lookup(0, std::vector<BlockHash>{21, 22, 23}, 0, 100).total(), 0);
  storage.CompleteAll();
  m.Progress(0);
  EXPECT_EQ(m.Lookup(0, std::vector<BlockHash>{21, 22, 23}, 0, 100).total(), 3);
  EXPECT_EQ(m.Lookup(1, std::vector<BlockHash>{21, 22, 23}, 0, 100).total(), 0);  // other node
}

TEST(TierManager, WriteBackCopiesDownOnlyWhatTheTierAboveEvicts) {
  ListStorage storage;
  TierManager m(Tiers(2, TierPlacement::kWriteBack, 8, TierPlacement::kWriteBack), &storage);
  m.OnComputed(0, std::vector<BlockHash>{1, 2, 3});
  EXPECT_TRUE(storage.posted.empty()) << "write-back: nothing moves at compute time";
  m.OnGpuEvicted(0, std::vector<BlockHash>{1, 2});
  ASSERT_EQ(storage.posted.size(), 1u);
  EXPECT_EQ(storage.posted[0].tier, TierKind::kDram);
  storage.CompleteAll();
  m.Progress(0);
  // DRAM is full: taking block 3 evicts block 1 (LRU), which moves down to the SSD. The
  // write-back is posted first: real storage runs I/Os in order, and the write of block 3 names
  // block 1 as the room it takes, whose bytes go when that write runs.
  m.OnGpuEvicted(0, std::vector<BlockHash>{3});
  ASSERT_EQ(storage.posted.size(), 3u);
  EXPECT_EQ(storage.posted[1].tier, TierKind::kSsd);
  EXPECT_EQ(storage.posted[1].from, TierKind::kDram);
  EXPECT_EQ(storage.posted[1].blocks, 1);
  EXPECT_EQ(storage.hashes[1], std::vector<BlockHash>{1});
  EXPECT_TRUE(storage.evicted[1].empty());
  EXPECT_EQ(storage.posted[2].tier, TierKind::kDram);
  EXPECT_EQ(storage.hashes[2], std::vector<BlockHash>{3});
  EXPECT_EQ(storage.evicted[2], std::vector<BlockHash>{1});
  storage.CompleteAll();
  m.Progress(0);
  const TierHits hits = m.Lookup(0, std::vector<BlockHash>{1, 2, 3}, 0, 100);
  EXPECT_EQ(hits.blocks[static_cast<int>(TierKind::kSsd)], 1);   // block 1
  EXPECT_EQ(hits.blocks[static_cast<int>(TierKind::kDram)], 2);  // blocks 2, 3
  EXPECT_EQ(m.evictions(TierKind::kDram), 1);
  EXPECT_TRUE(m.CheckInvariants(true).ok()) << m.CheckInvariants(true).message();
}

TEST(TierManager, AnInstanceSeesItsNodesTiersAndTheRemoteStoreOnly) {
  ListStorage storage;
  TierManager m(Tiers(8, TierPlacement::kWriteThrough, 0, TierPlacement::kWriteThrough, 8),
                &storage);
  m.OnComputed(0, std::vector<BlockHash>{1, 2, 3});
  storage.CompleteAll();
  m.Progress(0);
  EXPECT_EQ(DramHits(m, 0, {1, 2, 3}), 3);
  const TierHits other = m.Lookup(1, std::vector<BlockHash>{1, 2, 3}, 0, 100);
  EXPECT_EQ(other.blocks[static_cast<int>(TierKind::kDram)], 0) << "node 1 has its own DRAM";
  EXPECT_EQ(other.blocks[static_cast<int>(TierKind::kRemote)], 3);
  // A prefix stops at its first block that no tier holds; `first` and `max_blocks` bound it.
  EXPECT_EQ(m.Lookup(0, std::vector<BlockHash>{1, 9, 2}, 0, 100).total(), 1);
  EXPECT_EQ(m.Lookup(0, std::vector<BlockHash>{1, 2, 3}, 1, 100).total(), 2);
  EXPECT_EQ(m.Lookup(0, std::vector<BlockHash>{1, 2, 3}, 0, 2).total(), 2);
  EXPECT_GT(m.EstimateLoadSeconds(other), 0);
}

TEST(TierManager, LoadsPinTheirBlocksUntilRead) {
  ListStorage storage;
  TierManager m(Tiers(2, TierPlacement::kWriteBack, 0, TierPlacement::kWriteBack), &storage);
  m.OnGpuEvicted(0, std::vector<BlockHash>{1, 2});
  storage.CompleteAll();
  m.Progress(0);
  const std::vector<BlockHash> prompt = {1, 2};
  const TierHits hits = m.Lookup(0, prompt, 0, 100);
  ASSERT_EQ(hits.total(), 2);
  const LoadId load = m.BeginLoad(0, prompt, 0, hits);
  ASSERT_EQ(storage.posted.back().read, true);
  EXPECT_EQ(storage.posted.back().bytes, 2 * kBlockBytes);
  // Both blocks are pinned: a new block finds no room and is dropped, not written.
  m.OnGpuEvicted(0, std::vector<BlockHash>{3});
  EXPECT_EQ(m.counters(TierKind::kDram).dropped_writes, 1);
  EXPECT_EQ(m.PollLoad(load), TransferStatus::kInProgress);
  EXPECT_FALSE(m.CheckInvariants(true).ok()) << "a load in flight is not idle";
  storage.CompleteAll();
  EXPECT_EQ(m.PollLoad(load), TransferStatus::kDone);
  EXPECT_TRUE(m.CheckInvariants(true).ok()) << m.CheckInvariants(true).message();
  m.OnGpuEvicted(0, std::vector<BlockHash>{3});  // now block 1 can go
  EXPECT_EQ(m.evictions(TierKind::kDram), 1);
}

}  // namespace
}  // namespace duet::policies

namespace duet::policies {
namespace {

TEST(TierManager, BlocksAFailedReadFoundLostAreForgottenAndWrittenAgainWhenComputed) {
  ListStorage storage;
  TierManager m(Tiers(8, TierPlacement::kWriteThrough, 0, TierPlacement::kWriteBack), &storage);
  const std::vector<BlockHash> prompt = {1, 2, 3};
  const std::vector<KvBlockManager::BlockId> gpu = {7, 8, 9};
  m.OnComputed(0, prompt, gpu);
  EXPECT_EQ(storage.gpu.back(), gpu) << "the GPU blocks the write reads";
  storage.CompleteAll();
  m.Progress(0);
  const TierHits hits = m.Lookup(0, prompt, 0, 100);
  ASSERT_EQ(hits.total(), 3);
  const LoadId load = m.BeginLoad(0, prompt, 0, hits, gpu);
  EXPECT_EQ(storage.gpu.back(), gpu) << "the GPU blocks the read fills";
  storage.status[storage.posted.size()] = TransferStatus::kFailed;  // e.g. a corrupt file
  EXPECT_EQ(m.PollLoad(load), TransferStatus::kFailed);
  EXPECT_EQ(m.Lookup(0, prompt, 0, 100).total(), 0) << "lost blocks are not found again";
  EXPECT_TRUE(m.CheckInvariants(true).ok()) << m.CheckInvariants(true).message();
  // Computed again, they are written again, and the storage is told to drop what it held.
  m.OnComputed(0, prompt, gpu);
  EXPECT_EQ(storage.hashes.back(), prompt);
  EXPECT_EQ(storage.evicted.back(), prompt);
  storage.CompleteAll();
  m.Progress(0);
  EXPECT_EQ(DramHits(m, 0, prompt), 3);
  EXPECT_EQ(m.evictions(TierKind::kDram), 0) << "forgetting is no eviction";
}

TEST(TierManager, BlocksAStorageFoundAtStartAreReadableAtOnceWithinTheTiersRoom) {
  ListStorage storage;
  TierManager m(Tiers(0, TierPlacement::kWriteThrough, 2, TierPlacement::kWriteThrough), &storage);
  m.Adopt(TierKind::kSsd, 0, std::vector<BlockHash>{1, 2, 3});
  EXPECT_TRUE(storage.posted.empty()) << "nothing moves: the storage holds them";
  const TierHits hits = m.Lookup(0, std::vector<BlockHash>{2, 3}, 0, 100);
  EXPECT_EQ(hits.blocks[static_cast<int>(TierKind::kSsd)], 2) << "room for two: the oldest went";
  EXPECT_EQ(m.Lookup(1, std::vector<BlockHash>{2}, 0, 100).total(), 0) << "node 0's SSD only";
  EXPECT_TRUE(m.CheckInvariants(true).ok()) << m.CheckInvariants(true).message();
  m.OnComputed(0, std::vector<BlockHash>{4});
  EXPECT_NE(std::find(storage.evicted.back().begin(), storage.evicted.back().end(), 1),
            storage.evicted.back().end())
      << "the storage is told to drop what did not fit";
}

TEST(TierManager, PrefetchPromotesAQueuedPrefixFromSsdIntoDram) {
  ListStorage storage;
  TierManager m(Tiers(2, TierPlacement::kWriteBack, 8, TierPlacement::kWriteBack), &storage);
  // Blocks 1..3 reach the SSD through DRAM's evictions (DRAM holds two blocks).
  m.OnGpuEvicted(0, std::vector<BlockHash>{1, 2});
  storage.CompleteAll();
  m.Progress(0);
  m.OnGpuEvicted(0, std::vector<BlockHash>{3, 4});
  storage.CompleteAll();
  m.Progress(0);
  const std::vector<BlockHash> prompt = {1, 2, 5};
  TierHits hits = m.Lookup(0, prompt, 0, 100);
  ASSERT_EQ(hits.blocks[static_cast<int>(TierKind::kSsd)], 2);
  const std::size_t posted = storage.posted.size();
  // Block 5 is nowhere: the prefix is blocks 1 and 2, both copied SSD -> DRAM in one write.
  EXPECT_EQ(m.Prefetch(0, prompt, 0), 2);
  // DRAM's write-back of 3 and 4, then the promotion that takes their room.
  ASSERT_EQ(storage.posted.size(), posted + 2);
  EXPECT_EQ(storage.posted[posted].tier, TierKind::kSsd);
  EXPECT_EQ(storage.hashes[posted], (std::vector<BlockHash>{3, 4}));
  EXPECT_EQ(storage.posted[posted + 1].tier, TierKind::kDram);
  EXPECT_EQ(storage.posted[posted + 1].from, TierKind::kSsd);
  EXPECT_EQ(storage.posted[posted + 1].instance, kNoInstance);
  EXPECT_EQ(storage.hashes[posted + 1], (std::vector<BlockHash>{1, 2}));
  EXPECT_EQ(storage.evicted[posted + 1], (std::vector<BlockHash>{3, 4}));
  storage.CompleteAll();
  m.Progress(0);
  hits = m.Lookup(0, prompt, 0, 100);
  EXPECT_EQ(hits.blocks[static_cast<int>(TierKind::kDram)], 2);
  EXPECT_EQ(m.counters(TierKind::kDram).prefetch_blocks, 2);
  EXPECT_EQ(m.Prefetch(0, prompt, 0), 0) << "already in DRAM";
  EXPECT_TRUE(m.CheckInvariants(true).ok()) << m.CheckInvariants(true).message();
}

}  // namespace
}  // namespace duet::policies
