// One KV cache tier below GPU memory (a node's host DRAM, a node's SSD, or the cluster's remote
// store): a capacity in blocks, which block hashes it holds, and an eviction policy (LRU, or ARC
// after Megiddo and Modha, FAST'03). It tracks identity only; the bytes move through the
// TierStorage port (kv_tiers.h). A block is readable only after its write finished; blocks
// being written or read (pinned) are never evicted. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
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

  // Names one write of blocks into the tier, from BeginWrite to its EndWrite or AbortWrite.
  using WriteId = std::uint64_t;
  struct WriteStart {
    WriteId id = 0;            // 0: no block started
    std::int64_t no_room = 0;  // blocks refused: the tier is full of blocks being written or read
  };
  // Starts one write of the blocks of `hashes` that the tier neither holds nor is writing
  // (those it does are skipped): reserves room for each, evicting as the policy says (evicted
  // hashes, readable until now, are appended to `evicted`), and appends it to `started`. The
  // started blocks become readable together, at EndWrite(id).
  WriteStart BeginWrite(std::span<const BlockHash> hashes, std::vector<BlockHash>* started,
                        std::vector<BlockHash>* evicted);
  // The write finished: its blocks become readable (and evictable once unpinned). Costs the same
  // whatever the write's size: no block is looked up.
  void EndWrite(WriteId id);
  // The write failed: its blocks' room is released and they never become readable. `started`
  // is what BeginWrite appended for it.
  void AbortWrite(WriteId id, std::span<const BlockHash> started);

  // Readable: written completely and not evicted since.
  bool Contains(BlockHash hash) const;
  // A hit if the block is readable (Contains): it is about to be read. Updates recency (LRU) or
  // recency/frequency (ARC) and pins it against eviction until Unpin. False, changing nothing,
  // if it is not readable.
  bool PinForRead(BlockHash hash);
  void Unpin(BlockHash hash);
  // Forgets a readable, unpinned block (a read found it lost): it leaves no ghost and counts as
  // no eviction. False, changing nothing, for any other block.
  bool Discard(BlockHash hash);

  std::int64_t capacity_blocks() const { return capacity_; }
  // Blocks that take room: readable plus being written.
  std::int64_t used_blocks() const { return entries_ - ghosts_; }
  // A hint for loops over many hashes (no effect on contents): start loading the slot where
  // `hash`'s probe begins. A store of millions of blocks misses the cache there; a loop issues
  // it a few blocks ahead so the misses overlap.
  void Prefetch(BlockHash hash) const { table_.Prefetch(hash); }
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

  // Every entry reachable by its hash, the queues consistent with the entries, counts
  // consistent with both, capacity respected.
  Status CheckInvariants() const;

 private:
  // Lists: kLru (LRU policy), T1/T2 (ARC residents), B1/B2 (ARC ghosts: hashes only).
  enum List : std::uint8_t {
    kMain = 0,
    kT1 = 0,
    kT2 = 1,
    kB1 = 2,
    kB2 = 3,
    kNumLists = 4,
    kUnlisted = 4,  // an entry between lists, within one operation
    kEmpty = 5,     // a free slot
  };
  // The entries live in the hash table itself (hash_index.h's LinearProbeTable): one cache miss
  // per block looked up, where an index beside an array of entries costs two. 16 bytes: a store
  // holds millions.
  struct Slot {
    BlockHash hash = 0;
    std::uint32_t pos = 0;  // on a list: its record's position in the list's queue
    std::uint32_t pins : 29 = 0;
    std::uint32_t list : 3 = kEmpty;  // a List
  };
  static constexpr std::uint32_t kMaxPins = (1u << 29) - 1;
  struct SlotTraits {
    static std::uint64_t Key(const Slot& x) { return x.hash; }
    static bool Empty(const Slot& x) { return x.list == kEmpty; }
    static Slot EmptySlot() { return Slot{}; }
  };
  // A list's order (least recently used first) is an array queue of the hashes pushed on it. An
  // entry that leaves its place early (a hit, an eviction, a move to a ghost list, a failed
  // write) leaves its record behind, stale, skipped when reached; an entry names its live
  // record by position, so entries move in the table freely. An eviction reads the queue front
  // to back, loading the next victims' slots ahead, where a linked list would chase scattered
  // nodes one at a time.
  struct Queue {
    std::vector<BlockHash> records;  // records before head are spent
    std::size_t head = 0;
    std::uint32_t base = 0;  // position of records[0] (positions count modulo 2^32)
    std::int64_t size = 0;   // live records: the list's entries
    std::int64_t stale() const { return static_cast<std::int64_t>(records.size() - head) - size; }
  };

  Slot& at(std::int32_t i) { return table_[static_cast<std::size_t>(i)]; }
  const Slot& at(std::int32_t i) const { return table_[static_cast<std::size_t>(i)]; }
  // The slot of record k of `list`'s queue if it is its entry's live record, or -1.
  std::int32_t LiveSlot(List list, std::size_t k) const {
    const Queue& q = lists_[list];
    const std::int32_t i = Find(q.records[k]);
    return i >= 0 && at(i).list == list && at(i).pos == q.base + static_cast<std::uint32_t>(k) ? i
                                                                                               : -1;
  }
  // The slot holding `hash`, or -1. Inline: every operation starts with one.
  std::int32_t Find(BlockHash hash) const {
    return static_cast<std::int32_t>(table_.Find(hash));  // at most 2^31 slots (Grow)
  }
  // A slot for `hash`, which the table does not hold; on no list yet.
  std::int32_t NewEntry(BlockHash hash);
  // The entry leaves its list (if on one) and the table; later entries may move.
  void Remove(std::int32_t i);
  void Grow();  // doubles the table
  void PushMru(std::int32_t i, List list);
  // The entry leaves its list, staying in the table until PushMru puts it on one again.
  void Unlink(std::int32_t i);
  // A write in flight holds one run of consecutive positions on each list its blocks went to
  // (T1, the main list; T2 for ARC's ghost hits): nothing else is pushed on those lists while its
  // blocks are, and they stay in place until it ends (neither readable nor evictable). So a
  // block is being written exactly when its position lies in such a run, and a write ends
  // without a look-up per block, in tables where each look-up is a cache miss.
  struct Flight {
    WriteId id;
    BlockHash first;      // its first block on the list (found again when positions move)
    std::uint32_t begin;  // that block's position
    std::uint32_t blocks;
  };
  enum class OneStart { kStarted, kPresent, kNoRoom };
  OneStart BeginOne(BlockHash hash, WriteId id, std::vector<BlockHash>* evicted);
  // Ends write `id` on every list; returns its blocks.
  std::int64_t Land(WriteId id);
  bool Writing(const Slot& x) const;
  bool Evictable(const Slot& x) const { return x.pins == 0 && !Writing(x); }
  // Written completely and resident (not a ghost).
  bool Readable(const Slot& x) const { return (x.list == kT1 || x.list == kT2) && !Writing(x); }
  // The least recently used entry of `list` (evictable only, if asked), or -1. Drops the stale
  // records it passes at the queue's front.
  std::int32_t Oldest(List list, bool evictable);
  void Compact(List list);  // drops spent and, when they are many, stale records
  // An entry whose record was at `pos` just left `list`: if that record is the queue's first, the
  // queue's head moves past it.
  void SpendIfFirst(List list, std::uint32_t pos);
  // Evicts one block from `list` (least recently used evictable one). False if none.
  bool EvictFrom(List list, std::vector<BlockHash>* evicted);
  // ARC's REPLACE; falls back to the other list when the preferred one has nothing evictable.
  bool ArcReplace(bool hit_in_b2, std::vector<BlockHash>* evicted);
  void DropGhostLru(List list);

  std::int64_t capacity_;
  EvictionPolicy policy_;
  LinearProbeTable<Slot, SlotTraits> table_;
  std::int64_t entries_ = 0;  // residents, in-flight and ghosts
  Queue lists_[kNumLists];
  std::int64_t ghosts_ = 0;
  std::vector<Flight> flights_[2];  // on T1 (the main list) and T2, in position order
  WriteId next_write_ = 1;
  std::int64_t writing_ = 0, pinned_ = 0, evictions_ = 0, peak_used_ = 0;
  double arc_p_ = 0;  // ARC: target size of T1
};

}  // namespace duet::policies
