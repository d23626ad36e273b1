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

KvTierStore::KvTierStore(std::int64_t capacity_blocks, EvictionPolicy policy)
    : capacity_(capacity_blocks), policy_(policy) {
  DUET_CHECK(capacity_blocks >= 0);
}

std::int32_t KvTierStore::NewEntry(BlockHash hash) {
  std::int32_t e;
  if (!free_slots_.empty()) {
    e = free_slots_.back();
    free_slots_.pop_back();
    slab_[static_cast<std::size_t>(e)] = Entry{};
  } else {
    e = static_cast<std::int32_t>(slab_.size());
    slab_.emplace_back();
  }
  slab_[static_cast<std::size_t>(e)].hash = hash;
  entries_.InsertGrowing(hash, e);
  return e;
}

void KvTierStore::DropEntry(std::int32_t e) {
  Unlink(e);
  entries_.Erase(slab_[static_cast<std::size_t>(e)].hash);
  free_slots_.push_back(e);
}

void KvTierStore::PushMru(std::int32_t e, List list) {
  Entry& x = slab_[static_cast<std::size_t>(e)];
  ListHead& l = lists_[list];
  x.list = list;
  x.prev = l.tail;
  x.next = -1;
  if (l.tail >= 0) {
    slab_[static_cast<std::size_t>(l.tail)].next = e;
  } else {
    l.head = e;
  }
  l.tail = e;
  ++l.size;
  if (list == kB1 || list == kB2) ++ghosts_;
}

void KvTierStore::Unlink(std::int32_t e) {
  Entry& x = slab_[static_cast<std::size_t>(e)];
  ListHead& l = lists_[x.list];
  if (x.prev >= 0) {
    slab_[static_cast<std::size_t>(x.prev)].next = x.next;
  } else {
    l.head = x.next;
  }
  if (x.next >= 0) {
    slab_[static_cast<std::size_t>(x.next)].prev = x.prev;
  } else {
    l.tail = x.prev;
  }
  x.prev = x.next = -1;
  --l.size;
  if (x.list == kB1 || x.list == kB2) --ghosts_;
}

bool KvTierStore::EvictFrom(List list, std::vector<BlockHash>* evicted) {
  // The least recently used block that is neither being written nor read.
  std::int32_t e = lists_[list].head;
  while (e >= 0 && !Evictable(slab_[static_cast<std::size_t>(e)]))
    e = slab_[static_cast<std::size_t>(e)].next;
  if (e < 0) return false;
  const BlockHash hash = slab_[static_cast<std::size_t>(e)].hash;
  evicted->push_back(hash);
  ++evictions_;
  if (policy_ == EvictionPolicy::kArc) {
    // The block leaves the cache but its name stays in the matching ghost list.
    Unlink(e);
    PushMru(e, list == kT1 ? kB1 : kB2);
  } else {
    DropEntry(e);
  }
  // Evictions come one per write once the tier is full: start loading the next victim's index
  // slot and successor now (its entry was just read), so the next eviction finds them.
  if (const std::int32_t next = lists_[list].head; next >= 0) {
    const Entry& x = slab_[static_cast<std::size_t>(next)];
    entries_.Prefetch(x.hash);
    if (x.next >= 0) __builtin_prefetch(&slab_[static_cast<std::size_t>(x.next)]);
  }
  return true;
}

void KvTierStore::DropGhostLru(List list) {
  if (lists_[list].head >= 0) DropEntry(lists_[list].head);
}

bool KvTierStore::ArcReplace(bool hit_in_b2, std::vector<BlockHash>* evicted) {
  const auto t1 = static_cast<double>(lists_[kT1].size);
  const bool prefer_t1 = t1 >= 1 && (t1 > arc_p_ || (hit_in_b2 && t1 == arc_p_));
  if (prefer_t1) return EvictFrom(kT1, evicted) || EvictFrom(kT2, evicted);
  return EvictFrom(kT2, evicted) || EvictFrom(kT1, evicted);
}

KvTierStore::WriteStart KvTierStore::BeginWrite(BlockHash hash, std::vector<BlockHash>* evicted,
                                                std::int32_t* entry) {
  if (capacity_ == 0) return WriteStart::kNoRoom;
  List target = kMain;
  bool hit_in_b2 = false;
  std::int32_t ghost = entries_.Find(hash);
  if (ghost != BlockHashIndex::kAbsent) {
    const Entry& x = slab_[static_cast<std::size_t>(ghost)];
    if (x.list != kB1 && x.list != kB2) return WriteStart::kPresent;
  }
  if (policy_ == EvictionPolicy::kLru) {
    while (used_blocks() >= capacity_) {
      if (!EvictFrom(kMain, evicted)) return WriteStart::kNoRoom;
    }
  } else {
    const auto c = static_cast<double>(capacity_);
    const auto b1 = static_cast<double>(lists_[kB1].size);
    const auto b2 = static_cast<double>(lists_[kB2].size);
    if (ghost >= 0) {
      // A ghost hit: the list it was evicted from was too small; adapt the target.
      hit_in_b2 = slab_[static_cast<std::size_t>(ghost)].list == kB2;
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
      } else if (l1 < c && static_cast<double>(entries_.size()) >= 2 * c && b2 > 0) {
        DropGhostLru(kB2);
      }
    }
    while (used_blocks() >= capacity_) {
      if (!ArcReplace(hit_in_b2, evicted)) return WriteStart::kNoRoom;
    }
    // Ghost lists never outgrow the cache.
    while (lists_[kB1].size > capacity_) DropGhostLru(kB1);
    while (lists_[kB2].size > capacity_) DropGhostLru(kB2);
    if (ghost >= 0 && entries_.Find(hash) == BlockHashIndex::kAbsent) ghost = -1;  // trimmed
  }
  std::int32_t e = ghost;
  if (e >= 0) {
    Unlink(e);
  } else {
    e = NewEntry(hash);
  }
  slab_[static_cast<std::size_t>(e)].writing = true;
  PushMru(e, target);
  ++writing_;
  if (entry) *entry = e;
  peak_used_ = std::max(peak_used_, used_blocks());
  return WriteStart::kStarted;
}

void KvTierStore::EndWriteAt(std::int32_t e) {
  DUET_CHECK_MSG(e >= 0 && static_cast<std::size_t>(e) < slab_.size(),
                 "EndWrite of a block that is not being written");
  Entry& x = slab_[static_cast<std::size_t>(e)];
  DUET_CHECK_MSG(x.writing, "EndWrite of a block that is not being written");
  x.writing = false;
  --writing_;
}

void KvTierStore::AbortWriteAt(std::int32_t e) {
  DUET_CHECK_MSG(e >= 0 && static_cast<std::size_t>(e) < slab_.size() &&
                     slab_[static_cast<std::size_t>(e)].writing,
                 "AbortWrite of a block that is not being written");
  --writing_;
  DropEntry(e);
}

bool KvTierStore::Contains(BlockHash hash) const {
  const std::int32_t e = entries_.Find(hash);
  if (e == BlockHashIndex::kAbsent) return false;
  const Entry& x = slab_[static_cast<std::size_t>(e)];
  return !x.writing && x.list != kB1 && x.list != kB2;
}

void KvTierStore::PinForRead(BlockHash hash) {
  DUET_CHECK(Contains(hash));
  const std::int32_t e = entries_.Find(hash);
  Entry& x = slab_[static_cast<std::size_t>(e)];
  if (x.pins++ == 0) ++pinned_;
  // A hit: most recently used; under ARC a second use moves the block to the frequency list.
  Unlink(e);
  PushMru(e, policy_ == EvictionPolicy::kArc ? kT2 : kMain);
}

void KvTierStore::Unpin(BlockHash hash) {
  const std::int32_t e = entries_.Find(hash);
  DUET_CHECK(e != BlockHashIndex::kAbsent);
  Entry& x = slab_[static_cast<std::size_t>(e)];
  DUET_CHECK(x.pins > 0);
  if (--x.pins == 0) --pinned_;
}

std::vector<BlockHash> KvTierStore::EvictionOrder() const {
  std::vector<BlockHash> order;
  const bool prefer_t1 = policy_ == EvictionPolicy::kLru ||
                         (lists_[kT1].size >= 1 && static_cast<double>(lists_[kT1].size) > arc_p_);
  const List first = prefer_t1 ? kT1 : kT2;
  const List lists[2] = {first, first == kT1 ? kT2 : kT1};
  for (List l : lists) {
    if (policy_ == EvictionPolicy::kLru && l == kT2) break;
    for (std::int32_t e = lists_[l].head; e >= 0; e = slab_[static_cast<std::size_t>(e)].next)
      order.push_back(slab_[static_cast<std::size_t>(e)].hash);
  }
  return order;
}

Status KvTierStore::CheckInvariants() const {
  // One pass over the entries in slab order rather than a walk along each list (a chain of
  // scattered loads through millions of entries, at the end of every tiered run): every entry
  // in use is linked both ways with neighbours on its own list, the entries without a
  // predecessor or successor are their list's ends, and the lists hold as many as they count.
  // (A cycle detached from every list's ends would pass; each list has one head and one tail.)
  const std::size_t n = slab_.size();
  std::vector<char> free(n, 0);
  for (std::int32_t e : free_slots_) {
    if (e < 0 || static_cast<std::size_t>(e) >= n || free[static_cast<std::size_t>(e)]++)
      return Status::Error("tier free slots are broken");
  }
  auto neighbour = [&](std::int32_t e, List list) {
    return e >= 0 && static_cast<std::size_t>(e) < n && !free[static_cast<std::size_t>(e)] &&
           slab_[static_cast<std::size_t>(e)].list == list;
  };
  std::int64_t seen = 0, writing = 0, pinned = 0, ghosts = 0;
  std::array<std::int64_t, kNumLists> counts{};
  constexpr std::size_t kAhead = 8;  // its scattered loads (neighbours, index slots) start early
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kAhead < n && !free[i + kAhead]) {
      const Entry& ahead = slab_[i + kAhead];
      if (ahead.prev >= 0) __builtin_prefetch(&slab_[static_cast<std::size_t>(ahead.prev)]);
      if (ahead.next >= 0) __builtin_prefetch(&slab_[static_cast<std::size_t>(ahead.next)]);
      entries_.Prefetch(ahead.hash);
    }
    if (free[i]) continue;
    const auto e = static_cast<std::int32_t>(i);
    const Entry& x = slab_[i];
    if (x.list >= kNumLists) return Status::Error("tier list is broken");
    const ListHead& l = lists_[x.list];
    const bool prev_ok =
        x.prev < 0 ? l.head == e
                   : neighbour(x.prev, x.list) && slab_[static_cast<std::size_t>(x.prev)].next == e;
    const bool next_ok =
        x.next < 0 ? l.tail == e
                   : neighbour(x.next, x.list) && slab_[static_cast<std::size_t>(x.next)].prev == e;
    if (!prev_ok || !next_ok) return Status::Error("tier list is broken");
    if (entries_.Find(x.hash) != e) return Status::Error("tier list entry missing from the index");
    const bool ghost = x.list == kB1 || x.list == kB2;
    if (ghost && (x.writing || x.pins))
      return Status::Error("a ghost entry is being written or read");
    ++counts[x.list];
    writing += x.writing;
    pinned += x.pins > 0;
    ghosts += ghost;
    ++seen;
  }
  for (int l = 0; l < kNumLists; ++l) {
    if (counts[static_cast<std::size_t>(l)] != lists_[l].size ||
        (lists_[l].size == 0) != (lists_[l].head < 0 && lists_[l].tail < 0))
      return Status::Error("tier list size does not match its list");
  }
  // Every entry in use is indexed under its hash: with equal counts, the index holds nothing else.
  if (seen != static_cast<std::int64_t>(entries_.size()))
    return Status::Error("tier index holds entries that are on no list");
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
