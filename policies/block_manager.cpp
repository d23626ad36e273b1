// Paged KV block manager with a reference-counted prefix cache and LRU eviction.
#include "policies/block_manager.h"

#include <algorithm>
#include <limits>
#include <string>

namespace duet::policies {

KvBlockManager::KvBlockManager(std::int64_t num_blocks, Tokens block_tokens,
                               bool enable_prefix_caching)
    : num_blocks_(num_blocks),
      cached_(std::min<std::int64_t>(num_blocks, kInitialIndexEntries)),
      block_tokens_(block_tokens),
      enable_prefix_caching_(enable_prefix_caching) {
  DUET_CHECK(num_blocks > 0 && num_blocks <= std::numeric_limits<BlockId>::max() &&
             block_tokens > 0);
}

namespace {
// How many iterations ahead the per-block loops prefetch: the blocks' records are scattered
// (cache misses), the loops' iterations otherwise independent.
constexpr std::size_t kAhead = 8;
// Dead LRU queue entries are dropped in bulk once there are at least this many.
constexpr std::int64_t kMinDeadEntries = 1024;
}  // namespace

std::int64_t KvBlockManager::CachedPrefixBlocks(std::span<const BlockHash> hashes) const {
  if (!enable_prefix_caching_) return 0;
  WalkCached(hashes, hashes.size());
  return static_cast<std::int64_t>(hit_ids_.size());
}

void KvBlockManager::WalkCached(std::span<const BlockHash> hashes, std::size_t limit) const {
  hit_ids_.clear();
  limit = std::min(limit, hashes.size());
  for (BlockId at = -1; hit_ids_.size() < limit;) {
    at = CachedChild(at, hashes[hit_ids_.size()]);
    if (at < 0) break;
    hit_ids_.push_back(at);
  }
}

std::int64_t KvBlockManager::BlocksNeeded(std::span<const BlockHash> hashes, Tokens tokens,
                                          Tokens max_hit_tokens) const {
  hit_ids_.clear();
  if (enable_prefix_caching_)
    WalkCached(hashes,
               static_cast<std::size_t>(std::max<Tokens>(0, max_hit_tokens) / block_tokens_));
  // Hit blocks that sit in the LRU stop being available once referenced.
  std::int64_t hit_evictable = 0;
  for (BlockId id : hit_ids_) hit_evictable += blocks_[static_cast<std::size_t>(id)].ref_count == 0;
  return TokensToBlocks(tokens) - static_cast<std::int64_t>(hit_ids_.size()) + hit_evictable;
}

std::optional<Tokens> KvBlockManager::Allocate(RequestId request, std::span<const BlockHash> hashes,
                                               Tokens tokens, Tokens max_hit_tokens,
                                               std::int64_t reserve_blocks) {
  DUET_CHECK_MSG(!HasTable(request), "request " + std::to_string(request) + " already has blocks");
  // BlocksNeeded leaves the hits in hit_ids_ for the allocation below.
  if (BlocksNeeded(hashes, tokens, max_hit_tokens) + reserve_blocks > kv_blocks_free())
    return std::nullopt;
  const std::int64_t total = TokensToBlocks(tokens);
  const auto hit = static_cast<std::int64_t>(hit_ids_.size());
  TableEntry entry;
  entry.blocks.reserve(static_cast<std::size_t>(total));
  // Reference the hit blocks first so that eviction for the new blocks cannot take them.
  for (std::size_t i = 0; i < hit_ids_.size(); ++i) {
    if (i + kAhead < hit_ids_.size()) Prefetch(hit_ids_[i + kAhead]);
    const BlockId id = hit_ids_[i];
    Block& b = blocks_[static_cast<std::size_t>(id)];
    if (b.ref_count == 0) LruRemove(id);
    ++b.ref_count;
    entry.blocks.push_back(id);
  }
  entry.registered = hit;
  TakeBlocks(total - hit, &entry.blocks);
  tables_.emplace(request, std::move(entry));
  return BlocksToTokens(hit);
}

bool KvBlockManager::Grow(RequestId request, Tokens tokens) {
  TableEntry& entry = tables_.at(request);
  const std::int64_t need = TokensToBlocks(tokens) - static_cast<std::int64_t>(entry.blocks.size());
  if (need <= 0) return true;
  if (need > kv_blocks_free()) return false;
  TakeBlocks(need, &entry.blocks);
  return true;
}

bool KvBlockManager::GrowWithoutEviction(RequestId request, Tokens tokens) {
  const TableEntry& entry = tables_.at(request);
  const std::int64_t need = TokensToBlocks(tokens) - static_cast<std::int64_t>(entry.blocks.size());
  if (need > kv_blocks_uncached_free()) return false;
  return Grow(request, tokens);  // takes uncached free blocks first, so nothing is evicted
}

void KvBlockManager::Shrink(RequestId request, Tokens tokens) {
  TableEntry& entry = tables_.at(request);
  const std::size_t keep = static_cast<std::size_t>(TokensToBlocks(tokens));
  while (entry.blocks.size() > keep &&
         static_cast<std::int64_t>(entry.blocks.size()) > entry.registered) {
    Release(entry.blocks.back());
    entry.blocks.pop_back();
  }
}

void KvBlockManager::Register(RequestId request, std::span<const BlockHash> hashes,
                              Tokens computed_tokens) {
  if (!enable_prefix_caching_) return;
  TableEntry& entry = tables_.at(request);
  const std::int64_t upto = std::min<std::int64_t>(
      {computed_tokens / block_tokens_, static_cast<std::int64_t>(hashes.size()),
       static_cast<std::int64_t>(entry.blocks.size())});
  for (std::int64_t i = entry.registered; i < upto; ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (k + kAhead < static_cast<std::size_t>(upto)) Prefetch(entry.blocks[k + kAhead]);
    const BlockHash h = hashes[k];
    const BlockId id = entry.blocks[k];
    if (blocks_[static_cast<std::size_t>(id)].cached) continue;
    // The cached block of the previous position: normally this table's, which this request
    // holds, so it outlives the new block in the cache (released after it, used whenever it
    // is) and may link to it. If this table's is a private copy, the new block is indexed.
    BlockId parent = -1;
    bool link = false;
    if (k > 0) {
      parent = entry.blocks[k - 1];
      const Block& p = blocks_[static_cast<std::size_t>(parent)];
      link = p.cached && p.hash == hashes[k - 1];
      if (!link) {
        WalkCached(hashes, k);
        parent = hit_ids_.size() == k ? hit_ids_.back() : -1;
      }
    }
    // Another request computed the same block concurrently: keep the first copy cached; this
    // one stays private and returns to the free list when released.
    if (CachedChild(parent, h) >= 0) continue;
    Block& b = blocks_[static_cast<std::size_t>(id)];
    b.hash = h;
    b.cached = true;
    ++num_cached_;
    if (link) {
      BlockId& child = blocks_[static_cast<std::size_t>(parent)].child;
      link = child < 0 || !blocks_[static_cast<std::size_t>(child)].cached;
      if (link) child = id;
    }
    if (!link) {
      cached_.InsertGrowing(h, id);
      b.indexed = true;
    }
    if (event_log_) event_log_->push_back({h, true, id});
  }
  entry.registered = std::max(entry.registered, upto);
}

void KvBlockManager::Free(RequestId request) {
  auto it = tables_.find(request);
  if (it == tables_.end()) return;
  // Tail first: the tail of a prompt is the least likely to be shared, so it is evicted first.
  const std::vector<BlockId>& blocks = it->second.blocks;
  for (std::size_t i = blocks.size(); i-- > 0;) {
    if (i >= kAhead) Prefetch(blocks[i - kAhead]);
    Release(blocks[i]);
  }
  tables_.erase(it);
}

std::int64_t KvBlockManager::TableBlocks(RequestId request) const {
  auto it = tables_.find(request);
  return it == tables_.end() ? 0 : static_cast<std::int64_t>(it->second.blocks.size());
}

std::span<const KvBlockManager::BlockId> KvBlockManager::Table(RequestId request) const {
  auto it = tables_.find(request);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

void KvBlockManager::TakeBlocks(std::int64_t n, std::vector<BlockId>* out) {
  // The order TakeBlock gives one at a time, in bulk: released blocks (last released
  // first), never-used ones in id order, then evictions.
  const std::size_t start = out->size();
  const auto released = static_cast<std::size_t>(
      std::min<std::int64_t>(n, static_cast<std::int64_t>(free_list_.size())));
  out->insert(out->end(), free_list_.rbegin(),
              free_list_.rbegin() + static_cast<std::ptrdiff_t>(released));
  free_list_.resize(free_list_.size() - released);
  const std::int64_t fresh =
      std::min<std::int64_t>(n - static_cast<std::int64_t>(released),
                             num_blocks_ - static_cast<std::int64_t>(blocks_.size()));
  for (std::int64_t k = 0; k < fresh; ++k) out->push_back(static_cast<BlockId>(blocks_.size() + k));
  blocks_.resize(blocks_.size() + static_cast<std::size_t>(fresh));
  Evict(n - static_cast<std::int64_t>(released) - fresh, out);
  for (std::size_t i = start; i < out->size(); ++i) {
    if (i + kAhead < out->size()) Prefetch((*out)[i + kAhead]);
    blocks_[static_cast<std::size_t>((*out)[i])].ref_count = 1;
  }
}

void KvBlockManager::Evict(std::int64_t n, std::vector<BlockId>* out) {
  if (n <= 0) return;
  DUET_CHECK(n <= lru_size());
  // Victims in queue order, their records loaded ahead; then they leave the cache.
  const std::size_t first = out->size();
  std::size_t i = lru_head_;
  for (std::int64_t taken = 0; taken < n; ++i) {
    if (i + kAhead < lru_.size()) Prefetch(lru_[i + kAhead].id);
    const LruEntry& e = lru_[i];
    if (!Live(e)) {
      --lru_stale_;
      continue;
    }
    blocks_[static_cast<std::size_t>(e.id)].in_lru = false;
    out->push_back(e.id);
    ++taken;
  }
  lru_head_ = i;
  for (std::size_t k = first; k < out->size(); ++k) {
    Block& b = blocks_[static_cast<std::size_t>((*out)[k])];
    // A linked block goes before its parent, whose link then names a block that no longer
    // holds that hash: links are checked when followed, so nothing needs unlinking.
    if (b.indexed) cached_.Erase(b.hash);
    if (event_log_) event_log_->push_back({b.hash, false, (*out)[k]});
    b.hash = 0;
    b.child = -1;
    b.cached = b.indexed = false;
  }
  num_cached_ -= n;
  evictions_ += n;
  CompactLru();
}

void KvBlockManager::Release(BlockId id) {
  Block& b = blocks_[static_cast<std::size_t>(id)];
  DUET_CHECK(b.ref_count > 0);
  if (--b.ref_count > 0) return;
  if (b.cached) {
    LruPushBack(id);
  } else {
    free_list_.push_back(id);
  }
}

void KvBlockManager::Pin(std::span<const BlockId> blocks) {
  for (const BlockId id : blocks) {
    Block& b = blocks_[static_cast<std::size_t>(id)];
    DUET_CHECK(b.ref_count > 0 && b.pins < 255);
    ++b.ref_count;
    ++b.pins;
  }
}

void KvBlockManager::Unpin(std::span<const BlockId> blocks) {
  for (const BlockId id : blocks) {
    Block& b = blocks_[static_cast<std::size_t>(id)];
    DUET_CHECK(b.pins > 0);
    --b.pins;
    Release(id);
  }
}

bool KvBlockManager::InUse(BlockId block) const {
  return block >= 0 && static_cast<std::size_t>(block) < blocks_.size() &&
         blocks_[static_cast<std::size_t>(block)].ref_count > 0;
}

bool KvBlockManager::Cached(BlockId block) const {
  return block >= 0 && static_cast<std::size_t>(block) < blocks_.size() &&
         blocks_[static_cast<std::size_t>(block)].cached;
}

void KvBlockManager::LruPushBack(BlockId id) {
  Block& b = blocks_[static_cast<std::size_t>(id)];
  DUET_CHECK(!b.in_lru);
  b.in_lru = true;
  lru_.push_back({id, ++b.lru_push});
}

void KvBlockManager::LruRemove(BlockId id) {
  Block& b = blocks_[static_cast<std::size_t>(id)];
  DUET_CHECK(b.in_lru);
  b.in_lru = false;
  ++lru_stale_;
  CompactLru();
}

void KvBlockManager::CompactLru() {
  // Spent entries go once they are most of the array; stale ones once they outnumber the live
  // ones. Either way each entry is moved O(1) times on average.
  const std::size_t pending = lru_.size() - lru_head_;
  if (lru_head_ > pending && static_cast<std::int64_t>(lru_head_) > kMinDeadEntries) {
    lru_.erase(lru_.begin(), lru_.begin() + static_cast<std::ptrdiff_t>(lru_head_));
    lru_head_ = 0;
  }
  if (lru_stale_ > std::max(lru_size(), kMinDeadEntries)) {
    std::size_t kept = 0;
    for (std::size_t i = lru_head_; i < lru_.size(); ++i) {
      if (i + kAhead < lru_.size()) Prefetch(lru_[i + kAhead].id);
      if (Live(lru_[i])) lru_[kept++] = lru_[i];
    }
    lru_.resize(kept);
    lru_head_ = 0;
    lru_stale_ = 0;
  }
}

Status KvBlockManager::CheckInvariants() const {
  const std::size_t n = blocks_.size();
  std::vector<std::int32_t> refs(n, 0);
  for (const auto& [req, entry] : tables_) {
    for (BlockId id : entry.blocks) {
      if (id < 0 || static_cast<std::size_t>(id) >= n)
        return Status::Error("request " + std::to_string(req) + " holds invalid block " +
                             std::to_string(id));
      ++refs[static_cast<std::size_t>(id)];
    }
  }
  std::vector<char> in_free(n, 0);
  for (BlockId id : free_list_) {
    if (in_free[static_cast<std::size_t>(id)]++)
      return Status::Error("block " + std::to_string(id) + " is twice in the free list");
  }
  std::vector<char> queued(n, 0);
  std::int64_t stale = 0;
  for (std::size_t i = lru_head_; i < lru_.size(); ++i) {
    const LruEntry& e = lru_[i];
    if (e.id < 0 || static_cast<std::size_t>(e.id) >= n)
      return Status::Error("LRU queue holds invalid block " + std::to_string(e.id));
    if (!Live(e)) {
      ++stale;
    } else if (queued[static_cast<std::size_t>(e.id)]++) {
      return Status::Error("block " + std::to_string(e.id) + " is live twice in the LRU queue");
    }
  }
  if (stale != lru_stale_) return Status::Error("LRU stale count does not match its queue");
  // Cached blocks that a cached parent links to; hashes of all cached blocks.
  std::vector<char> linked(n, 0);
  std::vector<BlockHash> hashes;
  for (std::size_t i = 0; i < n; ++i) {
    const Block& b = blocks_[i];
    if (!b.cached) continue;
    hashes.push_back(b.hash);
    if (b.child < 0) continue;
    if (static_cast<std::size_t>(b.child) >= n)
      return Status::Error("block " + std::to_string(i) + " links to invalid block " +
                           std::to_string(b.child));
    linked[static_cast<std::size_t>(b.child)] = 1;
  }
  std::sort(hashes.begin(), hashes.end());
  if (std::adjacent_find(hashes.begin(), hashes.end()) != hashes.end())
    return Status::Error("a hash is cached in two blocks");
  if (static_cast<std::int64_t>(hashes.size()) != num_cached_)
    return Status::Error("the cached block count does not match the blocks");
  std::int64_t used = 0, lru = 0, free_count = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Block& b = blocks_[i];
    const std::string name = "block " + std::to_string(i);
    if (b.ref_count != refs[i] + b.pins)
      return Status::Error(name + " has ref_count " + std::to_string(b.ref_count) + " but " +
                           std::to_string(refs[i]) + " table references and " +
                           std::to_string(b.pins) + " pins");
    const int places = (b.ref_count > 0) + (b.in_lru ? 1 : 0) + (in_free[i] ? 1 : 0);
    if (places != 1)
      return Status::Error(name + " is in " + std::to_string(places) +
                           " of {in use, LRU, free list} (leaked or double-counted)");
    if (b.in_lru && !b.cached) return Status::Error(name + " is in the LRU but not cached");
    if (b.in_lru != (queued[i] != 0))
      return Status::Error(name + (b.in_lru ? " is evictable but not queued in the LRU"
                                            : " is queued in the LRU but not evictable"));
    if (in_free[i] && b.cached) return Status::Error(name + " is free but still cached");
    if (b.indexed && (!b.cached || cached_.Find(b.hash) != static_cast<BlockId>(i)))
      return Status::Error(name + " is marked indexed but the index does not point at it");
    if (b.cached && !b.indexed && !linked[i])
      return Status::Error(name + " is cached but neither indexed nor linked from a block");
    used += b.ref_count > 0;
    lru += b.in_lru;
    free_count += in_free[i];
  }
  Status index_status;
  cached_.ForEach([&](BlockHash hash, BlockId id) {
    const Block& b = blocks_[static_cast<std::size_t>(id)];
    if (index_status.ok() && (!b.indexed || b.hash != hash))
      index_status = Status::Error("cache index entry points at block " + std::to_string(id) +
                                   " which does not hold that hash");
  });
  DUET_RETURN_IF_ERROR(index_status);
  // Blocks past blocks_ were never used: free.
  if (used + lru + free_count != static_cast<std::int64_t>(n) ||
      static_cast<std::int64_t>(n) > num_blocks_)
    return Status::Error("block counts do not add up");
  return Status::Ok();
}

std::vector<BlockHash> KvBlockManager::EvictionOrder() const {
  std::vector<BlockHash> order;
  for (std::size_t i = lru_head_; i < lru_.size(); ++i) {
    if (Live(lru_[i])) order.push_back(blocks_[static_cast<std::size_t>(lru_[i].id)].hash);
  }
  return order;
}

}  // namespace duet::policies
