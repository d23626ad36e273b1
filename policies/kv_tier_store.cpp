// One KV tier's contents and eviction policy (see kv_tier_store.h).
#include "policies/kv_tier_store.h"

#include <algorithm>
#include <array>

namespace duet::policies {

Result<EvictionPolicy> ParseEvictionPolicy(const std::string& name) {
  if (name == "lru") return EvictionPolicy::kLru;
  if (name == "arc") return EvictionPolicy::kArc;
  return Status::Error("eviction policy must be 'lru' or 'arc', got '" + name + "'");
}

const char* ToString(EvictionPolicy policy) {
  return policy == EvictionPolicy::kLru ? "lru" : "arc";
}

namespace {
constexpr std::size_t kAhead = 8;               // queue records whose slots load ahead
constexpr std::int64_t kMinDeadRecords = 1024;  // spent or stale records kept before compacting
constexpr std::size_t kInitialSlots = 16;
}  // namespace

// The helpers of the write and eviction paths below (NewEntry, Remove, PushMru, Unlink, Oldest,
// EvictFrom, SpendIfFirst, Writing) are always inlined: each is a few instructions around one
// access to the table or a queue, run once or more for every block written (millions in a run),
// and as calls, with their register saves, they cost about 4% of the tiered PD run's wall time
// (docs/benchmarks.md).

KvTierStore::KvTierStore(std::int64_t capacity_blocks, EvictionPolicy policy)
    : capacity_(capacity_blocks), policy_(policy), table_(kInitialSlots) {
  DUET_CHECK(capacity_blocks >= 0);
}

[[gnu::always_inline]] inline std::int32_t KvTierStore::NewEntry(BlockHash hash) {
  // At most three quarters of the slots are taken: probes stay within a cache line or two, and
  // a store of millions of blocks takes a third less memory than at half.
  if (static_cast<std::size_t>(entries_ + 1) * 4 > table_.slots() * 3) Grow();
  const std::size_t i = table_.FreeSlotFor(hash);
  Slot& x = table_[i];
  x = Slot{};
  x.hash = hash;
  x.list = kUnlisted;
  ++entries_;
  return static_cast<std::int32_t>(i);
}

[[gnu::always_inline]] inline void KvTierStore::Remove(std::int32_t i) {
  if (at(i).list != kUnlisted) Unlink(i);
  --entries_;
  // Later entries may move (queue records name entries by hash, so nothing else changes).
  table_.EraseAt(static_cast<std::size_t>(i));
}

void KvTierStore::Grow() {
  DUET_CHECK_MSG(table_.slots() * 2 <= (std::size_t{1} << 31), "tier store outgrew its 2^31 slots");
  table_.Double();
}

[[gnu::always_inline]] inline void KvTierStore::PushMru(std::int32_t i, List list) {
  Slot& x = at(i);
  Queue& q = lists_[list];
  x.list = list;
  x.pos = q.base + static_cast<std::uint32_t>(q.records.size());
  q.records.push_back(x.hash);
  ++q.size;
  if (list == kB1 || list == kB2) ++ghosts_;
  // Compact's two conditions, checked here so that a push that needs none (nearly all) costs no
  // call.
  const std::size_t pending = q.records.size() - q.head;
  if ((q.head > pending && static_cast<std::int64_t>(q.head) > kMinDeadRecords) ||
      q.stale() > std::max(q.size, kMinDeadRecords))
    Compact(list);
}

[[gnu::always_inline]] inline void KvTierStore::Unlink(std::int32_t i) {
  Slot& x = at(i);
  --lists_[x.list].size;
  if (x.list == kB1 || x.list == kB2) --ghosts_;
  x.list = kUnlisted;
}

void KvTierStore::Compact(List list) {
  // Spent records go once they are most of the array; stale ones once they outnumber the live
  // ones. Either way each record is moved O(1) times on average.
  Queue& q = lists_[list];
  DUET_CHECK(q.records.size() < (std::size_t{1} << 32));
  const std::size_t pending = q.records.size() - q.head;
  if (q.head > pending && static_cast<std::int64_t>(q.head) > kMinDeadRecords) {
    q.records.erase(q.records.begin(), q.records.begin() + static_cast<std::ptrdiff_t>(q.head));
    q.base += static_cast<std::uint32_t>(q.head);
    q.head = 0;
  }
  if (q.stale() > std::max(q.size, kMinDeadRecords)) {
    std::size_t kept = 0;
    for (std::size_t k = q.head; k < q.records.size(); ++k) {
      if (k + kAhead < q.records.size()) Prefetch(q.records[k + kAhead]);
      const std::int32_t i = LiveSlot(list, k);
      if (i < 0) continue;
      at(i).pos = q.base + static_cast<std::uint32_t>(kept);
      q.records[kept++] = q.records[k];
    }
    q.records.resize(kept);
    q.head = 0;
    // Writes in flight on this list moved with their blocks (all live: they stay in one run).
    if (list == kT1 || list == kT2) {
      for (Flight& f : flights_[list]) f.begin = at(Find(f.first)).pos;
    }
  }
}

[[gnu::always_inline]] inline std::int32_t KvTierStore::Oldest(List list, bool evictable) {
  Queue& q = lists_[list];
  bool front = true;  // every record before k is spent or stale
  for (std::size_t k = q.head; k < q.records.size(); ++k) {
    // Evictions come one per write once the tier is full, each a record or so on: load the
    // next victims' slots now, so the evictions to come find them.
    if (k + kAhead < q.records.size()) Prefetch(q.records[k + kAhead]);
    const std::int32_t i = LiveSlot(list, k);
    if (i < 0) {
      if (front) q.head = k + 1;
      continue;
    }
    if (!evictable || Evictable(at(i))) return i;
    front = false;
  }
  return -1;
}

[[gnu::always_inline]] inline bool KvTierStore::EvictFrom(List list,
                                                          std::vector<BlockHash>* evicted) {
  // The least recently used block that is neither being written nor read.
  const std::int32_t i = Oldest(list, /*evictable=*/true);
  if (i < 0) return false;
  evicted->push_back(at(i).hash);
  ++evictions_;
  const std::uint32_t pos = at(i).pos;
  if (policy_ == EvictionPolicy::kArc) {
    // The block leaves the cache but its name stays in the matching ghost list.
    Unlink(i);
    PushMru(i, list == kT1 ? kB1 : kB2);
  } else {
    Remove(i);
  }
  SpendIfFirst(list, pos);
  return true;
}

[[gnu::always_inline]] inline void KvTierStore::SpendIfFirst(List list, std::uint32_t pos) {
  // Without this the next Oldest would look the stale record up again: a cache miss per
  // eviction, in a table of millions of slots.
  Queue& q = lists_[list];
  if (q.head < q.records.size() && q.base + static_cast<std::uint32_t>(q.head) == pos) ++q.head;
}

void KvTierStore::DropGhostLru(List list) {
  if (const std::int32_t i = Oldest(list, /*evictable=*/false); i >= 0) {
    const std::uint32_t pos = at(i).pos;
    Remove(i);
    SpendIfFirst(list, pos);
  }
}

bool KvTierStore::ArcReplace(bool hit_in_b2, std::vector<BlockHash>* evicted) {
  const auto t1 = static_cast<double>(lists_[kT1].size);
  const bool prefer_t1 = t1 >= 1 && (t1 > arc_p_ || (hit_in_b2 && t1 == arc_p_));
  if (prefer_t1) return EvictFrom(kT1, evicted) || EvictFrom(kT2, evicted);
  return EvictFrom(kT2, evicted) || EvictFrom(kT1, evicted);
}

KvTierStore::WriteStart KvTierStore::BeginWrite(std::span<const BlockHash> hashes,
                                                std::vector<BlockHash>* started,
                                                std::vector<BlockHash>* evicted) {
  WriteStart result;
  const WriteId id = next_write_;
  for (std::size_t k = 0; k < hashes.size(); ++k) {
    // Blocks of a request land anywhere in a table of millions of slots: load ahead.
    if (k + kAhead < hashes.size()) Prefetch(hashes[k + kAhead]);
    switch (BeginOne(hashes[k], id, evicted)) {
      case OneStart::kStarted:
        started->push_back(hashes[k]);
        result.id = id;
        break;
      case OneStart::kPresent:
        break;
      case OneStart::kNoRoom:
        ++result.no_room;
        break;
    }
  }
  if (result.id != 0) ++next_write_;
  return result;
}

KvTierStore::OneStart KvTierStore::BeginOne(BlockHash hash, WriteId id,
                                            std::vector<BlockHash>* evicted) {
  if (capacity_ == 0) return OneStart::kNoRoom;
  List target = kMain;
  bool hit_in_b2 = false;
  std::int32_t ghost = Find(hash);
  if (ghost >= 0 && at(ghost).list != kB1 && at(ghost).list != kB2) return OneStart::kPresent;
  if (policy_ == EvictionPolicy::kLru) {
    while (used_blocks() >= capacity_) {
      if (!EvictFrom(kMain, evicted)) return OneStart::kNoRoom;
    }
  } else {
    const auto c = static_cast<double>(capacity_);
    const auto b1 = static_cast<double>(lists_[kB1].size);
    const auto b2 = static_cast<double>(lists_[kB2].size);
    if (ghost >= 0) {
      // A ghost hit: the list it was evicted from was too small; adapt the target.
      hit_in_b2 = at(ghost).list == kB2;
      if (hit_in_b2) {
        arc_p_ = std::max(0.0, arc_p_ - std::max(1.0, b1 / b2));
      } else {
        arc_p_ = std::min(c, arc_p_ + std::max(1.0, b2 / b1));
      }
      target = kT2;
    } else {
      target = kT1;
      // Keep |T1| + |B1| <= c and the whole directory <= 2c.
      const auto l1 = static_cast<double>(lists_[kT1].size) + b1;
      if (l1 >= c && b1 > 0) {
        DropGhostLru(kB1);
      } else if (l1 < c && static_cast<double>(entries_) >= 2 * c && b2 > 0) {
        DropGhostLru(kB2);
      }
    }
    while (used_blocks() >= capacity_) {
      if (!ArcReplace(hit_in_b2, evicted)) return OneStart::kNoRoom;
    }
    // Ghost lists never outgrow the cache.
    while (lists_[kB1].size > capacity_) DropGhostLru(kB1);
    while (lists_[kB2].size > capacity_) DropGhostLru(kB2);
    // Removals shift entries: find the ghost again (it may have been trimmed).
    if (ghost >= 0) ghost = Find(hash);
  }
  std::int32_t i = ghost;
  if (i >= 0) {
    Unlink(i);
  } else {
    i = NewEntry(hash);
  }
  PushMru(i, target);
  // The write's run on this list grows by this block (nothing else was pushed on it since).
  std::vector<Flight>& flights = flights_[target];
  const Slot& x = at(i);
  if (!flights.empty() && flights.back().id == id) {
    DUET_CHECK(flights.back().begin + flights.back().blocks == x.pos);
    ++flights.back().blocks;
  } else {
    flights.push_back({id, x.hash, x.pos, 1});
  }
  ++writing_;
  peak_used_ = std::max(peak_used_, used_blocks());
  return OneStart::kStarted;
}

std::int64_t KvTierStore::Land(WriteId id) {
  std::int64_t blocks = 0;
  for (std::vector<Flight>& flights : flights_) {
    auto it =
        std::find_if(flights.begin(), flights.end(), [id](const Flight& f) { return f.id == id; });
    if (it == flights.end()) continue;
    blocks += it->blocks;
    flights.erase(it);
  }
  DUET_CHECK_MSG(blocks > 0, "end of a tier write that is not in flight");
  writing_ -= blocks;
  return blocks;
}

void KvTierStore::EndWrite(WriteId id) { Land(id); }

void KvTierStore::AbortWrite(WriteId id, std::span<const BlockHash> started) {
  for (BlockHash h : started) {
    const std::int32_t i = Find(h);
    DUET_CHECK_MSG(i >= 0 && Writing(at(i)), "AbortWrite of a block that is not being written");
  }
  DUET_CHECK_MSG(Land(id) == static_cast<std::int64_t>(started.size()),
                 "AbortWrite names other blocks than its write started");
  // Removals move entries: each is looked up again.
  for (BlockHash h : started) Remove(Find(h));
}

[[gnu::always_inline]] inline bool KvTierStore::Writing(const Slot& x) const {
  if (x.list != kT1 && x.list != kT2) return false;
  const std::vector<Flight>& flights = flights_[x.list];
  if (flights.empty()) return false;
  // Positions relative to the queue's first record, where they are ordered.
  const std::uint32_t base = lists_[x.list].base;
  const std::uint32_t p = x.pos - base;
  if (p < flights.front().begin - base) return false;  // older than every write in flight
  auto it =
      std::upper_bound(flights.begin(), flights.end(), p,
                       [base](std::uint32_t v, const Flight& f) { return v < f.begin - base; });
  --it;
  return p - (it->begin - base) < it->blocks;
}

bool KvTierStore::Contains(BlockHash hash) const {
  const std::int32_t i = Find(hash);
  return i >= 0 && Readable(at(i));
}

bool KvTierStore::PinForRead(BlockHash hash) {
  const std::int32_t i = Find(hash);
  if (i < 0 || !Readable(at(i))) return false;
  Slot& x = at(i);
  DUET_CHECK(x.pins < kMaxPins);
  if (x.pins++ == 0) ++pinned_;
  // A hit: most recently used; under ARC a second use moves the block to the frequency list.
  Unlink(i);
  PushMru(i, policy_ == EvictionPolicy::kArc ? kT2 : kMain);
  return true;
}

bool KvTierStore::Discard(BlockHash hash) {
  const std::int32_t i = Find(hash);
  if (i < 0 || !Readable(at(i)) || at(i).pins > 0) return false;
  Remove(i);
  return true;
}

void KvTierStore::Unpin(BlockHash hash) {
  const std::int32_t i = Find(hash);
  DUET_CHECK(i >= 0 && at(i).pins > 0);
  if (--at(i).pins == 0) --pinned_;
}

std::vector<BlockHash> KvTierStore::EvictionOrder() const {
  std::vector<BlockHash> order;
  const bool prefer_t1 = policy_ == EvictionPolicy::kLru ||
                         (lists_[kT1].size >= 1 && static_cast<double>(lists_[kT1].size) > arc_p_);
  const List first = prefer_t1 ? kT1 : kT2;
  const List lists[2] = {first, first == kT1 ? kT2 : kT1};
  for (List l : lists) {
    if (policy_ == EvictionPolicy::kLru && l == kT2) break;
    const Queue& q = lists_[l];
    for (std::size_t i = q.head; i < q.records.size(); ++i) {
      if (LiveSlot(l, i) >= 0) order.push_back(q.records[i]);
    }
  }
  return order;
}

Status KvTierStore::CheckInvariants() const {
  // One pass over the table in slot order: every entry can be found by its hash (no empty slot
  // cuts its probe) and names a record of its own list's queue that holds its hash (its live
  // record; entries have distinct hashes, so distinct records), and each list has as many
  // entries as it counts.
  if (!table_.AllReachable()) return Status::Error("a tier entry cannot be found under its hash");
  for (const Queue& q : lists_) {
    if (q.head > q.records.size() || q.records.size() >= (std::size_t{1} << 32))
      return Status::Error("tier queue head is past its end");
  }
  const std::size_t n = table_.slots();
  std::int64_t entries = 0, writing = 0, pinned = 0, ghosts = 0;
  std::array<std::int64_t, kNumLists> counts{};
  // The record an entry names, or nullptr if its position is outside its queue's live part.
  auto record = [&](const Slot& x) -> const BlockHash* {
    const Queue& q = lists_[x.list];
    const std::uint32_t k = x.pos - q.base;  // positions count modulo 2^32
    return k >= q.head && k < q.records.size() ? &q.records[k] : nullptr;
  };
  for (std::size_t i = 0; i < n; ++i) {
    // Records are read in slot order, so at random: load a few ahead.
    if (i + kAhead < n && table_[i + kAhead].list < kNumLists) {
      if (const BlockHash* r = record(table_[i + kAhead])) __builtin_prefetch(r);
    }
    const Slot& x = table_[i];
    if (x.list == kEmpty) continue;
    if (x.list >= kNumLists) return Status::Error("a tier entry is on no list");
    const BlockHash* r = record(x);
    if (r == nullptr || *r != x.hash)
      return Status::Error("a tier entry's record in its list's queue is missing");
    const bool ghost = x.list == kB1 || x.list == kB2;
    if (ghost && x.pins) return Status::Error("a ghost entry is being read");
    ++counts[x.list];
    writing += Writing(x);
    pinned += x.pins > 0;
    ghosts += ghost;
    ++entries;
  }
  for (int l = 0; l < kNumLists; ++l) {
    if (counts[static_cast<std::size_t>(l)] != lists_[l].size)
      return Status::Error("tier list size does not match its list");
  }
  // Each write in flight: runs in position order, apart, each of live records of its list
  // (which Writing counted above; the sum must match).
  std::int64_t in_flight = 0;
  for (int l = 0; l < 2; ++l) {
    const Queue& q = lists_[l];
    std::uint32_t end = static_cast<std::uint32_t>(q.head);
    for (const Flight& f : flights_[l]) {
      const std::uint32_t begin = f.begin - q.base;
      if (f.blocks == 0 || begin < end || begin + f.blocks > q.records.size() ||
          q.records[begin] != f.first)
        return Status::Error("a tier write in flight is out of order or outside its list");
      for (std::uint32_t k = begin; k < begin + f.blocks; ++k) {
        if (LiveSlot(static_cast<List>(l), k) < 0)
          return Status::Error("a tier write in flight holds a block no longer on its list");
      }
      end = begin + f.blocks;
      in_flight += f.blocks;
    }
  }
  if (in_flight != writing_) return Status::Error("tier writes in flight do not match the count");
  if (entries != entries_) return Status::Error("tier entry count does not match the table");
  if (writing != writing_ || pinned != pinned_ || ghosts != ghosts_)
    return Status::Error("tier counters do not match the lists");
  if (used_blocks() > capacity_)
    return Status::Error("tier holds " + std::to_string(used_blocks()) + " blocks, capacity " +
                         std::to_string(capacity_));
  if (policy_ == EvictionPolicy::kArc &&
      (lists_[kB1].size > capacity_ || lists_[kB2].size > capacity_))
    return Status::Error("ARC ghost list larger than the cache");
  return Status::Ok();
}

}  // namespace duet::policies
