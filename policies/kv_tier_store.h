// One KV cache tier below GPU memory (a node's host DRAM, a node's SSD, or the cluster's remote
// store): a capacity in blocks, which block hashes it holds, and an eviction policy (LRU, or ARC
// after Megiddo and Modha, FAST'03). It tracks identity only; the bytes move through the
// TierStorage port (kv_tiers.h). A block is readable only after its write finished; blocks
// being written or read (pinned) are never evicted. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/hash_index.h"
#include "policies/request.h"

namespace duet::policies {

enum class EvictionPolicy { kLru, kArc };
// "lru" or "arc".
Result<EvictionPolicy> ParseEvictionPolicy(const std::string& name);
const char* ToString(EvictionPolicy policy);

class KvTierStore {
 public:
  KvTierStore(std::int64_t capacity_blocks, EvictionPolicy policy);

  enum class WriteStart {
    kStarted,  // space reserved; the block becomes readable at EndWrite
    kPresent,  // already held or being written: nothing to do
    kNoRoom,   // full of blocks that cannot be evicted now (being written or read)
  };
  // Reserves room for `hash`, evicting as the policy says; evicted hashes are appended to
  // `evicted` (they were readable and are gone now). When started, `*entry` (if given) names
  // the block's entry until its write ends: EndWrite and AbortWrite take it instead of the
  // hash, saving a lookup in an index of millions.
  WriteStart BeginWrite(BlockHash hash, std::vector<BlockHash>* evicted,
                        std::int32_t* entry = nullptr);
  // The write of `hash` finished: the block becomes readable (and evictable once unpinned).
  void EndWrite(BlockHash hash) { EndWriteAt(Find(hash)); }
  void EndWriteAt(std::int32_t entry);
  // The write of `hash` failed: its room is released and it never becomes readable.
  void AbortWrite(BlockHash hash) { AbortWriteAt(Find(hash)); }
  void AbortWriteAt(std::int32_t entry);

  // Readable: written completely and not evicted since.
  bool Contains(BlockHash hash) const;
  // A hit: the block is about to be read. Updates recency (LRU) or recency/frequency (ARC) and
  // pins it against eviction until Unpin. Requires Contains(hash).
  void PinForRead(BlockHash hash);
  void Unpin(BlockHash hash);

  std::int64_t capacity_blocks() const { return capacity_; }
  // Blocks that take room: readable plus being written.
  std::int64_t used_blocks() const { return static_cast<std::int64_t>(entries_.size()) - ghosts_; }
  std::int32_t Find(BlockHash hash) const { return entries_.Find(hash); }
  // Hints for loops over many hashes (no effect on contents): start loading where `hash`'s
  // index probe begins, or (once that is loaded) its entry. A store of millions of blocks
  // misses the cache on both; a loop issues them a few blocks ahead so the misses overlap.
  void PrefetchSlot(BlockHash hash) const { entries_.Prefetch(hash); }
  void PrefetchEntry(BlockHash hash) const { PrefetchEntryAt(entries_.Find(hash)); }
  void PrefetchEntryAt(std::int32_t e) const {
    if (e != BlockHashIndex::kAbsent) __builtin_prefetch(&slab_[static_cast<std::size_t>(e)]);
  }
  std::int64_t writing_blocks() const { return writing_; }
  std::int64_t pinned_blocks() const { return pinned_; }
  std::int64_t evictions() const { return evictions_; }
  std::int64_t peak_used_blocks() const { return peak_used_; }
  EvictionPolicy policy() const { return policy_; }

  // Readable or in-flight blocks in the order the policy would evict them (LRU first; for ARC,
  // the list REPLACE would take from first). For tests of eviction order.
  std::vector<BlockHash> EvictionOrder() const;
  // ARC's target size of its recency list (0 for LRU).
  double arc_target() const { return arc_p_; }

  // Lists consistent with the index, counts consistent with the lists, capacity respected.
  Status CheckInvariants() const;

 private:
  // Lists: kLru (LRU policy), T1/T2 (ARC residents), B1/B2 (ARC ghosts: hashes only).
  enum List : std::uint8_t { kMain = 0, kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3, kNumLists = 4 };
  struct Entry {
    BlockHash hash = 0;
    std::int32_t prev = -1, next = -1;
    std::int32_t pins = 0;
    List list = kMain;
    bool writing = false;
  };
  struct ListHead {
    std::int32_t head = -1, tail = -1;  // head: least recently used
    std::int64_t size = 0;
  };

  std::int32_t NewEntry(BlockHash hash);
  void DropEntry(std::int32_t e);  // unlinks and forgets
  void PushMru(std::int32_t e, List list);
  void Unlink(std::int32_t e);
  bool Evictable(const Entry& e) const { return !e.writing && e.pins == 0; }
  // Evicts one block from `list` (least recently used evictable one). False if none.
  bool EvictFrom(List list, std::vector<BlockHash>* evicted);
  // ARC's REPLACE; falls back to the other list when the preferred one has nothing evictable.
  bool ArcReplace(bool hit_in_b2, std::vector<BlockHash>* evicted);
  void DropGhostLru(List list);

  std::int64_t capacity_;
  EvictionPolicy policy_;
  std::vector<Entry> slab_;
  std::vector<std::int32_t> free_slots_;
  BlockHashIndex entries_{16};  // hash -> slab index: residents, in-flight and ghosts
  ListHead lists_[kNumLists];
  std::int64_t ghosts_ = 0;
  std::int64_t writing_ = 0, pinned_ = 0, evictions_ = 0, peak_used_ = 0;
  double arc_p_ = 0;  // ARC: target size of T1
};

}  // namespace duet::policies
