// An LRU prefix cache of chained block hashes that requests only pass through: what a
// KvBlockManager's prefix cache holds when each request's table is allocated, registered and
// freed at once (the simulator's pooled reference cache), kept as a radix tree of runs.
//
// Equal contents, equal hits, equal eviction order: that is what tests/policies check against
// the block manager. The cost differs. The block manager keeps every block in a hash index
// and a linked LRU list, so a request of n blocks makes n random accesses or more; here a
// request reads its hashes against runs stored contiguously and makes a few random accesses
// per run it crosses.
//
// Why a tree is exact: with chained hashes a block is cached only if its parent is, and the
// parent is used more recently (a request that uses a block uses its whole prefix, and frees
// its table tail first, so the head is the most recent). All blocks of a run share their last
// use, deeper blocks are older, and so the least recently used block is always the last block
// of a leaf run, the leaf whose last use is oldest.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "common/units.h"
#include "policies/hash_index.h"
#include "policies/request.h"

namespace duet::policies {

class PrefixLru {
 public:
  PrefixLru(std::int64_t num_blocks, Tokens block_tokens);

  // A request of `tokens` tokens whose full blocks are named by `hashes` (chained) passes
  // through: as KvBlockManager Allocate(hashes, tokens, max_hit_tokens = tokens - 1), Register
  // (hashes, tokens), Free. Returns the cached tokens it found (whole blocks, at least one
  // token left to compute), or nullopt, with no change, when its blocks exceed the capacity.
  std::optional<Tokens> Touch(std::span<const BlockHash> hashes, Tokens tokens);

  std::int64_t num_blocks() const { return num_blocks_; }
  std::int64_t cached_blocks() const { return cached_; }
  // Number of leading `hashes` cached. No effect.
  std::int64_t CachedPrefixBlocks(std::span<const BlockHash> hashes) const;
  // Cached blocks, least recently used first (KvBlockManager::EvictionOrder's order).
  std::vector<BlockHash> EvictionOrder() const;

 private:
  using NodeId = std::int32_t;
  static constexpr NodeId kRoot = 0;
  struct Node {
    std::vector<BlockHash> hashes;  // a run of blocks at positions [start, start + size)
    std::int64_t start = 0;
    std::int64_t last_use = 0;
    NodeId parent = -1;
    std::int32_t children = 0;
  };
  // Where a walk from the root along `hashes` stops: `node` holds the last matched block at
  // offset `matched - 1` (the root and 0 when nothing matched), `blocks` matched in all.
  struct Position {
    NodeId node = kRoot;
    std::int64_t matched = 0;
    std::int64_t blocks = 0;
  };
  // Walks along at most `limit` hashes; `path`, if given, receives the nodes passed.
  Position Walk(std::span<const BlockHash> hashes, std::int64_t limit,
                std::vector<NodeId>* path) const;
  // Splits `id` after its first `keep` blocks; the rest (with the children) becomes a child.
  void Split(NodeId id, std::int64_t keep);
  void EvictOldest();
  NodeId NewNode();
  void SetLeaf(NodeId id, bool leaf);

  std::int64_t num_blocks_;
  Tokens block_tokens_;
  std::int64_t cached_ = 0;
  std::int64_t clock_ = 0;
  std::vector<Node> nodes_;  // nodes_[kRoot] holds no blocks
  std::vector<NodeId> free_nodes_;
  BlockHashIndex first_block_;  // first hash of each run -> its node
  // Leaves by last use (no two leaves share one: the nodes a request used form one path).
  std::set<std::pair<std::int64_t, NodeId>> leaves_;
  std::vector<NodeId> path_;  // scratch for Touch
};

}  // namespace duet::policies
