// LRU prefix cache of pass-through requests as a radix tree of runs.
#include "policies/prefix_lru.h"

#include <algorithm>
#include <limits>

#include "common/status.h"

namespace duet::policies {

namespace {
constexpr std::int64_t kInitialNodes = 1024;
}

PrefixLru::PrefixLru(std::int64_t num_blocks, Tokens block_tokens)
    : num_blocks_(num_blocks), block_tokens_(block_tokens), first_block_(kInitialNodes) {
  DUET_CHECK(num_blocks > 0 && block_tokens > 0);
  nodes_.emplace_back();  // the root
}

PrefixLru::Position PrefixLru::Walk(std::span<const BlockHash> hashes, std::int64_t limit,
                                    std::vector<NodeId>* path) const {
  Position at;
  while (at.blocks < limit) {
    const NodeId child = first_block_.Find(hashes[static_cast<std::size_t>(at.blocks)]);
    if (child == BlockHashIndex::kAbsent ||
        nodes_[static_cast<std::size_t>(child)].parent != at.node)
      break;
    const Node& n = nodes_[static_cast<std::size_t>(child)];
    const auto size = static_cast<std::int64_t>(n.hashes.size());
    const std::int64_t room = std::min(size, limit - at.blocks);
    std::int64_t m = 1;  // the first block matched in the index
    while (m < room &&
           n.hashes[static_cast<std::size_t>(m)] == hashes[static_cast<std::size_t>(at.blocks + m)])
      ++m;
    if (path) path->push_back(child);
    at.node = child;
    at.matched = m;
    at.blocks += m;
    if (m < size) break;
  }
  return at;
}

std::int64_t PrefixLru::CachedPrefixBlocks(std::span<const BlockHash> hashes) const {
  return Walk(hashes, static_cast<std::int64_t>(hashes.size()), nullptr).blocks;
}

PrefixLru::NodeId PrefixLru::NewNode() {
  if (!free_nodes_.empty()) {
    const NodeId id = free_nodes_.back();
    free_nodes_.pop_back();
    nodes_[static_cast<std::size_t>(id)] = Node{};
    return id;
  }
  DUET_CHECK(nodes_.size() < static_cast<std::size_t>(std::numeric_limits<NodeId>::max()));
  nodes_.emplace_back();
  return static_cast<NodeId>(nodes_.size() - 1);
}

void PrefixLru::SetLeaf(NodeId id, bool leaf) {
  const Node& n = nodes_[static_cast<std::size_t>(id)];
  if (id == kRoot || n.children > 0) return;
  if (leaf) {
    leaves_.emplace(n.last_use, id);
  } else {
    leaves_.erase({n.last_use, id});
  }
}

void PrefixLru::Split(NodeId id, std::int64_t keep) {
  // The new node takes the head, so the children need no new parent: `id` keeps the tail.
  const NodeId head = NewNode();
  Node& h = nodes_[static_cast<std::size_t>(head)];
  Node& t = nodes_[static_cast<std::size_t>(id)];
  h.hashes.assign(t.hashes.begin(), t.hashes.begin() + keep);
  t.hashes.erase(t.hashes.begin(), t.hashes.begin() + keep);
  h.start = t.start;
  t.start += keep;
  h.last_use = t.last_use;
  h.parent = t.parent;
  h.children = 1;
  t.parent = head;
  first_block_.Erase(h.hashes.front());
  first_block_.InsertGrowing(h.hashes.front(), head);
  first_block_.InsertGrowing(t.hashes.front(), id);
}

void PrefixLru::EvictOldest() {
  DUET_CHECK(!leaves_.empty());
  const NodeId id = leaves_.begin()->second;
  Node& n = nodes_[static_cast<std::size_t>(id)];
  --cached_;
  if (n.hashes.size() > 1) {
    n.hashes.pop_back();
    return;
  }
  leaves_.erase(leaves_.begin());
  first_block_.Erase(n.hashes.front());
  n.hashes.clear();
  const NodeId parent = n.parent;
  free_nodes_.push_back(id);
  if (--nodes_[static_cast<std::size_t>(parent)].children == 0) SetLeaf(parent, true);
}

std::optional<Tokens> PrefixLru::Touch(std::span<const BlockHash> hashes, Tokens tokens) {
  const std::int64_t total = (tokens + block_tokens_ - 1) / block_tokens_;
  if (total > num_blocks_) return std::nullopt;
  const auto size = static_cast<std::int64_t>(hashes.size());
  const std::int64_t limit = std::min(size, std::max<Tokens>(0, tokens - 1) / block_tokens_);
  path_.clear();
  Position at = Walk(hashes, limit, &path_);
  // The hits are whole nodes: split the last where the walk stopped inside it.
  if (at.node != kRoot &&
      at.matched <
          static_cast<std::int64_t>(nodes_[static_cast<std::size_t>(at.node)].hashes.size())) {
    Split(at.node, at.matched);
    at.node = nodes_[static_cast<std::size_t>(at.node)].parent;
    path_.back() = at.node;
  }
  // Used now: only the last node of the path can be a leaf.
  ++clock_;
  for (NodeId id : path_) {
    SetLeaf(id, false);
    nodes_[static_cast<std::size_t>(id)].last_use = clock_;
    SetLeaf(id, true);
  }
  // The table's other blocks come from free capacity, then from the least recently used
  // blocks; the hits, used last of all, are never among them.
  const std::int64_t hits = at.blocks;
  const std::int64_t take = total - hits - (num_blocks_ - cached_);
  for (std::int64_t k = 0; k < take; ++k) EvictOldest();
  // Its full, hashed blocks are cached, unless the next one is already (a hit the limit cut
  // off: the table's copy stays private, and with chained hashes nothing can follow it).
  const std::int64_t upto = std::min({tokens / block_tokens_, size, total});
  if (upto <= hits ||
      first_block_.Find(hashes[static_cast<std::size_t>(hits)]) != BlockHashIndex::kAbsent)
    return hits * block_tokens_;
  const std::span<const BlockHash> fresh =
      hashes.subspan(static_cast<std::size_t>(hits), static_cast<std::size_t>(upto - hits));
  cached_ += upto - hits;
  if (at.node != kRoot && nodes_[static_cast<std::size_t>(at.node)].children == 0) {
    // The run continues its last node (a leaf, used now): no new node.
    Node& n = nodes_[static_cast<std::size_t>(at.node)];
    n.hashes.insert(n.hashes.end(), fresh.begin(), fresh.end());
    return hits * block_tokens_;
  }
  SetLeaf(at.node, false);
  ++nodes_[static_cast<std::size_t>(at.node)].children;
  const NodeId id = NewNode();
  Node& n = nodes_[static_cast<std::size_t>(id)];
  n.hashes.assign(fresh.begin(), fresh.end());
  n.start = hits;
  n.last_use = clock_;
  n.parent = at.node;
  first_block_.InsertGrowing(fresh.front(), id);
  SetLeaf(id, true);
  return hits * block_tokens_;
}

std::vector<BlockHash> PrefixLru::EvictionOrder() const {
  // Last use, then deeper first (a table is freed tail first).
  std::vector<std::pair<std::pair<std::int64_t, std::int64_t>, BlockHash>> blocks;
  for (std::size_t i = 1; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    for (std::size_t j = 0; j < n.hashes.size(); ++j)
      blocks.push_back({{n.last_use, -(n.start + static_cast<std::int64_t>(j))}, n.hashes[j]});
  }
  std::sort(blocks.begin(), blocks.end());
  std::vector<BlockHash> order;
  for (const auto& b : blocks) order.push_back(b.second);
  return order;
}

}  // namespace duet::policies
