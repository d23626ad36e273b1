// The linear-probing core under the block index and the tier stores: doubling in place keeps
// every entry findable (runs that wrap around the end, probes that would wrap past the new end),
// and the reachability check finds a cut probe.
#include "policies/hash_index.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace duet::policies {
namespace {

struct Slot {
  std::uint64_t key = 0;
  bool full = false;
};
struct Traits {
  static std::uint64_t Key(const Slot& s) { return s.key; }
  static bool Empty(const Slot& s) { return !s.full; }
  static Slot EmptySlot() { return Slot{}; }
};
using Table = LinearProbeTable<Slot, Traits>;

void Insert(Table& t, std::uint64_t key) { t[t.FreeSlotFor(key)] = Slot{key, true}; }

void ExpectHolds(const Table& t, const std::set<std::uint64_t>& keys) {
  std::size_t full = 0;
  for (std::size_t i = 0; i < t.slots(); ++i) full += t[i].full;
  EXPECT_EQ(full, keys.size());
  for (std::uint64_t k : keys) EXPECT_NE(t.Find(k), Table::kNone) << k;
  EXPECT_TRUE(t.AllReachable());
}

TEST(LinearProbeTable, DoubleKeepsRunsThatWrapAroundTheEnd) {
  Table t(8);
  // Homes 6 and 7 fill slots 6, 7, 0, 1: the run wraps around the end. After doubling (16
  // slots) 14 and 15 have homes 14 and 15, 6 and 7 keep theirs.
  std::set<std::uint64_t> keys = {6, 7, 14, 15, 2};
  for (std::uint64_t k : keys) Insert(t, k);
  ASSERT_TRUE(t.AllReachable());
  t.Double();
  EXPECT_EQ(t.slots(), 16u);
  ExpectHolds(t, keys);
  EXPECT_EQ(t.Find(7), 7);  // home 7, alone there now
  EXPECT_EQ(t.Find(14), 14);
}

TEST(LinearProbeTable, DoublePlacesProbesThatWouldWrapPastTheNewEnd) {
  Table t(8);
  // All five keys have home 7 in the table of 8 slots and home 15 in the table of 16, so their
  // probe run in the new table goes from slot 15 past the end.
  std::set<std::uint64_t> keys = {15, 31, 47, 63, 79};
  for (std::uint64_t k : keys) Insert(t, k);
  t.Double();
  ExpectHolds(t, keys);
  EXPECT_EQ(t.Find(15), 15);
  EXPECT_EQ(t.Find(31), 0);  // wrapped to the start
}

TEST(LinearProbeTable, DoubleMatchesASetOverManyRandomTables) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    Table t(16);
    std::set<std::uint64_t> keys;
    const int n = 1 + static_cast<int>(rng() % 300);
    for (int i = 0; i < n; ++i) {
      // Keys over a narrow range of homes make long runs and wrap-arounds common.
      const std::uint64_t k = rng() % 4 == 0 ? (rng() << 8) | (0xF0 + rng() % 16) : rng();
      if (!keys.insert(k).second) continue;
      if ((keys.size()) * 4 > t.slots() * 3) t.Double();
      Insert(t, k);
    }
    ExpectHolds(t, keys);
    // Erase some and double again.
    for (auto it = keys.begin(); it != keys.end();) {
      if (rng() % 3 == 0) {
        t.EraseAt(static_cast<std::size_t>(t.Find(*it)));
        it = keys.erase(it);
      } else {
        ++it;
      }
    }
    t.Double();
    ExpectHolds(t, keys);
  }
}

TEST(LinearProbeTable, AllReachableFindsACutProbe) {
  Table t(16);
  for (std::uint64_t k : {3, 19, 35}) Insert(t, k);  // slots 3, 4, 5, all home 3
  ASSERT_TRUE(t.AllReachable());
  t[4] = Traits::EmptySlot();  // 35 in slot 5 can no longer be found
  EXPECT_FALSE(t.AllReachable());
  Table full(4);
  for (std::uint64_t k : {0, 1, 2, 3}) Insert(full, k);
  EXPECT_FALSE(full.AllReachable()) << "a table without an empty slot";
}

TEST(LinearProbeTable, CopiesAndMovesOwnTheirSlots) {
  Table a(16);
  Insert(a, 5);
  Table b = a;
  Insert(b, 21);
  EXPECT_EQ(a.Find(21), Table::kNone);
  Table c = std::move(b);
  EXPECT_NE(c.Find(21), Table::kNone);
  a = c;
  EXPECT_NE(a.Find(21), Table::kNone);
}

}  // namespace
}  // namespace duet::policies
