// One KV tier's contents: LRU and ARC eviction order on hand-built cases, blocks readable only
// once their write finished, in-flight and pinned blocks never evicted, and a random workload
// against a shadow model (nothing readable that was never written, capacity never exceeded,
// LRU order kept).
#include "policies/kv_tier_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>

namespace duet::policies {
namespace {

using WriteId = KvTierStore::WriteId;

// Starts a write of `hashes`; returns its id (0 if no block started) and what started.
WriteId Begin(KvTierStore& s, std::vector<BlockHash> hashes, std::vector<BlockHash>* evicted,
              std::vector<BlockHash>* started = nullptr, std::int64_t* no_room = nullptr) {
  std::vector<BlockHash> ignored;
  const KvTierStore::WriteStart st = s.BeginWrite(hashes, started ? started : &ignored, evicted);
  if (no_room) *no_room = st.no_room;
  return st.id;
}

void Write(KvTierStore& s, BlockHash h, std::vector<BlockHash>* evicted = nullptr) {
  std::vector<BlockHash> ignored;
  const WriteId id = Begin(s, {h}, evicted ? evicted : &ignored);
  ASSERT_NE(id, 0u) << h;
  s.EndWrite(id);
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
  std::vector<BlockHash> evicted, started;
  const WriteId w = Begin(s, {7}, &evicted);
  ASSERT_NE(w, 0u);
  EXPECT_FALSE(s.Contains(7)) << "a block being written is not readable yet";
  EXPECT_EQ(Begin(s, {7}, &evicted), 0u) << "no second write of the same block";
  EXPECT_EQ(s.used_blocks(), 1);
  s.EndWrite(w);
  EXPECT_TRUE(s.Contains(7));
  // A failed write releases its room and never becomes readable.
  const WriteId failed = Begin(s, {8}, &evicted, &started);
  ASSERT_NE(failed, 0u);
  EXPECT_NE(failed, w);
  s.AbortWrite(failed, started);
  EXPECT_FALSE(s.Contains(8));
  EXPECT_EQ(s.used_blocks(), 1);
  EXPECT_TRUE(evicted.empty());
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants().message();
}

// A write of several blocks skips those held or being written, refuses those with no room, and
// makes the rest readable together when it ends; writes end in any order.
TEST(KvTierStore, AWriteOfManyBlocksEndsAsOne) {
  KvTierStore s(4, EvictionPolicy::kLru);
  std::vector<BlockHash> evicted, started_a, started_b;
  Write(s, 1);
  const WriteId a = Begin(s, {1, 2, 3}, &evicted, &started_a);
  EXPECT_EQ(started_a, (std::vector<BlockHash>{2, 3})) << "1 is held already";
  std::int64_t no_room = 0;
  const WriteId b = Begin(s, {3, 4, 5, 6}, &evicted, &started_b, &no_room);
  // 3 is being written; 4 fills the tier, 5 evicts 1 (the only block neither written nor read),
  // and 6 finds nothing to evict.
  EXPECT_EQ(started_b, (std::vector<BlockHash>{4, 5}));
  EXPECT_EQ(evicted, (std::vector<BlockHash>{1}));
  EXPECT_EQ(no_room, 1);
  EXPECT_EQ(s.writing_blocks(), 4);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants().message();
  s.EndWrite(b);  // the later write ends first
  EXPECT_TRUE(s.Contains(4) && s.Contains(5));
  EXPECT_FALSE(s.Contains(2) || s.Contains(3));
  EXPECT_EQ(s.writing_blocks(), 2);
  // Blocks being written are never evicted: 4 and 5 go first, though 2 and 3 are older.
  evicted.clear();
  std::vector<BlockHash> started_c;
  const WriteId c = Begin(s, {7, 8}, &evicted, &started_c);
  EXPECT_EQ(evicted, (std::vector<BlockHash>{4, 5}));
  s.EndWrite(a);
  EXPECT_TRUE(s.Contains(2) && s.Contains(3));
  s.AbortWrite(c, started_c);
  EXPECT_FALSE(s.Contains(7) || s.Contains(8));
  EXPECT_EQ(s.EvictionOrder(), (std::vector<BlockHash>{2, 3}));
  EXPECT_EQ(s.writing_blocks(), 0);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants().message();
}

// Hits leave stale records behind in the recency queue; once they are many, the queue is
// compacted and its blocks renumbered, a write in flight among them.
TEST(KvTierStore, AWriteInFlightOutlivesTheQueueCompacting) {
  KvTierStore s(100, EvictionPolicy::kLru);
  for (BlockHash h = 1; h <= 10; ++h) Write(s, h);
  std::vector<BlockHash> evicted;
  const WriteId w = Begin(s, {50, 51}, &evicted);
  ASSERT_NE(w, 0u);
  for (int k = 0; k < 5000; ++k) Hit(s, 1 + static_cast<BlockHash>(k % 10));
  EXPECT_FALSE(s.Contains(50) || s.Contains(51));
  EXPECT_EQ(s.writing_blocks(), 2);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants().message();
  s.EndWrite(w);
  EXPECT_TRUE(s.Contains(50) && s.Contains(51));
  EXPECT_EQ(s.EvictionOrder().front(), 50u);
  EXPECT_TRUE(s.CheckInvariants().ok()) << s.CheckInvariants().message();
}

TEST(KvTierStore, InFlightAndPinnedBlocksAreNeverEvicted) {
  KvTierStore s(2, EvictionPolicy::kLru);
  std::vector<BlockHash> evicted;
  Write(s, 1);
  ASSERT_TRUE(s.PinForRead(1));
  ASSERT_NE(Begin(s, {2}, &evicted), 0u);  // in flight
  EXPECT_FALSE(s.PinForRead(2)) << "a block being written cannot be read yet";
  EXPECT_FALSE(s.PinForRead(9)) << "nor one never written";
  EXPECT_EQ(s.pinned_blocks(), 1);
  std::int64_t no_room = 0;
  EXPECT_EQ(Begin(s, {3}, &evicted, nullptr, &no_room), 0u);
  EXPECT_EQ(no_room, 1);
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(s.used_blocks(), 2);
  s.Unpin(1);
  EXPECT_NE(Begin(s, {3}, &evicted), 0u);
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
    std::vector<std::pair<WriteId, std::vector<BlockHash>>> writes;  // in flight
    std::multiset<BlockHash> pins;
    std::vector<BlockHash> evicted;
    for (int step = 0; step < 20000; ++step) {
      const BlockHash h = 1 + rng() % 80;
      switch (rng() % 5) {
        case 0:
        case 1: {
          // One to four blocks, some maybe repeated or held already.
          std::vector<BlockHash> hashes = {h};
          for (std::uint64_t n = rng() % 4; n > 0; --n) hashes.push_back(1 + rng() % 80);
          evicted.clear();
          std::vector<BlockHash> started;
          const KvTierStore::WriteStart st = s.BeginWrite(hashes, &started, &evicted);
          for (BlockHash e : evicted) {
            ASSERT_TRUE(readable.count(e)) << "evicted a block that was not readable: " << e;
            ASSERT_FALSE(pins.count(e)) << "evicted a pinned block: " << e;
            readable.erase(e);
            forget(e);
          }
          for (BlockHash b : started) {
            ASSERT_FALSE(readable.count(b) || writing.count(b)) << "started a held block: " << b;
            writing.insert(b);
            recency.push_back(b);
          }
          ASSERT_EQ(st.id != 0, !started.empty());
          ASSERT_LE(started.size() + static_cast<std::size_t>(st.no_room), hashes.size());
          if (st.id != 0) writes.emplace_back(st.id, started);
          break;
        }
        case 2:
          if (!writes.empty()) {
            // Writes end in any order.
            const std::size_t k = rng() % writes.size();
            const auto [id, blocks] = writes[k];
            writes.erase(writes.begin() + static_cast<std::ptrdiff_t>(k));
            for (BlockHash b : blocks) writing.erase(b);
            if (rng() % 10 == 0) {
              s.AbortWrite(id, blocks);
              for (BlockHash b : blocks) forget(b);
            } else {
              s.EndWrite(id);
              readable.insert(blocks.begin(), blocks.end());
            }
          }
          break;
        case 3:
          if (readable.count(h)) {
            ASSERT_TRUE(s.PinForRead(h));
            pins.insert(h);
            forget(h);
            recency.push_back(h);
          } else {
            ASSERT_FALSE(s.PinForRead(h));
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
      ASSERT_EQ(s.writing_blocks(), static_cast<std::int64_t>(writing.size()));
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
