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

KvTierStore::KvTierStore(std::int64_t capacity_blocks, EvictionPolicy policy)
    : capacity_(capacity_blocks), policy_(policy), table_(kInitialSlots) {
  DUET_CHECK(capacity_blocks >= 0);
}

std::int32_t KvTierStore::NewEntry(BlockHash hash) {
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

void KvTierStore::Remove(std::int32_t i) {
  if (at(i).list != kUnlisted) Unlink(i);
  --entries_;
  // Later entries may move (queue records name entries by hash, so nothing else changes).
  table_.EraseAt(static_cast<std::size_t>(i));
}

void KvTierStore::Grow() {
  DUET_CHECK_MSG(table_.slots() * 2 <= (std::size_t{1} << 31), "tier store outgrew its 2^31 slots");
  table_.Double();
}

void KvTierStore::PushMru(std::int32_t i, List list) {
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

void KvTierStore::Unlink(std::int32_t i) {
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
  }
}

std::int32_t KvTierStore::Oldest(List list, bool evictable) {
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

bool KvTierStore::EvictFrom(List list, std::vector<BlockHash>* evicted) {
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

void KvTierStore::SpendIfFirst(List list, std::uint32_t pos) {
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

KvTierStore::WriteStart KvTierStore::BeginWrite(BlockHash hash, std::vector<BlockHash>* evicted) {
  if (capacity_ == 0) return WriteStart::kNoRoom;
  List target = kMain;
  bool hit_in_b2 = false;
  std::int32_t ghost = Find(hash);
  if (ghost >= 0 && at(ghost).list != kB1 && at(ghost).list != kB2) return WriteStart::kPresent;
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
      if (!ArcReplace(hit_in_b2, evicted)) return WriteStart::kNoRoom;
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
  at(i).writing = 1;
  PushMru(i, target);
  ++writing_;
  peak_used_ = std::max(peak_used_, used_blocks());
  return WriteStart::kStarted;
}

void KvTierStore::EndWrite(BlockHash hash) {
  const std::int32_t i = Find(hash);
  DUET_CHECK_MSG(i >= 0 && at(i).writing, "EndWrite of a block that is not being written");
  at(i).writing = 0;
  --writing_;
}

void KvTierStore::AbortWrite(BlockHash hash) {
  const std::int32_t i = Find(hash);
  DUET_CHECK_MSG(i >= 0 && at(i).writing, "AbortWrite of a block that is not being written");
  --writing_;
  Remove(i);
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
    if (ghost && (x.writing || x.pins))
      return Status::Error("a ghost entry is being written or read");
    ++counts[x.list];
    writing += x.writing;
    pinned += x.pins > 0;
    ghosts += ghost;
    ++entries;
  }
  for (int l = 0; l < kNumLists; ++l) {
    if (counts[static_cast<std::size_t>(l)] != lists_[l].size)
      return Status::Error("tier list size does not match its list");
  }
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
