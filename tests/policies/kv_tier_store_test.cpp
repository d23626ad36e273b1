// One KV tier's contents: LRU and ARC eviction order on hand-built cases, blocks readable only
// once their write finished, in-flight and pinned blocks never evicted, and a random workload
// against a shadow model (nothing readable that was never written, capacity never exceeded,
// LRU order kept).
#include "policies/kv_tier_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace duet::policies {
namespace {

using Start = KvTierStore::WriteStart;

void Write(KvTierStore& s, BlockHash h, std::vector<BlockHash>* evicted = nullptr) {
  std::vector<BlockHash> ignored;
  ASSERT_EQ(s.BeginWrite(h, evicted ? evicted : &ignored), Start::kStarted) << h;
  s.EndWrite(h);
}

void Hit(KvTierStore& s, BlockHash h) {
  ASSERT_TRUE(s.PinForRead(h)) << h;
  s.Unpin(h);
}

TEST(KvTierStore, LruEvictsTheLeastRecentlyUsed) {
  KvTierStore s(3, EvictionPolicy::kLru);
  Write(s, 1);
  Write(s, 2);
  Write(s, 3);
  Hit(s, 1);  // 2 is now the least recently used
  EXPECT_EQ(s.EvictionOrder(), (std::vector<BlockHash>{2, 3, 1}));
  std::vector<BlockHash> evicted;
  Write(s, 4, &evicted);
  EXPECT_EQ(evicted, (std::vector<BlockHash>{2}));
  EXPECT_FALSE(s.Contains(2));
  EXPECT_EQ(s.EvictionOrder(), (std::vector<BlockHash>{3, 1, 4}));
  EXPECT_EQ(s.evictions(), 1);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants().message();
}

TEST(KvTierStore, BlocksAreReadableOnlyOnceWritten) {
  KvTierStore s(2, EvictionPolicy::kLru);
  std::vector<BlockHash> evicted;
  ASSERT_EQ(s.BeginWrite(7, &evicted), Start::kStarted);
  EXPECT_FALSE(s.Contains(7)) << "a block being written is not readable yet";
  EXPECT_EQ(s.BeginWrite(7, &evicted), Start::kPresent) << "no second write of the same block";
  EXPECT_EQ(s.used_blocks(), 1);
  s.EndWrite(7);
  EXPECT_TRUE(s.Contains(7));
  // A failed write releases its room and never becomes readable.
  ASSERT_EQ(s.BeginWrite(8, &evicted), Start::kStarted);
  s.AbortWrite(8);
  EXPECT_FALSE(s.Contains(8));
  EXPECT_EQ(s.used_blocks(), 1);
  EXPECT_TRUE(evicted.empty());
}

TEST(KvTierStore, InFlightAndPinnedBlocksAreNeverEvicted) {
  KvTierStore s(2, EvictionPolicy::kLru);
  std::vector<BlockHash> evicted;
  Write(s, 1);
  ASSERT_TRUE(s.PinForRead(1));
  ASSERT_EQ(s.BeginWrite(2, &evicted), Start::kStarted);  // in flight
  EXPECT_FALSE(s.PinForRead(2)) << "a block being written cannot be read yet";
  EXPECT_FALSE(s.PinForRead(9)) << "nor one never written";
  EXPECT_EQ(s.pinned_blocks(), 1);
  EXPECT_EQ(s.BeginWrite(3, &evicted), Start::kNoRoom);
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(s.used_blocks(), 2);
  s.Unpin(1);
  EXPECT_EQ(s.BeginWrite(3, &evicted), Start::kStarted);
  EXPECT_EQ(evicted, (std::vector<BlockHash>{1}));
  EXPECT_EQ(s.peak_used_blocks(), 2);
}

// A block used twice survives a scan of blocks used once under ARC, not under LRU.
TEST(KvTierStore, ArcKeepsFrequentBlocksThroughAScan) {
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    KvTierStore s(4, policy);
    Write(s, 1);
    Write(s, 2);
    Hit(s, 1);
    Hit(s, 2);
    for (BlockHash scan = 100; scan < 105; ++scan) Write(s, scan);
    const bool kept = s.Contains(1) && s.Contains(2);
    EXPECT_EQ(kept, policy == EvictionPolicy::kArc) << ToString(policy);
    EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants().message();
  }
}

// ARC's REPLACE evicts from the recency list T1 while it is larger than the target p; a hit in
// the ghost of T1 (B1) grows p and brings the block back into the frequency list T2.
TEST(KvTierStore, ArcAdaptsItsTargetOnGhostHits) {
  KvTierStore s(2, EvictionPolicy::kArc);
  std::vector<BlockHash> evicted;
  Write(s, 1);
  Write(s, 2);
  EXPECT_EQ(s.EvictionOrder(), (std::vector<BlockHash>{1, 2}));  // T1, LRU first
  Write(s, 3, &evicted);
  EXPECT_EQ(evicted, (std::vector<BlockHash>{1}));  // 1 is now a ghost in B1
  EXPECT_EQ(s.arc_target(), 0);
  evicted.clear();
  Write(s, 1, &evicted);  // ghost hit: p grows, 1 enters T2
  EXPECT_EQ(s.arc_target(), 1);
  EXPECT_EQ(evicted, (std::vector<BlockHash>{2}));  // |T1| = 2 > p = 1: from T1
  EXPECT_TRUE(s.Contains(1));
  EXPECT_TRUE(s.Contains(3));
  // T1 = {3} is not larger than p = 1 now: the next eviction takes T2's LRU instead.
  EXPECT_EQ(s.EvictionOrder(), (std::vector<BlockHash>{1, 3}));
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants().message();
}

// Random operations against a shadow of what was written and not evicted since: a block is
// readable exactly when the shadow says so, and the store never holds more than its capacity.
// Under LRU the shadow also keeps the recency order, which the store's eviction order must
// equal.
TEST(KvTierStore, RandomWorkloadMatchesShadowModel) {
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kArc}) {
    SCOPED_TRACE(ToString(policy));
    constexpr std::int64_t kCapacity = 24;
    KvTierStore s(kCapacity, policy);
    std::vector<BlockHash> recency;  // LRU: readable and in-flight blocks, least recent first
    auto forget = [&](BlockHash h) { recency.erase(std::find(recency.begin(), recency.end(), h)); };
    std::mt19937_64 rng(42);
    std::set<BlockHash> readable, writing;
    std::multiset<BlockHash> pins;
    std::vector<BlockHash> evicted;
    for (int step = 0; step < 20000; ++step) {
      const BlockHash h = 1 + rng() % 80;
      switch (rng() % 5) {
        case 0:
        case 1: {
          evicted.clear();
          const Start st = s.BeginWrite(h, &evicted);
          for (BlockHash e : evicted) {
            ASSERT_TRUE(readable.count(e)) << "evicted a block that was not readable: " << e;
            ASSERT_FALSE(pins.count(e)) << "evicted a pinned block: " << e;
            readable.erase(e);
            forget(e);
          }
          if (st == Start::kStarted) {
            writing.insert(h);
            recency.push_back(h);
          }
          if (st == Start::kPresent) {
            ASSERT_TRUE(readable.count(h) || writing.count(h));
          }
          break;
        }
        case 2:
          if (!writing.empty()) {
            const BlockHash w = *writing.begin();
            writing.erase(w);
            if (rng() % 10 == 0) {
              s.AbortWrite(w);
              forget(w);
            } else {
              s.EndWrite(w);
              readable.insert(w);
            }
          }
          break;
        case 3:
          if (readable.count(h)) {
            ASSERT_TRUE(s.PinForRead(h));
            pins.insert(h);
            forget(h);
            recency.push_back(h);
          }
          break;
        case 4:
          if (pins.count(h)) {
            s.Unpin(h);
            pins.erase(pins.find(h));
          }
          break;
      }
      for (BlockHash x = 1; x <= 80; ++x) ASSERT_EQ(s.Contains(x), readable.count(x) == 1) << x;
      ASSERT_LE(s.used_blocks(), kCapacity);
      ASSERT_EQ(s.used_blocks(), static_cast<std::int64_t>(readable.size() + writing.size()));
      if (policy == EvictionPolicy::kLru) {
        ASSERT_EQ(s.EvictionOrder(), recency);
      }
      if (step % 97 == 0) {
        ASSERT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants().message();
      }
    }
    EXPECT_GT(s.evictions(), 100);
  }
}

}  // namespace
}  // namespace duet::policies
