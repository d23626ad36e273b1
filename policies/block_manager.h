// Paged KV block manager of one instance: fixed-size blocks, a prefix cache keyed by chained
// block hashes with reference counts, and LRU eviction of unreferenced cached blocks.
// Owns each request's block table. Not thread-safe: one engine loop drives it.
//
// Hashes must chain (policies/block_hash.h): equal hashes at a position mean equal prefixes.
// The cache is then a tree, and it is kept as one: a cached block links to one cached child
// (the block registered after it in the same table, typically), and only the blocks no parent
// links to are in the hash index. A request's blocks are found by following links from its
// first block, and registering or evicting a linked block touches no index.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "policies/hash_index.h"
#include "policies/request.h"

namespace duet::policies {

// One change of a GPU prefix cache's contents (a KV event): a block that became reusable
// (stored) or a cached block that was evicted. In order, they feed write-back to the lower
// tiers and a router's view of the cache in another thread or process.
struct KvCacheEvent {
  BlockHash hash = 0;
  bool stored = false;  // false: evicted
  // The instance's block that holds it (stored) or held it until now (evicted): what a
  // write-back to a lower tier copies. Local to the instance: routers read the hash only.
  std::int32_t block = -1;
};

class KvBlockManager {
 public:
  using BlockId = std::int32_t;

  KvBlockManager(std::int64_t num_blocks, Tokens block_tokens, bool enable_prefix_caching = true);

  // Number of leading `hashes` whose blocks are cached here (in use or evictable). No effect.
  std::int64_t CachedPrefixBlocks(std::span<const BlockHash> hashes) const;

  // Allocates a table covering `tokens` tokens for `request`, reusing cached prefix blocks of
  // `hashes` (at most `max_hit_tokens` tokens of them, rounded down to blocks). Returns the
  // reused (cached) tokens, or nullopt with no change when blocks run out.
  // The request must not hold a table already.
  // `reserve_blocks` more blocks than the allocation takes must remain free (a watermark).
  std::optional<Tokens> Allocate(RequestId request, std::span<const BlockHash> hashes,
                                 Tokens tokens, Tokens max_hit_tokens,
                                 std::int64_t reserve_blocks = 0);
  // Blocks a new table for `tokens` would take from the free pool after prefix reuse.
  std::int64_t BlocksNeeded(std::span<const BlockHash> hashes, Tokens tokens,
                            Tokens max_hit_tokens) const;

  // Grows the request's table to cover `tokens`. False, with no change, when blocks run out.
  bool Grow(RequestId request, Tokens tokens);
  // Grows only with never-cached free blocks, evicting nothing. False with no change if short.
  bool GrowWithoutEviction(RequestId request, Tokens tokens);
  // Returns table blocks past those needed for `tokens` (never-registered tail blocks only).
  void Shrink(RequestId request, Tokens tokens);

  // Publishes the request's first `computed_tokens / block_tokens` full blocks (named by
  // `hashes`) in the prefix cache so later requests can reuse them.
  void Register(RequestId request, std::span<const BlockHash> hashes, Tokens computed_tokens);

  // Drops the request's references. Blocks reaching zero references become evictable
  // (if cached, most recently used; the table's tail is evicted before its head) or free.
  void Free(RequestId request);

  // One more reference on each of `blocks` (in use), for a step in flight that reads or writes
  // them: none is reused before Unpin, whatever happens to the tables meanwhile. At most 255
  // pins per block.
  void Pin(std::span<const BlockId> blocks);
  void Unpin(std::span<const BlockId> blocks);
  // Whether `block` is in use (referenced by a table or a pin); whether it is in the prefix
  // cache (its contents are those of its hash, shared by any table that holds it).
  bool InUse(BlockId block) const;
  bool Cached(BlockId block) const;

  // Calls fn(request, table) for every table (checks).
  template <typename F>
  void ForEachTable(F&& fn) const {
    for (const auto& [request, entry] : tables_)
      fn(request, std::span<const BlockId>(entry.blocks));
  }
  bool HasTable(RequestId request) const { return tables_.count(request) != 0; }
  std::int64_t TableBlocks(RequestId request) const;
  std::span<const BlockId> Table(RequestId request) const;

  std::int64_t num_blocks() const { return num_blocks_; }
  Tokens block_tokens() const { return block_tokens_; }
  // Blocks that an allocation can take: never-used/freed ones plus evictable cached ones.
  std::int64_t kv_blocks_free() const { return kv_blocks_uncached_free() + lru_size(); }
  std::int64_t kv_blocks_uncached_free() const {
    return static_cast<std::int64_t>(free_list_.size()) + num_blocks_ -
           static_cast<std::int64_t>(blocks_.size());
  }
  std::int64_t kv_blocks_used() const { return num_blocks() - kv_blocks_free(); }
  std::int64_t kv_blocks_cached() const { return num_cached_; }
  std::int64_t evictions() const { return evictions_; }
  double usage() const {
    return num_blocks() ? static_cast<double>(kv_blocks_used()) / num_blocks() : 0.0;
  }
  Tokens BlocksToTokens(std::int64_t blocks) const { return blocks * block_tokens_; }
  std::int64_t TokensToBlocks(Tokens tokens) const {
    return (tokens + block_tokens_ - 1) / block_tokens_;
  }

  // Full consistency check: every block is in exactly one of {free list, LRU, in use}; the
  // reference counts equal the table references and pins; the cache index points at blocks holding
  // those hashes; each cached block is indexed or linked from a cached block, and no hash is
  // cached twice; no free block is cached; the LRU queue holds each evictable block once.
  // Returns the first violation found.
  Status CheckInvariants() const;

  // When set, every block published in the prefix cache (Register) and every cached block
  // evicted from now on is appended to `log`. The caller drains it.
  void set_event_log(std::vector<KvCacheEvent>* log) { event_log_ = log; }

  // Evictable cached blocks, least recently used first (for tests of eviction order).
  std::vector<BlockHash> EvictionOrder() const;

 private:
  struct Block {
    BlockHash hash = 0;
    std::int32_t ref_count = 0;
    std::uint32_t lru_push = 0;  // times pushed on the LRU queue: names its entry there
    BlockId child = -1;          // a cached child, if this is cached (may have been evicted since)
    bool cached = false;         // in the prefix cache: indexed, or linked as a parent's child
    bool indexed = false;        // in cached_
    bool in_lru = false;         // evictable: ref_count == 0 && cached
    std::uint8_t pins = 0;       // references of steps in flight (Pin), in ref_count
  };
  // The LRU order is a queue of pushes. A block leaving it early (reused by a hit) leaves a
  // stale entry behind, skipped when reached: the queue is an array, so an eviction reads the
  // next victims' records ahead instead of chasing a linked list's scattered nodes.
  struct LruEntry {
    BlockId id;
    std::uint32_t push;  // the entry is live while blocks_[id] is in the LRU with this push
  };
  struct TableEntry {
    std::vector<BlockId> blocks;
    std::int64_t registered = 0;  // leading blocks already offered to the cache
  };

  // The cached blocks holding the leading `hashes` (at most `limit`), into hit_ids_.
  void WalkCached(std::span<const BlockHash> hashes, std::size_t limit) const;
  // The cached block holding `hash`, whose parent is the cached block `parent` (-1: the root),
  // or -1.
  BlockId CachedChild(BlockId parent, BlockHash hash) const {
    if (parent >= 0) {
      const BlockId c = blocks_[static_cast<std::size_t>(parent)].child;
      if (c >= 0) {
        const Block& b = blocks_[static_cast<std::size_t>(c)];
        if (b.cached && b.hash == hash) return c;
      }
    }
    return cached_.Find(hash);
  }
  // Appends `n` blocks, each with one reference: released ones (last released first), never
  // used ones in id order, then the least recently used cached ones. Requires them.
  void TakeBlocks(std::int64_t n, std::vector<BlockId>* out);
  // Appends the `n` least recently used cached blocks, evicted. Requires them.
  void Evict(std::int64_t n, std::vector<BlockId>* out);
  void Prefetch(BlockId id) const { __builtin_prefetch(&blocks_[static_cast<std::size_t>(id)]); }
  void LruPushBack(BlockId id);
  void LruRemove(BlockId id);  // leaves a stale entry
  void CompactLru();           // drops spent and, when they are many, stale entries
  bool Live(const LruEntry& e) const {
    const Block& b = blocks_[static_cast<std::size_t>(e.id)];
    return b.in_lru && b.lru_push == e.push;
  }
  std::int64_t lru_size() const {
    return static_cast<std::int64_t>(lru_.size() - lru_head_) - lru_stale_;
  }
  void Release(BlockId id);  // drops one reference

  // Per-block state exists only for blocks used at least once (ids below blocks_.size()), so
  // memory follows the blocks in use, not the capacity: a small model on a large GPU has tens
  // of millions of blocks. Ids from blocks_.size() to num_blocks_ are free and never used.
  static constexpr std::int64_t kInitialIndexEntries = 1024;
  std::int64_t num_blocks_;
  std::vector<Block> blocks_;
  std::vector<BlockId> free_list_;  // released blocks, taken before never-used ones
  BlockHashIndex cached_;           // cached blocks that no parent links to
  std::int64_t num_cached_ = 0;
  mutable std::vector<BlockId> hit_ids_;  // scratch for WalkCached
  std::unordered_map<RequestId, TableEntry> tables_;
  std::vector<LruEntry> lru_;  // entries before lru_head_ are spent
  std::size_t lru_head_ = 0;
  std::int64_t lru_stale_ = 0;  // stale entries at or after lru_head_
  std::int64_t evictions_ = 0;
  std::vector<KvCacheEvent>* event_log_ = nullptr;
  Tokens block_tokens_;
  bool enable_prefix_caching_;
};

}  // namespace duet::policies
