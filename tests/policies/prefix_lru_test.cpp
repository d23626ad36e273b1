// PrefixLru against the block manager it stands in for: the same hits, the same refusals and
// the same contents in the same eviction order, request after request, under random traffic
// with shared prefixes, partial blocks, unhashed tails and heavy eviction.
#include "policies/prefix_lru.h"

#include <gtest/gtest.h>

#include <random>

#include "policies/block_manager.h"

namespace duet::policies {
namespace {

// What the simulator's pooled reference did with the block manager for each request.
std::optional<Tokens> PassThrough(KvBlockManager& m, RequestId id,
                                  std::span<const BlockHash> hashes, Tokens tokens) {
  const auto hit = m.Allocate(id, hashes, tokens, tokens - 1);
  if (!hit) return std::nullopt;
  m.Register(id, hashes, tokens);
  m.Free(id);
  return hit;
}

std::uint64_t Mix(std::uint64_t x) {  // splitmix64: chained hashes must be well mixed
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

TEST(PrefixLru, SplitsRunsWhereAShorterPrefixIsUsedAndEvictsTheOlderTail) {
  PrefixLru lru(6, 16);
  const std::vector<BlockHash> a = {Mix(1), Mix(2), Mix(3), Mix(4)};
  EXPECT_EQ(lru.Touch(a, 64), 0);  // 4 blocks, cached whole (the last block is full)
  EXPECT_EQ(lru.cached_blocks(), 4);
  // Uses the first two again, then two blocks of its own: a's tail is now the oldest.
  const std::vector<BlockHash> b = {a[0], a[1], Mix(5), Mix(6)};
  EXPECT_EQ(lru.Touch(b, 64), 32);
  EXPECT_EQ(lru.cached_blocks(), 6);
  EXPECT_EQ(lru.EvictionOrder(), (std::vector<BlockHash>{a[3], a[2], b[3], b[2], a[1], a[0]}));
  // Two new blocks evict a's tail, its last block first.
  const std::vector<BlockHash> c = {Mix(7), Mix(8)};
  EXPECT_EQ(lru.Touch(c, 32), 0);
  EXPECT_EQ(lru.CachedPrefixBlocks(a), 2);
  EXPECT_EQ(lru.CachedPrefixBlocks(b), 4);
  // At least one token is computed: a full-length hit stops one block short.
  EXPECT_EQ(lru.Touch(b, 64), 48);
  // More blocks than the capacity: refused, nothing changes.
  const auto before = lru.EvictionOrder();
  EXPECT_EQ(lru.Touch(b, 7 * 16), std::nullopt);
  EXPECT_EQ(lru.EvictionOrder(), before);
}

// Random requests: each continues a prefix of an earlier one (or starts afresh) and adds blocks
// of its own; token counts leave partial blocks, and some hashes stop short of the prompt.
TEST(PrefixLru, MatchesTheBlockManagerUnderRandomTraffic) {
  for (const std::int64_t capacity : {8, 40, 300}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    std::mt19937_64 rng(static_cast<std::uint64_t>(capacity));
    const Tokens bt = 16;
    KvBlockManager manager(capacity, bt);
    PrefixLru lru(capacity, bt);
    std::vector<std::vector<BlockHash>> seen;
    std::uint64_t fresh = 1;
    for (RequestId id = 1; id <= 3000; ++id) {
      std::vector<BlockHash> hashes;
      if (!seen.empty() && rng() % 4 != 0) {
        const auto& parent = seen[rng() % seen.size()];
        hashes.assign(parent.begin(),
                      parent.begin() + static_cast<std::ptrdiff_t>(rng() % (parent.size() + 1)));
      }
      // Some repeat an earlier prefix exactly (a full hit, cut one block short).
      const std::uint64_t own = rng() % 8 == 0 ? 0 : rng() % (capacity / 2 + 3);
      for (std::uint64_t k = 0; k < own; ++k)
        hashes.push_back(Mix((hashes.empty() ? 0 : hashes.back()) ^ Mix(fresh++)));
      const auto full = static_cast<Tokens>(hashes.size());
      Tokens tokens = full * bt + (rng() % 4 == 0 ? 0 : static_cast<Tokens>(rng() % bt));
      if (tokens == 0) tokens = 1;
      std::span<const BlockHash> named = hashes;
      if (rng() % 5 == 0 && !hashes.empty()) named = named.first(rng() % hashes.size());
      const auto expected = PassThrough(manager, id, named, tokens);
      ASSERT_EQ(lru.Touch(named, tokens), expected) << "request " << id;
      ASSERT_EQ(lru.cached_blocks(), manager.kv_blocks_cached()) << "request " << id;
      ASSERT_EQ(lru.EvictionOrder(), manager.EvictionOrder()) << "request " << id;
      seen.push_back(std::move(hashes));
    }
    EXPECT_GT(manager.evictions(), 1000);  // the eviction order was exercised
  }
}

}  // namespace
}  // namespace duet::policies
