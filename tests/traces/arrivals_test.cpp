// Tests of Arrivals, which decides when each request of a trace is sent: open loop at the
// trace's times, dependents (sessions, `after`) once their dependencies finished plus their
// delay and not before their arrival bound, drops of whatever depends on a request that did
// not complete, and a closed loop of N users.
#include "traces/arrivals.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "tests/traces/test_util.h"
#include "traces/trace.h"

namespace duet::traces {
namespace {

using testing::ContainsAll;

// One request of a hand-built trace: its arrival (bound), dependencies and delay.
struct Spec {
  Seconds arrival_s = 0;
  std::optional<std::uint64_t> parent;
  std::vector<std::uint64_t> after;
  Seconds delay_s = 0;
};

// Requests with ids 0..n-1 (positions), in the given (sorted) order.
Trace MakeTrace(const std::vector<Spec>& specs) {
  Trace trace;
  trace.source = "made";
  for (std::size_t i = 0; i < specs.size(); ++i) {
    TraceRequest r;
    r.id = i;
    r.arrival_s = specs[i].arrival_s;
    r.input_tokens = 100;
    r.output_tokens = 10;
    r.parent = specs[i].parent;
    if (r.parent) {
      r.context_tokens = 110;
      r.input_tokens += r.context_tokens;
    }
    r.after = specs[i].after;
    r.delay_s = specs[i].delay_s;
    trace.requests.push_back(r);
  }
  return trace;
}

// Requests without dependencies at the given times.
Trace Roots(const std::vector<Seconds>& arrivals_s) {
  std::vector<Spec> specs;
  for (Seconds t : arrivals_s) specs.push_back({t, std::nullopt, {}, 0});
  return MakeTrace(specs);
}

Arrivals Make(const Trace& trace, const ClosedLoop& loop = {}) {
  auto arrivals = Arrivals::Create(trace, loop);
  EXPECT_TRUE(arrivals.ok()) << arrivals.error();
  return std::move(arrivals).value();
}

// Takes the due request at `now`, expecting request `index` sent at `arrival_s`.
::testing::AssertionResult Takes(Arrivals& a, Seconds now, std::size_t index, Seconds arrival_s) {
  auto due = a.TakeDue(now);
  if (!due) return ::testing::AssertionFailure() << "nothing due at " << now;
  if (due->index != index || due->arrival_s != arrival_s) {
    return ::testing::AssertionFailure()
           << "at " << now << ": request " << due->index << " at " << due->arrival_s
           << ", expected " << index << " at " << arrival_s;
  }
  return ::testing::AssertionSuccess();
}

// ---- Open loop -------------------------------------------------------------------------------

TEST(ArrivalsOpenLoop, SendsInOrderAtTraceTimesAndIsNotDynamic) {
  const Trace trace = Roots({0, 1, 1, 2.5});
  Arrivals a = Make(trace);
  EXPECT_FALSE(a.dynamic());
  EXPECT_EQ(a.NextArrival(), 0.0);
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_FALSE(a.TakeDue(0.999));
  EXPECT_EQ(a.NextArrival(), 1.0);
  // Called late: the requests due come out one by one, in trace order, at their own times.
  EXPECT_TRUE(Takes(a, 5, 1, 1));
  EXPECT_TRUE(Takes(a, 5, 2, 1));
  EXPECT_FALSE(a.Exhausted());
  EXPECT_TRUE(Takes(a, 5, 3, 2.5));
  EXPECT_FALSE(a.TakeDue(100));
  EXPECT_FALSE(a.NextArrival());
  EXPECT_TRUE(a.Exhausted());
  EXPECT_EQ(a.released(), 4u);
  EXPECT_EQ(a.user(0), -1);
  // Finishing (or failing) changes nothing in an open loop without dependencies.
  a.OnFinished(0, 3, false);
  EXPECT_FALSE(a.TakeDropped());
  EXPECT_TRUE(a.Exhausted());
}

// ---- Dependencies ----------------------------------------------------------------------------

TEST(ArrivalsDependencies, FollowUpIsDueAtParentFinishPlusDelayAndNotBeforeItsBound) {
  // 0: a session's first turn; 1: its second turn, 2 s after 0 finished; 2: an unrelated
  // request; 3: the third turn, 1 s after 1 finished but not before its bound of 10 s.
  const Trace trace = MakeTrace(
      {{0, std::nullopt, {}, 0}, {0, 0, {}, 2}, {0.5, std::nullopt, {}, 0}, {10, 1, {}, 1}});
  Arrivals a = Make(trace);
  EXPECT_TRUE(a.dynamic());
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_FALSE(a.TakeDue(0));  // 1 waits for 0 to finish
  EXPECT_EQ(a.NextArrival(), 0.5);
  EXPECT_TRUE(Takes(a, 0.5, 2, 0.5));
  EXPECT_FALSE(a.NextArrival());  // everything left waits on a request in flight
  EXPECT_FALSE(a.Exhausted());

  a.OnFinished(2, 1, true);  // nothing depends on it
  EXPECT_FALSE(a.NextArrival());
  a.OnFinished(0, 3.25, true);
  EXPECT_EQ(a.NextArrival(), 5.25);
  EXPECT_FALSE(a.TakeDue(5.0));
  EXPECT_TRUE(Takes(a, 5.25, 1, 5.25));
  EXPECT_FALSE(a.NextArrival());

  a.OnFinished(1, 6, true);  // 6 + 1 s < the bound of 10 s
  EXPECT_EQ(a.NextArrival(), 10.0);
  EXPECT_FALSE(a.TakeDue(9.999));
  EXPECT_FALSE(a.Exhausted());
  EXPECT_TRUE(Takes(a, 10, 3, 10));
  EXPECT_TRUE(a.Exhausted());  // request 3 is in flight, but nothing more will be sent
  EXPECT_EQ(a.released(), 4u);
  EXPECT_FALSE(a.TakeDropped());
}

TEST(ArrivalsDependencies, AfterTwoRequestsWaitsForTheLaterFinish) {
  // 2 waits for 0 and 1 (0 named twice: as parent and in `after`), 0.5 s after the later.
  const Trace trace =
      MakeTrace({{0, std::nullopt, {}, 0}, {1, std::nullopt, {}, 0}, {1, 0, {1, 0}, 0.5}});
  Arrivals a = Make(trace);
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_TRUE(Takes(a, 1, 1, 1));
  a.OnFinished(1, 4, true);
  EXPECT_FALSE(a.NextArrival());  // 0 is still running
  EXPECT_FALSE(a.TakeDue(100));
  a.OnFinished(0, 6, true);
  EXPECT_EQ(a.NextArrival(), 6.5);
  EXPECT_TRUE(Takes(a, 7, 2, 6.5));
  EXPECT_TRUE(a.Exhausted());
}

TEST(ArrivalsDependencies, TheEarlierFinishDoesNotCountForTheDelay) {
  // The same with the finishes the other way round: the later one still decides.
  const Trace trace = MakeTrace(
      {{0, std::nullopt, {}, 0}, {1, std::nullopt, {}, 0}, {1, std::nullopt, {0, 1}, 0.5}});
  Arrivals a = Make(trace);
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_TRUE(Takes(a, 1, 1, 1));
  a.OnFinished(0, 2, true);
  EXPECT_FALSE(a.NextArrival());
  a.OnFinished(1, 8, true);
  EXPECT_TRUE(Takes(a, 8.5, 2, 8.5));
}

TEST(ArrivalsDependencies, RejectedRequestDropsItsDependentsTransitively) {
  // 0 <- 1 <- 2 <- 3 (3 by `after`); 5 waits for 4 and 0; 6 waits for 4 only.
  const Trace trace = MakeTrace({{0, std::nullopt, {}, 0},
                                 {0, 0, {}, 1},
                                 {0, 1, {}, 1},
                                 {0, std::nullopt, {2}, 0},
                                 {0, std::nullopt, {}, 0},
                                 {0, std::nullopt, {4, 0}, 0},
                                 {0, 4, {}, 0}});
  Arrivals a = Make(trace);
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_TRUE(Takes(a, 0, 4, 0));
  EXPECT_FALSE(a.TakeDue(0));
  a.OnFinished(4, 1, true);
  EXPECT_TRUE(Takes(a, 1, 6, 1));  // 6 depended on 4 only
  EXPECT_FALSE(a.TakeDropped());
  EXPECT_FALSE(a.TakeDue(1));  // 5 still waits for 0
  a.OnFinished(0, 2, /*completed=*/false);
  EXPECT_FALSE(a.TakeDue(100));
  EXPECT_FALSE(a.NextArrival());
  // Each dropped request names its dependency that did not complete (rejected, or dropped).
  std::vector<std::pair<std::size_t, std::size_t>> dropped;
  while (true) {
    const bool exhausted = a.Exhausted();
    auto d = a.TakeDropped();
    if (!d) {
      EXPECT_TRUE(exhausted);
      break;
    }
    EXPECT_FALSE(exhausted) << "exhausted with drops left to take";
    dropped.emplace_back(d->index, d->cause);
  }
  std::sort(dropped.begin(), dropped.end());
  EXPECT_EQ(dropped,
            (std::vector<std::pair<std::size_t, std::size_t>>{{1, 0}, {2, 1}, {3, 2}, {5, 0}}));
  EXPECT_TRUE(a.Exhausted());
  EXPECT_EQ(a.released(), 7u);  // 3 sent, 4 dropped
}

TEST(ArrivalsDependencies, ExhaustedOnlyOnceEveryDropWasTaken) {
  const Trace trace = MakeTrace({{0, std::nullopt, {}, 0}, {0, 0, {}, 0}, {0, 1, {}, 0}});
  Arrivals a = Make(trace);
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_FALSE(a.Exhausted());
  a.OnFinished(0, 1, false);
  EXPECT_FALSE(a.Exhausted());
  auto first = a.TakeDropped();
  ASSERT_TRUE(first);
  EXPECT_FALSE(a.Exhausted());
  auto second = a.TakeDropped();
  ASSERT_TRUE(second);
  EXPECT_TRUE(a.Exhausted());
  EXPECT_FALSE(a.TakeDropped());
  EXPECT_EQ(a.released(), 3u);
}

TEST(ArrivalsDependencies, FailureAfterAnotherDependencyCompletedStillDrops) {
  // 2 waits for 0 and 1; 0 completes, then 1 fails; a later finish of nothing changes that.
  const Trace trace =
      MakeTrace({{0, std::nullopt, {}, 0}, {0, std::nullopt, {}, 0}, {0, std::nullopt, {0, 1}, 0}});
  Arrivals a = Make(trace);
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_TRUE(Takes(a, 0, 1, 0));
  a.OnFinished(0, 1, true);
  a.OnFinished(1, 2, false);
  auto d = a.TakeDropped();
  ASSERT_TRUE(d);
  EXPECT_EQ(d->index, 2u);
  EXPECT_EQ(d->cause, 1u);
  EXPECT_FALSE(a.TakeDue(100));
  EXPECT_TRUE(a.Exhausted());
}

TEST(ArrivalsDependencies, IdsNeedNotBePositions) {
  // After a selection ids keep their file positions: 10 and 11 here, 11 following 10.
  Trace trace = MakeTrace({{0, std::nullopt, {}, 0}, {0, 0, {}, 0.5}});
  trace.requests[0].id = 10;
  trace.requests[1].id = 11;
  trace.requests[1].parent = 10;
  Arrivals a = Make(trace);
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  a.OnFinished(0, 1, true);
  EXPECT_TRUE(Takes(a, 1.5, 1, 1.5));
  EXPECT_TRUE(a.Exhausted());
}

// A parent also listed in `after` is still the parent (its context is continued), counted once.
TEST(ArrivalsDependencies, AParentAlsoInAfterStaysTheParent) {
  Trace trace = MakeTrace({{0, std::nullopt, {}, 0}, {0, std::nullopt, {}, 0}, {0, 0, {1, 0}, 0}});
  trace.requests[0].session = "a";
  trace.requests[2].session = "a";
  trace.requests[1].session = "b";
  Arrivals a = Make(trace);
  EXPECT_EQ(a.parent(2), 0u);
  EXPECT_EQ(a.continuations_left(0), 1u);
  EXPECT_EQ(a.continuations_left(1), 0u);
  EXPECT_EQ(a.session(0), 0);
  EXPECT_EQ(a.session(1), 1);
  EXPECT_EQ(a.session(2), 0);
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_TRUE(Takes(a, 0, 1, 0));
  a.OnFinished(1, 1, true);
  EXPECT_FALSE(a.TakeDue(5));  // still waits for its parent
  a.OnFinished(0, 2, true);
  EXPECT_TRUE(Takes(a, 2, 2, 2));
  EXPECT_EQ(a.continuations_left(0), 0u);  // sent: its parent's context is no longer needed
  EXPECT_TRUE(a.Exhausted());
}

// ---- Closed loop -----------------------------------------------------------------------------

TEST(ArrivalsClosedLoop, UsersSendTheNextRequestAfterThinkTime) {
  const Trace trace = Roots({0, 0.1, 0.2, 50, 60});  // arrival times do not matter
  Arrivals a = Make(trace, {2, 0.5, 100});
  EXPECT_TRUE(a.dynamic());
  EXPECT_EQ(a.NextArrival(), 0.0);
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_TRUE(Takes(a, 0, 1, 0));
  EXPECT_EQ(a.user(0), 0);
  EXPECT_EQ(a.user(1), 1);
  EXPECT_EQ(a.user(2), -1);    // not sent yet
  EXPECT_FALSE(a.TakeDue(0));  // both users are busy
  EXPECT_FALSE(a.NextArrival());
  EXPECT_FALSE(a.Exhausted());

  a.OnFinished(1, 2, true);
  EXPECT_EQ(a.NextArrival(), 2.5);
  EXPECT_FALSE(a.TakeDue(2.4));
  EXPECT_TRUE(Takes(a, 2.5, 2, 2.5));
  EXPECT_EQ(a.user(2), 1);
  a.OnFinished(0, 3, /*completed=*/false);  // a rejected request frees its user too
  EXPECT_TRUE(Takes(a, 4, 3, 3.5));
  EXPECT_EQ(a.user(3), 0);
  a.OnFinished(2, 5, true);
  EXPECT_FALSE(a.Exhausted());
  EXPECT_TRUE(Takes(a, 5.5, 4, 5.5));
  // The trace is used up: nothing more is sent, though requests are in flight.
  EXPECT_TRUE(a.Exhausted());
  EXPECT_FALSE(a.NextArrival());
  EXPECT_EQ(a.released(), 5u);
  EXPECT_FALSE(a.TakeDropped());
}

TEST(ArrivalsClosedLoop, NothingIsSentAtOrAfterTheDuration) {
  const Trace trace = Roots({0, 0, 0, 0, 0, 0});
  Arrivals a = Make(trace, {2, 1, 10});
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_TRUE(Takes(a, 0, 1, 0));
  a.OnFinished(0, 8.5, true);  // user 0 ready at 9.5
  a.OnFinished(1, 9, true);    // user 1 ready at exactly 10: too late
  EXPECT_EQ(a.NextArrival(), 9.5);
  EXPECT_TRUE(Takes(a, 9.5, 2, 9.5));
  EXPECT_FALSE(a.NextArrival());
  EXPECT_FALSE(a.TakeDue(10));
  EXPECT_FALSE(a.TakeDue(1000));
  EXPECT_FALSE(a.Exhausted());  // request 2 is in flight and its user could send again
  a.OnFinished(2, 9.8, true);   // ready at 10.8
  EXPECT_FALSE(a.TakeDue(11));
  EXPECT_TRUE(a.Exhausted());  // the duration passed and nobody is busy
  EXPECT_EQ(a.released(), 3u);
}

TEST(ArrivalsClosedLoop, MoreUsersThanRequests) {
  const Trace trace = Roots({0, 0});
  Arrivals a = Make(trace, {5, 0, std::numeric_limits<double>::infinity()});
  EXPECT_TRUE(Takes(a, 0, 0, 0));
  EXPECT_TRUE(Takes(a, 0, 1, 0));
  EXPECT_FALSE(a.TakeDue(0));
  EXPECT_TRUE(a.Exhausted());
}

// ---- Errors ----------------------------------------------------------------------------------

TEST(ArrivalsErrors, ClosedLoopOverATraceWithDependencies) {
  const Trace trace = MakeTrace({{0, std::nullopt, {}, 0}, {0, 0, {}, 0}});
  auto a = Arrivals::Create(trace, {4, 0, 60});
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(ContainsAll(a.error(), {"made:", "closed loop", "open loop"}));
}

TEST(ArrivalsErrors, DependencyMissingFromTheTrace) {
  Trace trace = MakeTrace({{0, std::nullopt, {}, 0}, {0, std::nullopt, {}, 0}});
  trace.requests[1].after = {7};
  auto a = Arrivals::Create(trace);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(ContainsAll(a.error(), {"made:", "request 1", "request 7", "not in the trace"}));

  trace.requests[1].after.clear();
  trace.requests[1].parent = 9;
  auto parent = Arrivals::Create(trace);
  ASSERT_FALSE(parent.ok());
  EXPECT_TRUE(ContainsAll(parent.error(), {"request 1", "request 9", "not in the trace"}));
}

TEST(ArrivalsErrors, DependencyNotBeforeItsDependent) {
  // Itself, or a later request: it could never be sent.
  Trace trace = MakeTrace({{0, std::nullopt, {}, 0}, {0, std::nullopt, {}, 0}});
  trace.requests[1].parent = 1;
  auto itself = Arrivals::Create(trace);
  ASSERT_FALSE(itself.ok());
  EXPECT_TRUE(ContainsAll(itself.error(), {"made:", "request 1", "not before it"}));
  trace.requests[1].parent.reset();
  trace.requests[0].after = {1};
  auto later = Arrivals::Create(trace);
  ASSERT_FALSE(later.ok());
  EXPECT_TRUE(ContainsAll(later.error(), {"request 0", "request 1", "not before it"}));
}

TEST(ArrivalsErrors, BadClosedLoopSettings) {
  const Trace trace = Roots({0});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const ClosedLoop& loop : {ClosedLoop{1, -1, 10}, ClosedLoop{1, nan, 10},
                                 ClosedLoop{1, std::numeric_limits<double>::infinity(), 10},
                                 ClosedLoop{1, 0, nan}, ClosedLoop{1, 0, 0}}) {
    auto a = Arrivals::Create(trace, loop);
    ASSERT_FALSE(a.ok()) << loop.think_s << " " << loop.duration_s;
    EXPECT_TRUE(ContainsAll(a.error(), {"closed loop"}));
  }
}

}  // namespace
}  // namespace duet::traces
