// Flat hash tables keyed by 64-bit block hashes: open addressing over a power of two of slots,
// linear probing, backward-shift deletion. Keys must be well mixed (chained block hashes are),
// so their low bits pick the slot directly.
//
// LinearProbeTable is the probing core, over slots of the caller's type: the KV block manager's
// prefix cache and the router's KV event index use it through BlockHashIndex (hash -> block
// id), and a lower KV tier's store keeps its entries in the slots themselves (kv_tier_store.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/status.h"

namespace duet::policies {

// Traits: `static std::uint64_t Key(const Slot&)`, `static bool Empty(const Slot&)`, and
// `static Slot EmptySlot()`.
template <typename Slot, typename Traits>
class LinearProbeTable {
  // Slots live in malloc'd memory so that doubling can realloc: a large table then keeps its
  // pages (the kernel remaps them), where a fresh array would fault in and zero new ones for
  // every slot, the old table's size over again.
  static_assert(std::is_trivially_copyable_v<Slot>);

 public:
  static constexpr std::int64_t kNone = -1;

  explicit LinearProbeTable(std::size_t slots) {
    DUET_CHECK(slots > 0 && (slots & (slots - 1)) == 0);
    Resize(slots);
    std::fill(slots_, slots_ + slots, Traits::EmptySlot());
  }
  LinearProbeTable(const LinearProbeTable& other) {
    Resize(other.slots());
    std::copy(other.slots_, other.slots_ + other.slots(), slots_);
  }
  LinearProbeTable(LinearProbeTable&& other) noexcept
      : slots_(std::exchange(other.slots_, nullptr)), mask_(std::exchange(other.mask_, 0)) {}
  LinearProbeTable& operator=(LinearProbeTable other) noexcept {
    std::swap(slots_, other.slots_);
    std::swap(mask_, other.mask_);
    return *this;
  }
  ~LinearProbeTable() { std::free(slots_); }

  std::size_t slots() const { return slots_ ? mask_ + 1 : 0; }
  Slot& operator[](std::size_t i) { return slots_[i]; }
  const Slot& operator[](std::size_t i) const { return slots_[i]; }

  // The slot holding `key` (*found set), or else the empty slot where it goes.
  std::size_t Probe(std::uint64_t key, bool* found) const {
    for (std::size_t i = key & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      *found = !Traits::Empty(s);
      if (!*found || Traits::Key(s) == key) return i;
    }
  }
  // The slot holding `key`, or kNone.
  std::int64_t Find(std::uint64_t key) const {
    bool found;
    const std::size_t i = Probe(key, &found);
    return found ? static_cast<std::int64_t>(i) : kNone;
  }
  // The empty slot where `key`, which the table does not hold, goes.
  std::size_t FreeSlotFor(std::uint64_t key) const {
    std::size_t i = key & mask_;
    while (!Traits::Empty(slots_[i])) i = (i + 1) & mask_;
    return i;
  }
  // Starts loading the slot where `key`'s probe begins (a hint: no effect on contents). Loops
  // over many keys prefetch a few ahead: their probes are cache misses that can overlap.
  void Prefetch(std::uint64_t key) const { __builtin_prefetch(&slots_[key & mask_]); }

  // Empties slot i. Backward shift: later slots of its probe run move into the hole where their
  // probe allows, so no empty slot cuts a probe; slots after i may move.
  void EraseAt(std::size_t i) {
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; !Traits::Empty(slots_[j]); j = (j + 1) & mask_) {
      const std::size_t home = Traits::Key(slots_[j]) & mask_;
      // Slot j may fill the hole if its home is not in the cyclic range (hole, j].
      const bool home_in_range =
          hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (!home_in_range) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Traits::EmptySlot();
  }

  // Whether every entry can be found: none has an empty slot between its home and its slot. One
  // pass in slot order, no probing. False also for a table with no empty slot.
  bool AllReachable() const {
    const std::size_t n = slots();
    std::size_t e = 0;
    while (e < n && !Traits::Empty(slots_[e])) ++e;
    if (e == n) return false;
    std::size_t run = 0;  // full slots just before the one visited
    for (std::size_t k = 1; k < n; ++k) {
      const std::size_t i = (e + k) & mask_;
      if (Traits::Empty(slots_[i])) {
        run = 0;
        continue;
      }
      // The home must lie in this run of full slots: at most `run` slots back, cyclically.
      if (((i - Traits::Key(slots_[i])) & mask_) > run) return false;
      ++run;
    }
    return true;
  }

  // Doubles the slots in place; entries may move. The table must have an empty slot.
  //
  // An entry's home h becomes h or h + n (n: the old size). Entries are taken out and put back
  // in slot order, starting after an empty slot s so that no old probe run wraps into slots not
  // yet visited. The entry taken from slot i lands at or before slot i (now empty) if its home
  // stays h; else in the new half, or past its end into slots before i. Either way its probe
  // crosses only entries already put back, which never move again, so no later step cuts it.
  // The entries before s (the run wrapping from the end to the start) wait aside and go in last,
  // into a consistent table.
  void Double() {
    const std::size_t n = slots();
    DUET_CHECK_MSG(n <= (std::size_t{1} << 62) / sizeof(Slot), "hash table too large");
    Resize(2 * n);
    std::fill(slots_ + n, slots_ + 2 * n, Traits::EmptySlot());
    std::size_t s = 0;
    while (s < n && !Traits::Empty(slots_[s])) ++s;
    DUET_CHECK_MSG(s < n, "Double of a full hash table");
    std::vector<Slot> aside(slots_, slots_ + s);
    std::fill(slots_, slots_ + s, Traits::EmptySlot());
    for (std::size_t i = s + 1; i < n; ++i) {
      if (Traits::Empty(slots_[i])) continue;
      const Slot x = slots_[i];
      slots_[i] = Traits::EmptySlot();
      slots_[FreeSlotFor(Traits::Key(x))] = x;
    }
    for (const Slot& x : aside) slots_[FreeSlotFor(Traits::Key(x))] = x;
  }

 private:
  // Sets the size to `slots` (a power of two), keeping the first min(old, new) slots.
  void Resize(std::size_t slots) {
    void* p = std::realloc(slots_, slots * sizeof(Slot));
    if (p == nullptr) throw std::bad_alloc();
    slots_ = static_cast<Slot*>(p);
    mask_ = slots - 1;
  }

  Slot* slots_ = nullptr;
  std::size_t mask_ = 0;
};

// Block hash -> block id. Fixed capacity with Insert (the number of blocks bounds the entries;
// no allocation after construction), or growing by doubling with InsertGrowing.
class BlockHashIndex {
 public:
  static constexpr std::int32_t kAbsent = -1;

  explicit BlockHashIndex(std::int64_t max_entries) : table_(SlotsFor(max_entries)) {}

  std::int32_t Find(std::uint64_t key) const {
    const std::int64_t i = table_.Find(key);
    return i == Table::kNone ? kAbsent : table_[static_cast<std::size_t>(i)].value;
  }

  void Prefetch(std::uint64_t key) const { table_.Prefetch(key); }

  // Inserts key -> value unless the key is present. Returns true if inserted.
  bool Insert(std::uint64_t key, std::int32_t value) {
    DUET_CHECK(value != kAbsent && size_ * 2 <= table_.slots());
    bool found;
    const std::size_t i = table_.Probe(key, &found);
    if (found) return false;
    table_[i] = Slot{key, value};
    ++size_;
    return true;
  }

  // Inserts like Insert, first doubling the table when it would become more than half full.
  bool InsertGrowing(std::uint64_t key, std::int32_t value) {
    if ((size_ + 1) * 2 > table_.slots()) table_.Double();
    return Insert(key, value);
  }

  void Erase(std::uint64_t key) {
    const std::int64_t i = table_.Find(key);
    if (i == Table::kNone) return;
    table_.EraseAt(static_cast<std::size_t>(i));
    --size_;
  }

  std::size_t size() const { return size_; }

  template <typename F>
  void ForEach(F&& f) const {
    for (std::size_t i = 0; i < table_.slots(); ++i) {
      if (table_[i].value != kAbsent) f(table_[i].key, table_[i].value);
    }
  }

 private:
  struct Slot {
    std::uint64_t key;
    std::int32_t value;
  };
  struct Traits {
    static std::uint64_t Key(const Slot& s) { return s.key; }
    static bool Empty(const Slot& s) { return s.value == kAbsent; }
    static Slot EmptySlot() { return Slot{0, kAbsent}; }
  };
  using Table = LinearProbeTable<Slot, Traits>;

  static std::size_t SlotsFor(std::int64_t max_entries) {
    std::size_t capacity = 16;
    while (capacity < static_cast<std::size_t>(max_entries) * 2) capacity <<= 1;
    return capacity;
  }

  Table table_;
  std::size_t size_ = 0;
};

}  // namespace duet::policies
