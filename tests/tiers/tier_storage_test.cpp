// HostTierStorage: the tier manager's I/Os run against two instances' KV regions and real tiers
// (DRAM, block files, redis-server): bytes written from one instance's blocks come back into
// another's, through every tier and between tiers; a write-back reads what the tier evicted
// before the write that takes its room drops it; a failed I/O fails whole and leaves the tiers
// consistent.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/tiers/tier_storage.h"
#include "policies/kv_tiers.h"
#include "tests/model/temp_dir.h"
#include "tests/tiers/tier_test_util.h"

namespace duet::backend {
namespace {

using policies::TierIo;
using policies::TierKind;
using policies::TransferStatus;

constexpr std::int64_t kBlockBytes = 8192;
constexpr StoredBlockLayout kLayout{.fingerprint = 77, .block_bytes = kBlockBytes};

// An instance's KV region: num_blocks blocks of heap memory.
struct Region {
  explicit Region(std::int64_t blocks) : memory(static_cast<std::size_t>(blocks * kBlockBytes)) {
    region.base = memory.data();
    region.block_bytes = kBlockBytes;
    region.num_blocks = blocks;
  }
  std::span<std::byte> Block(std::int64_t b) {
    return {memory.data() + b * kBlockBytes, static_cast<std::size_t>(kBlockBytes)};
  }
  void Fill(std::int64_t b, std::uint64_t seed) {
    const auto bytes = BlockBytes(kBlockBytes, seed);
    std::memcpy(Block(b).data(), bytes.data(), bytes.size());
  }
  bool Holds(std::int64_t b, std::uint64_t seed) {
    const auto bytes = BlockBytes(kBlockBytes, seed);
    return std::memcmp(Block(b).data(), bytes.data(), bytes.size()) == 0;
  }
  std::vector<std::byte> memory;
  KvRegion region;
};

struct Io {
  TierIo io;
  std::vector<BlockHash> hashes, evicted;
  std::vector<policies::KvBlockManager::BlockId> gpu;
};

// GPU of `instance` -> `tier` (or, with instance kNoInstance, tier `from` -> `tier`).
TierIo Write(TierKind tier, policies::InstanceId instance, const std::vector<BlockHash>& hashes,
             const std::vector<policies::KvBlockManager::BlockId>& gpu,
             const std::vector<BlockHash>& evicted = {}, TierKind from = TierKind::kDram) {
  TierIo io;
  io.read = false;
  io.tier = tier;
  io.node = 0;
  io.instance = instance;
  io.from = from;
  io.blocks = static_cast<std::int64_t>(hashes.size());
  io.bytes = io.blocks * kBlockBytes;
  io.hashes = hashes;
  io.gpu_blocks = gpu;
  io.evicted = evicted;
  return io;
}
TierIo Read(TierKind tier, policies::InstanceId instance, const std::vector<BlockHash>& hashes,
            const std::vector<policies::KvBlockManager::BlockId>& gpu) {
  TierIo io = Write(tier, instance, hashes, gpu);
  io.read = true;
  return io;
}

TransferStatus Finish(HostTierStorage& s, policies::TierIoId id) {
  s.Drain();
  return s.Poll(id);
}

class Storage : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(redis_.Start()) << redis_.error();
    auto dram = DramTierBlocks::Create(kLayout, 2);
    ASSERT_TRUE(dram.ok()) << dram.error();
    auto ssd = FileTierBlocks::Open(temp_.path(), kLayout, 16);
    ASSERT_TRUE(ssd.ok()) << ssd.error();
    storage_.AddTier(TierKind::kDram, 0, std::move(dram.value()));
    storage_.AddTier(TierKind::kSsd, 0, std::move(ssd.value()));
    storage_.AddTier(TierKind::kRemote, 0,
                     std::make_unique<RedisTierBlocks>(redis_.endpoint(), kLayout, 16));
    storage_.RegisterInstance(0, a_.region);
    storage_.RegisterInstance(1, b_.region);
    for (int i = 0; i < 8; ++i) a_.Fill(i, 100 + static_cast<std::uint64_t>(i));
  }
  void TearDown() override {
    storage_.Drain();
    EXPECT_TRUE(storage_.CheckInvariants().ok()) << storage_.CheckInvariants().message();
  }
  RedisServer redis_;
  TempDir temp_;
  Region a_{8}, b_{8};
  HostTierStorage storage_;
};

TEST_F(Storage, BlocksWrittenFromOneInstanceComeBackIntoAnotherFromEveryTier) {
  // GPU 0 -> DRAM, then write-through DRAM -> SSD -> remote, posted back to back.
  const std::vector<BlockHash> h = {11, 12};
  const auto w1 = storage_.Post(Write(TierKind::kDram, 0, h, {3, 5}));
  const auto w2 =
      storage_.Post(Write(TierKind::kSsd, policies::kNoInstance, h, {}, {}, TierKind::kDram));
  const auto w3 =
      storage_.Post(Write(TierKind::kRemote, policies::kNoInstance, h, {}, {}, TierKind::kSsd));
  EXPECT_EQ(Finish(storage_, w1), TransferStatus::kDone) << storage_.last_error();
  EXPECT_EQ(storage_.Poll(w2), TransferStatus::kDone) << storage_.last_error();
  EXPECT_EQ(storage_.Poll(w3), TransferStatus::kDone) << storage_.last_error();
  EXPECT_EQ(storage_.Poll(w3), TransferStatus::kInProgress) << "a status is reported once";
  for (const TierKind tier : {TierKind::kDram, TierKind::kSsd, TierKind::kRemote}) {
    b_.Fill(0, 0), b_.Fill(1, 0);
    const auto r = storage_.Post(Read(tier, 1, h, {1, 0}));
    ASSERT_EQ(Finish(storage_, r), TransferStatus::kDone) << storage_.last_error();
    EXPECT_TRUE(b_.Holds(1, 103)) << policies::ToString(tier) << ": block 11 into block 1";
    EXPECT_TRUE(b_.Holds(0, 105)) << policies::ToString(tier) << ": block 12 into block 0";
  }
  const TierIoCounters c = storage_.counters(TierKind::kSsd);
  EXPECT_EQ(c.ios, 2);
  EXPECT_EQ(c.written_blocks, 2);
  EXPECT_EQ(c.read_bytes, 2 * kBlockBytes);
}

TEST_F(Storage, AWriteBackReadsTheEvictedBlocksBeforeTheWriteThatTakesTheirRoomDropsThem) {
  ASSERT_EQ(Finish(storage_, storage_.Post(Write(TierKind::kDram, 0, {1, 2}, {0, 1}))),
            TransferStatus::kDone);
  // DRAM is full (2 blocks): block 3 takes block 1's room. As the tier manager posts them: the
  // write-back of block 1 to the SSD, then the write of block 3 naming block 1 evicted.
  const auto back =
      storage_.Post(Write(TierKind::kSsd, policies::kNoInstance, {1}, {}, {}, TierKind::kDram));
  const auto take = storage_.Post(Write(TierKind::kDram, 0, {3}, {2}, {1}));
  EXPECT_EQ(Finish(storage_, back), TransferStatus::kDone) << storage_.last_error();
  EXPECT_EQ(storage_.Poll(take), TransferStatus::kDone) << storage_.last_error();
  const auto r = storage_.Post(Read(TierKind::kSsd, 1, {1}, {4}));
  ASSERT_EQ(Finish(storage_, r), TransferStatus::kDone) << storage_.last_error();
  EXPECT_TRUE(b_.Holds(4, 100)) << "block 1 reached the SSD with its bytes";
  EXPECT_EQ(storage_.blocks(TierKind::kDram, 0)->held_blocks(), 2);
  EXPECT_EQ(Finish(storage_, storage_.Post(Read(TierKind::kDram, 1, {1}, {5}))),
            TransferStatus::kFailed)
      << "an evicted block is gone from DRAM";
}

TEST_F(Storage, AFailedIoFailsWholeAndLeavesNothingHalfWritten) {
  // Three blocks into a two-block DRAM pool, nothing evicted: the third put fails, and the two
  // stored before it are dropped (the tier manager forgets the whole write).
  const auto w = storage_.Post(Write(TierKind::kDram, 0, {1, 2, 3}, {0, 1, 2}));
  EXPECT_EQ(Finish(storage_, w), TransferStatus::kFailed);
  EXPECT_NE(storage_.last_error().find("dram tier full"), std::string::npos)
      << storage_.last_error();
  EXPECT_EQ(storage_.blocks(TierKind::kDram, 0)->held_blocks(), 0);
  // A read of a block no tier holds, into a block the instance does not have, from a tier this
  // host does not have: each fails, naming why.
  EXPECT_EQ(Finish(storage_, storage_.Post(Read(TierKind::kSsd, 1, {9}, {0}))),
            TransferStatus::kFailed);
  EXPECT_NE(storage_.last_error().find("holds no block"), std::string::npos);
  ASSERT_EQ(Finish(storage_, storage_.Post(Write(TierKind::kSsd, 0, {9}, {0}))),
            TransferStatus::kDone);
  EXPECT_EQ(Finish(storage_, storage_.Post(Read(TierKind::kSsd, 1, {9}, {8}))),
            TransferStatus::kFailed);
  EXPECT_NE(storage_.last_error().find("has no block 8"), std::string::npos)
      << storage_.last_error();
  const std::vector<BlockHash> nine = {9};  // the I/O's spans name these: alive until Post
  const std::vector<policies::KvBlockManager::BlockId> zero = {0};
  TierIo elsewhere = Read(TierKind::kSsd, 1, nine, zero);
  elsewhere.node = 3;
  EXPECT_EQ(Finish(storage_, storage_.Post(elsewhere)), TransferStatus::kFailed);
  EXPECT_NE(storage_.last_error().find("no such tier on node 3"), std::string::npos);
  EXPECT_EQ(storage_.counters(TierKind::kSsd).failed_ios, 3);
}

TEST_F(Storage, ALostRemoteStoreFailsItsIosAndTheOtherTiersServeOn) {
  ASSERT_EQ(Finish(storage_, storage_.Post(Write(TierKind::kRemote, 0, {5}, {0}))),
            TransferStatus::kDone)
      << storage_.last_error();
  redis_.Kill();
  EXPECT_EQ(Finish(storage_, storage_.Post(Read(TierKind::kRemote, 1, {5}, {0}))),
            TransferStatus::kFailed);
  EXPECT_EQ(Finish(storage_, storage_.Post(Write(TierKind::kRemote, 0, {6}, {1}))),
            TransferStatus::kFailed);
  ASSERT_EQ(Finish(storage_, storage_.Post(Write(TierKind::kDram, 0, {6}, {1}))),
            TransferStatus::kDone);
  ASSERT_EQ(Finish(storage_, storage_.Post(Read(TierKind::kDram, 1, {6}, {2}))),
            TransferStatus::kDone);
  EXPECT_TRUE(b_.Holds(2, 101));
}

}  // namespace
}  // namespace duet::backend
