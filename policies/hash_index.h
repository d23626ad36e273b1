// A flat hash index from 64-bit block hashes to block ids, for the KV block manager's prefix
// cache and the lower KV tiers: open addressing with linear probing and backward-shift
// deletion. Fixed capacity with Insert (the number of blocks bounds the entries; no allocation
// after construction), or growing by doubling with InsertGrowing. Keys must be well
// mixed (chained block hashes are), so their low bits pick the slot directly.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace duet::policies {

class BlockHashIndex {
 public:
  static constexpr std::int32_t kAbsent = -1;

  explicit BlockHashIndex(std::int64_t max_entries) {
    std::size_t capacity = 16;
    while (capacity < static_cast<std::size_t>(max_entries) * 2) capacity <<= 1;
    slots_.assign(capacity, Slot{0, kAbsent});
    mask_ = capacity - 1;
  }

  std::int32_t Find(std::uint64_t key) const {
    for (std::size_t i = key & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.value == kAbsent) return kAbsent;
      if (s.key == key) return s.value;
    }
  }

  // Starts loading the slot where `key`'s probe begins (a hint: no effect on contents). Loops
  // over many keys prefetch a few ahead: their probes are cache misses that can overlap.
  void Prefetch(std::uint64_t key) const { __builtin_prefetch(&slots_[key & mask_]); }

  // Inserts key -> value unless the key is present. Returns true if inserted.
  bool Insert(std::uint64_t key, std::int32_t value) {
    DUET_CHECK(value != kAbsent && size_ * 2 <= slots_.size());
    std::size_t i = key & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].value == kAbsent) break;
      if (slots_[i].key == key) return false;
    }
    slots_[i] = Slot{key, value};
    ++size_;
    return true;
  }

  // Inserts like Insert, first doubling the table when it would become more than half full.
  bool InsertGrowing(std::uint64_t key, std::int32_t value) {
    if ((size_ + 1) * 2 > slots_.size()) Rehash(slots_.size() * 2);
    return Insert(key, value);
  }

  void Erase(std::uint64_t key) {
    std::size_t i = key & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].value == kAbsent) return;
      if (slots_[i].key == key) break;
    }
    // Backward shift: move later entries of the probe run into the hole where allowed.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; slots_[j].value != kAbsent; j = (j + 1) & mask_) {
      const std::size_t home = slots_[j].key & mask_;
      // Entry j may fill the hole if its home is not in the cyclic range (hole, j].
      const bool home_in_range =
          hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (!home_in_range) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{0, kAbsent};
    --size_;
  }

  std::size_t size() const { return size_; }

  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.value != kAbsent) f(s.key, s.value);
    }
  }

 private:
  struct Slot {
    std::uint64_t key;
    std::int32_t value;
  };
  void Rehash(std::size_t capacity) {
    std::vector<Slot> old(capacity, Slot{0, kAbsent});
    old.swap(slots_);
    mask_ = capacity - 1;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.value != kAbsent) Insert(s.key, s.value);
    }
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace duet::policies
