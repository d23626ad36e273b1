// Flat hash tables keyed by 64-bit block hashes: open addressing over a power of two of slots,
// linear probing, backward-shift deletion. Keys must be well mixed (chained block hashes are),
// so their low bits pick the slot directly.
//
// LinearProbeTable is the probing core, over slots of the caller's type: the KV block manager's
// prefix cache and the router's KV event index use it through BlockHashIndex (hash -> block
// id), and a lower KV tier's store keeps its entries in the slots themselves (kv_tier_store.h).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace duet::policies {

// Traits: `static std::uint64_t Key(const Slot&)`, `static bool Empty(const Slot&)`, and
// `static Slot EmptySlot()`.
template <typename Slot, typename Traits>
class LinearProbeTable {
 public:
  static constexpr std::int64_t kNone = -1;

  explicit LinearProbeTable(std::size_t slots) { Reset(slots); }

  std::size_t slots() const { return slots_.size(); }
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

  // Moves every entry into a table of `slots` slots (a power of two, more than the entries).
  void Rehash(std::size_t slots) {
    std::vector<Slot> old;
    old.swap(slots_);
    Reset(slots);
    for (const Slot& s : old) {
      if (!Traits::Empty(s)) slots_[FreeSlotFor(Traits::Key(s))] = s;
    }
  }

 private:
  void Reset(std::size_t slots) {
    DUET_CHECK(slots > 0 && (slots & (slots - 1)) == 0);
    slots_.assign(slots, Traits::EmptySlot());
    mask_ = slots - 1;
  }

  std::vector<Slot> slots_;
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
    if ((size_ + 1) * 2 > table_.slots()) table_.Rehash(table_.slots() * 2);
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
