// A worker's clock set to its frontend's from probes: the offset's bound holds whatever the
// two directions' delays are, a looser later probe does not replace a tighter one until drift
// has grown the tighter one's error past it, and the clock never goes back.
#include "backend/cluster/clock_sync.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace duet::backend::cluster {
namespace {

constexpr std::int64_t kMs = 1'000'000;

// A probe between a worker and a frontend whose clock reads `offset` more, with `up` and
// `down` the two directions' delays and `held` the frontend's time on it.
Result<ClockSample> Probe(std::int64_t t0, std::int64_t offset, std::int64_t up, std::int64_t held,
                          std::int64_t down) {
  const std::int64_t t1 = t0 + up + offset;
  const std::int64_t t2 = t1 + held;
  const std::int64_t t3 = t2 - offset + down;
  return SampleOfProbe(t0, t1, t2, t3);
}

TEST(ClockSync, TheTrueOffsetIsWithinTheBoundWhateverTheDelays) {
  const std::int64_t offset = -37'000 * 1'000 * kMs;  // a worker 37000 s ahead
  for (std::int64_t up : {std::int64_t{0}, std::int64_t{1}, 3 * kMs, 40 * kMs}) {
    for (std::int64_t down : {std::int64_t{0}, std::int64_t{7}, 2 * kMs, 90 * kMs}) {
      auto s = Probe(5 * kMs, offset, up, kMs / 10, down);
      ASSERT_TRUE(s.ok()) << s.error();
      EXPECT_LE(s->offset_ns - s->error_ns, offset) << up << " " << down;
      EXPECT_GE(s->offset_ns + s->error_ns, offset) << up << " " << down;
      // The bound is half the round trip less the frontend's time on it, no looser.
      EXPECT_LE(s->error_ns, (up + down) / 2 + 1);
    }
  }
  // Symmetric delays: the offset exactly.
  auto s = Probe(0, offset, 2 * kMs, kMs, 2 * kMs);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->offset_ns, offset);
  EXPECT_EQ(s->error_ns, 2 * kMs);
}

TEST(ClockSync, TimesThatCannotComeFromOneProbeAreRefused) {
  EXPECT_FALSE(SampleOfProbe(10, 0, 0, 9).ok());   // back before it left
  EXPECT_FALSE(SampleOfProbe(0, 10, 9, 20).ok());  // sent before it arrived
  auto held = SampleOfProbe(0, 0, 30, 20);         // held 30 of a 20 ns round trip
  ASSERT_FALSE(held.ok());
  EXPECT_NE(held.error().find("longer"), std::string::npos);
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_FALSE(SampleOfProbe(kMin, kMax, kMax, kMax).ok());  // no overflow, no 300-year offset
}

TEST(ClockSync, ADriftedTightSampleGivesWayToALooserFreshOne) {
  SyncedClock clock;
  EXPECT_FALSE(clock.Current());
  const ClockSample tight{1000 * kMs, kMs / 10, 0};
  ASSERT_TRUE(clock.Offer(tight));
  // A looser one a second later: the tight one's error has grown by 0.1 ms only.
  EXPECT_FALSE(clock.Offer({1001 * kMs, kMs, 1000 * kMs}));
  // A minute later it has grown by 6 ms: a 1 ms sample is tighter now.
  EXPECT_EQ(tight.ErrorAt(60'000 * kMs), kMs / 10 + 6 * kMs);
  EXPECT_TRUE(clock.Offer({1002 * kMs, kMs, 60'000 * kMs}));
}

TEST(ClockSync, TheClockStepsToItsFirstOffsetAndNeverGoesBack) {
  SyncedClock clock;
  ASSERT_TRUE(clock.Offer({-SteadyNowNs() + 50 * kMs, 0, SteadyNowNs()}));
  const Seconds before = clock.Now();
  EXPECT_GE(before, 0.050);
  EXPECT_LT(before, 5.0);
  // An offset 40 ms lower, past kClockStepNs: stepped, the clock holding until its steady time
  // caught up.
  ASSERT_TRUE(clock.Offer({-SteadyNowNs() + 10 * kMs, 0, SteadyNowNs()}));
  EXPECT_LT(clock.Current()->offset_ns + SteadyNowNs(), 20 * kMs);
  const Seconds held = clock.Now();
  EXPECT_GE(held, before);
  EXPECT_LT(held, before + 0.030);
}

// A small correction is slewed: no duration measured on the clock is off by more than
// kMaxClockSlew, and the reported error covers how far the offset has yet to go.
TEST(ClockSync, ASmallCorrectionIsSlewedNotStepped) {
  SyncedClock clock;
  const std::int64_t start = SteadyNowNs();
  ASSERT_TRUE(clock.Offer({-start, 0, start}));  // the run's second 0 is now
  const std::int64_t at = SteadyNowNs();
  ASSERT_TRUE(clock.Offer({-start + 5 * kMs, 0, at}));  // 5 ms ahead: under kClockStepNs
  const Seconds a = clock.Now();
  const std::int64_t a_steady = SteadyNowNs();
  auto current = clock.Current();
  ASSERT_TRUE(current);
  EXPECT_LT(current->offset_ns, -start + kMs);  // barely moved yet
  EXPECT_GE(current->error_ns, 4 * kMs);        // and says so
  // 20 ms of steady time later, the clock has moved 20 ms and at most 10 us more.
  while (SteadyNowNs() < a_steady + 20 * kMs) {
  }
  const Seconds b = clock.Now();
  const double steady_s = static_cast<double>(SteadyNowNs() - a_steady) * 1e-9;
  EXPECT_GE(b - a, steady_s - 1e-4);
  EXPECT_LE(b - a, steady_s * (1 + kMaxClockSlew) + 1e-4);
}

}  // namespace
}  // namespace duet::backend::cluster
