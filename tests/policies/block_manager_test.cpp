// KV block manager: allocation, prefix reuse with reference counts, LRU eviction order,
// growth and shrink, and the invariant check under a long random workload.
#include "policies/block_manager.h"

#include <gtest/gtest.h>

#include <random>

#include "policies/hash_index.h"

namespace duet::policies {
namespace {

std::vector<BlockHash> Chain(std::initializer_list<BlockHash> ids) { return ids; }

TEST(KvBlockManager, AllocatesAndFreesWithoutLeaks) {
  KvBlockManager m(10, 16);
  auto hit = m.Allocate(1, {}, 40, 39);  // 3 blocks
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, 0);
  EXPECT_EQ(m.TableBlocks(1), 3);
  EXPECT_EQ(m.kv_blocks_used(), 3);
  EXPECT_EQ(m.kv_blocks_free(), 7);
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
  m.Free(1);
  EXPECT_EQ(m.kv_blocks_used(), 0);
  EXPECT_TRUE(m.CheckInvariants().ok());
}

TEST(KvBlockManager, RefusesWhenShortAndChangesNothing) {
  KvBlockManager m(4, 16);
  ASSERT_TRUE(m.Allocate(1, {}, 48, 47));
  EXPECT_FALSE(m.Allocate(2, {}, 32, 31).has_value());
  EXPECT_FALSE(m.HasTable(2));
  EXPECT_EQ(m.kv_blocks_used(), 3);
  // The watermark reserve counts too.
  EXPECT_FALSE(m.Allocate(3, {}, 16, 15, /*reserve_blocks=*/1).has_value());
  EXPECT_TRUE(m.Allocate(3, {}, 16, 15, 0).has_value());
}

TEST(KvBlockManager, ReusesRegisteredPrefixWithReferenceCounts) {
  KvBlockManager m(10, 16);
  const auto a = Chain({11, 12, 13});
  ASSERT_TRUE(m.Allocate(1, a, 48, 47));
  m.Register(1, a, 48);
  EXPECT_EQ(m.CachedPrefixBlocks(a), 3);
  // Same first two blocks, different third.
  const auto b = Chain({11, 12, 99});
  EXPECT_EQ(m.CachedPrefixBlocks(b), 2);
  auto hit = m.Allocate(2, b, 48, 47);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, 32);
  EXPECT_EQ(m.Table(2)[0], m.Table(1)[0]);  // shared physical blocks
  EXPECT_EQ(m.Table(2)[1], m.Table(1)[1]);
  EXPECT_NE(m.Table(2)[2], m.Table(1)[2]);
  EXPECT_EQ(m.kv_blocks_used(), 4);  // 3 + 1 new
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
  m.Free(1);
  // Shared blocks are still referenced by request 2; block 13 is cached and evictable.
  EXPECT_EQ(m.kv_blocks_used(), 3);
  EXPECT_EQ(m.EvictionOrder(), std::vector<BlockHash>({13}));
  m.Free(2);
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
}

TEST(KvBlockManager, HitIsCappedByMaxHitTokens) {
  KvBlockManager m(10, 16);
  const auto a = Chain({1, 2, 3});
  ASSERT_TRUE(m.Allocate(1, a, 48, 47));
  m.Register(1, a, 48);
  m.Free(1);
  // A full hit would leave nothing to compute; the caller caps the hit one token short.
  auto hit = m.Allocate(2, a, 48, 47);
  ASSERT_TRUE(hit);
  EXPECT_EQ(*hit, 32);
}

TEST(KvBlockManager, EvictsLeastRecentlyUsedTailFirst) {
  KvBlockManager m(6, 16);
  const auto a = Chain({1, 2, 3});
  const auto b = Chain({4, 5, 6});
  ASSERT_TRUE(m.Allocate(1, a, 48, 47));
  m.Register(1, a, 48);
  ASSERT_TRUE(m.Allocate(2, b, 48, 47));
  m.Register(2, b, 48);
  m.Free(1);  // a's blocks become evictable, tail first: 3, 2, 1
  m.Free(2);  // then b's: 6, 5, 4
  EXPECT_EQ(m.EvictionOrder(), std::vector<BlockHash>({3, 2, 1, 6, 5, 4}));
  // Touching a's prefix (reuse of 1, 2) moves them to the most-recent end when released.
  ASSERT_TRUE(m.Allocate(3, Chain({1, 2}), 32, 32));
  m.Free(3);
  EXPECT_EQ(m.EvictionOrder(), std::vector<BlockHash>({3, 6, 5, 4, 2, 1}));
  // A new 2-block request evicts exactly the two least recently used blocks.
  ASSERT_TRUE(m.Allocate(4, {}, 32, 31));
  EXPECT_EQ(m.evictions(), 2);
  EXPECT_EQ(m.CachedPrefixBlocks(Chain({1, 2})), 2);
  EXPECT_EQ(m.CachedPrefixBlocks(Chain({3})), 0);
  EXPECT_EQ(m.CachedPrefixBlocks(Chain({4, 5, 6})), 2);  // 6 went second; 4 and 5 stay
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
}

TEST(KvBlockManager, ReusedEvictableBlocksAreNotCountedAsFree) {
  KvBlockManager m(4, 16);
  const auto a = Chain({1, 2});
  ASSERT_TRUE(m.Allocate(1, a, 32, 31));
  m.Register(1, a, 32);
  m.Free(1);
  EXPECT_EQ(m.kv_blocks_free(), 4);
  // Reusing block 1 takes it out of the evictable pool: 3 blocks total need 3 of the 4.
  EXPECT_EQ(m.BlocksNeeded(a, 48, 47), 3);
  ASSERT_TRUE(m.Allocate(2, a, 48, 47));
  EXPECT_EQ(m.kv_blocks_free(), 1);
  ASSERT_TRUE(m.CheckInvariants().ok());
}

TEST(KvBlockManager, GrowShrinkAndGrowWithoutEviction) {
  KvBlockManager m(5, 16);
  ASSERT_TRUE(m.Allocate(1, {}, 16, 15));
  EXPECT_TRUE(m.Grow(1, 17));
  EXPECT_EQ(m.TableBlocks(1), 2);
  EXPECT_TRUE(m.Grow(1, 30));  // still 2 blocks
  EXPECT_EQ(m.TableBlocks(1), 2);
  m.Shrink(1, 16);
  EXPECT_EQ(m.TableBlocks(1), 1);
  // Fill the cache with an evictable block: GrowWithoutEviction must not take it.
  const auto c = Chain({7, 8, 9, 10});
  ASSERT_TRUE(m.Allocate(2, c, 64, 63));
  m.Register(2, c, 64);
  m.Free(2);
  EXPECT_EQ(m.kv_blocks_uncached_free(), 0);
  EXPECT_FALSE(m.GrowWithoutEviction(1, 32));
  EXPECT_EQ(m.evictions(), 0);
  EXPECT_TRUE(m.Grow(1, 32));
  EXPECT_EQ(m.evictions(), 1);
  EXPECT_FALSE(m.Grow(1, 200));  // more than exists: refused, nothing changes
  EXPECT_EQ(m.TableBlocks(1), 2);
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
}

TEST(KvBlockManager, DuplicateComputationKeepsOneCachedCopy) {
  KvBlockManager m(8, 16);
  const auto a = Chain({1, 2});
  ASSERT_TRUE(m.Allocate(1, a, 32, 31));
  ASSERT_TRUE(m.Allocate(2, a, 32, 31));  // nothing registered yet: no reuse
  m.Register(1, a, 32);
  m.Register(2, a, 32);  // same hashes: stays private
  EXPECT_EQ(m.kv_blocks_cached(), 2);
  m.Free(2);
  m.Free(1);
  EXPECT_EQ(m.EvictionOrder().size(), 2u);
  EXPECT_EQ(m.kv_blocks_free(), 8);
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
}

TEST(KvBlockManager, PrefixCachingOffNeverHits) {
  KvBlockManager m(8, 16, /*enable_prefix_caching=*/false);
  const auto a = Chain({1, 2});
  ASSERT_TRUE(m.Allocate(1, a, 32, 31));
  m.Register(1, a, 32);
  m.Free(1);
  EXPECT_EQ(m.CachedPrefixBlocks(a), 0);
  EXPECT_EQ(*m.Allocate(2, a, 32, 31), 0);
}

// A long random workload (allocate with shared prefixes, register, grow, shrink, free) keeps
// every invariant; at the end, with everything freed, no block is in use.
// The LRU order is a queue that blocks leave early by going stale (a hit) and late by being
// evicted: both kinds of dead entries are dropped in bulk once there are many, and the order
// of the live ones must not change.
TEST(KvBlockManager, LruQueueDropsDeadEntriesKeepingTheOrder) {
  const Tokens bt = 16;
  KvBlockManager m(2000, bt);
  std::vector<BlockHash> a;
  for (BlockHash h = 1; h <= 1500; ++h) a.push_back(h * 0x9e3779b97f4a7c15ULL);
  ASSERT_TRUE(m.Allocate(1, a, 1500 * bt, 1500 * bt - 1));
  m.Register(1, a, 1500 * bt);
  m.Free(1);
  // Each use of the chain makes 1,499 entries stale (the hits) and pushes them again.
  for (RequestId id = 2; id <= 4; ++id) {
    ASSERT_EQ(m.Allocate(id, a, 1500 * bt, 1500 * bt - 1), 1499 * bt);
    ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
    m.Free(id);
  }
  std::vector<BlockHash> order(a.rbegin(), a.rend());  // freed tail first
  ASSERT_EQ(m.EvictionOrder(), order);
  // 1,800 new blocks: 500 free ones, then 1,300 evicted from the tail of the chain.
  ASSERT_TRUE(m.Allocate(5, {}, 1800 * bt, 0));
  EXPECT_EQ(m.evictions(), 1300);
  EXPECT_EQ(m.CachedPrefixBlocks(a), 200);
  EXPECT_EQ(m.EvictionOrder(), std::vector<BlockHash>(order.begin() + 1300, order.end()));
  EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
  m.Free(5);
  // The freed blocks are uncached: the 200 cached ones are still the next to be evicted.
  ASSERT_TRUE(m.Allocate(6, {}, 2000 * bt, 0));
  EXPECT_EQ(m.CachedPrefixBlocks(a), 0);
  EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
}

// Cached blocks are found by following a parent's link or through the hash index. A block
// registered after a private copy (its table's previous block duplicated another request's)
// cannot count on that parent staying cached, so it is indexed: found after the parent went.
TEST(KvBlockManager, ABlockRegisteredAfterAPrivateCopyIsFoundAfterItsParentIsEvicted) {
  const Tokens bt = 16;
  KvBlockManager m(6, bt);
  const std::vector<BlockHash> h = {0x1111111111111111ULL, 0x2222222222222222ULL};
  ASSERT_EQ(m.Allocate(1, h, 2 * bt, 2 * bt - 1), 0);
  ASSERT_EQ(m.Allocate(2, h, 2 * bt, 2 * bt - 1), 0);  // before 1 registers: no hits
  m.Register(1, h, bt);                                // h[0] cached in 1's block
  m.Register(2, h, 2 * bt);  // 2's h[0] is a private copy; its h[1] is cached
  EXPECT_EQ(m.kv_blocks_cached(), 2);
  m.Free(1);                                  // 1's h[0] evictable, its second block free
  ASSERT_TRUE(m.Allocate(3, {}, 4 * bt, 0));  // takes every other block: evicts 1's h[0]
  EXPECT_EQ(m.evictions(), 1);
  EXPECT_EQ(m.CachedPrefixBlocks(h), 0);
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
  m.Free(3);
  // A third copy: h[0] is cached again, and h[1] is found (2's), so this copy stays private.
  ASSERT_EQ(m.Allocate(4, h, 2 * bt, 2 * bt - 1), 0);
  m.Register(4, h, 2 * bt);
  EXPECT_EQ(m.kv_blocks_cached(), 2);
  EXPECT_EQ(m.CachedPrefixBlocks(h), 2);
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
  m.Free(2);
  m.Free(4);
  EXPECT_EQ(m.EvictionOrder(), (std::vector<BlockHash>{h[1], h[0]}));  // 4's h[0] freed last
  EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
}

TEST(KvBlockManager, RandomWorkloadKeepsInvariants) {
  KvBlockManager m(64, 4);
  std::mt19937_64 rng(7);
  std::vector<std::pair<RequestId, std::vector<BlockHash>>> live;
  RequestId next = 1;
  for (int step = 0; step < 20000; ++step) {
    const auto op = rng() % 4;
    if (op == 0 || live.empty()) {
      std::vector<BlockHash> hashes;
      const int n = 1 + static_cast<int>(rng() % 8);
      // Few distinct roots and two choices per block: lots of sharing. Chained (mixed) like
      // real block hashes, so that equal hashes mean equal prefixes.
      BlockHash h = rng() % 3;
      for (int i = 0; i < n; ++i) {
        h = (h * 31 + rng() % 2 + 1) * 0x9e3779b97f4a7c15ULL;
        h ^= h >> 29;
        hashes.push_back(h);
      }
      const Tokens tokens = static_cast<Tokens>(n) * 4 + static_cast<Tokens>(rng() % 4);
      if (m.Allocate(next, hashes, tokens, tokens - 1)) live.emplace_back(next, hashes);
      ++next;
    } else {
      const std::size_t k = rng() % live.size();
      auto& [id, hashes] = live[k];
      if (op == 1) {
        m.Register(id, hashes, static_cast<Tokens>(rng() % 40));
      } else if (op == 2) {
        if (rng() % 2) {
          m.Grow(id, static_cast<Tokens>(m.TableBlocks(id) * 4 + rng() % 9));
        } else {
          m.Shrink(id, static_cast<Tokens>(rng() % 40));
        }
      } else {
        m.Free(id);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    if (step % 97 == 0) {
      ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
    }
  }
  for (auto& [id, hashes] : live) m.Free(id);
  ASSERT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
  EXPECT_EQ(m.kv_blocks_used(), 0);
}

TEST(BlockHashIndex, InsertFindEraseWithCollidingSlots) {
  BlockHashIndex index(8);  // 16 slots: keys k*16 + 3 all start at slot 3
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(index.Insert(static_cast<std::uint64_t>(i) * 16 + 3, i));
  EXPECT_FALSE(index.Insert(3, 42));  // present already
  EXPECT_EQ(index.Find(3), 0);
  index.Erase(16 + 3);  // from the middle of the probe run
  EXPECT_EQ(index.Find(16 + 3), BlockHashIndex::kAbsent);
  for (int i = 0; i < 6; ++i) {
    if (i != 1) {
      EXPECT_EQ(index.Find(static_cast<std::uint64_t>(i) * 16 + 3), i) << i;
    }
  }
  // Wrap-around at the end of the table.
  EXPECT_TRUE(index.Insert(15, 100));
  EXPECT_TRUE(index.Insert(31, 101));  // goes past the end to slot 0..
  index.Erase(15);
  EXPECT_EQ(index.Find(31), 101);
  EXPECT_EQ(index.size(), 6u);
}

// Per-block state follows the blocks in use, not the capacity: a small model on a large GPU
// has tens of millions of blocks, and 2^31 - 1 of them (the most an instance can index) took
// 100 GB before. Issue 12.
TEST(KvBlockManagerMemory, CapacityCostsNothingUntilUsed) {
  constexpr std::int64_t kMaxBlocks = 2147483647;
  KvBlockManager m(kMaxBlocks, 16);
  EXPECT_EQ(m.num_blocks(), kMaxBlocks);
  EXPECT_EQ(m.kv_blocks_free(), kMaxBlocks);
  ASSERT_TRUE(m.Allocate(1, {}, 16 * 1000, 0).has_value());
  EXPECT_EQ(m.kv_blocks_used(), 1000);
  EXPECT_EQ(m.Table(1).front(), 0);  // never-used blocks are handed out in id order
  EXPECT_EQ(m.Table(1).back(), 999);
  m.Free(1);
  EXPECT_EQ(m.kv_blocks_free(), kMaxBlocks);
  EXPECT_TRUE(m.CheckInvariants().ok()) << m.CheckInvariants().message();
}

}  // namespace
}  // namespace duet::policies
