#include "plan/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

namespace duet::plan {
namespace {

// Runs a search to the end against `meets(candidate, rate)`, with up to `parallel` jobs in
// flight whose results arrive in an order `seed` shuffles; obsolete jobs are cancelled.
struct Walk {
  std::vector<std::optional<std::size_t>> winners;
  std::size_t simulated = 0, cancelled = 0;
};
Walk Drive(std::size_t n, std::size_t rates, const std::vector<bool>& out_of_reach, bool exhaustive,
           const std::function<bool(std::size_t, std::size_t)>& meets, std::size_t parallel,
           unsigned seed) {
  Search search(n, rates, out_of_reach, exhaustive);
  std::mt19937 rng(seed);
  std::vector<Job> running;
  Walk run;
  for (int guard = 0; !search.Done(); ++guard) {
    EXPECT_LT(guard, 100000) << "the search does not end";
    if (guard >= 100000) break;
    while (running.size() < parallel) {
      auto job = search.Next();
      if (!job) break;
      EXPECT_FALSE(out_of_reach[job->candidate] && !exhaustive)
          << "candidate " << job->candidate << " is out of reach and was simulated";
      running.push_back(*job);
    }
    if (running.empty()) {
      EXPECT_TRUE(search.Done()) << "nothing running and nothing to start, yet not done";
      break;
    }
    std::uniform_int_distribution<std::size_t> pick(0, running.size() - 1);
    const std::size_t k = pick(rng);
    const Job job = running[k];
    running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
    search.Report(job, meets(job.candidate, job.rate));
    ++run.simulated;
    for (const Job& j : search.Obsolete()) {
      search.Forget(j);
      std::erase(running, j);
      ++run.cancelled;
    }
  }
  run.winners = search.Winners();
  return run;
}

// Candidate c sustains rates below capacity[c]; capacity need not grow with cost.
std::function<bool(std::size_t, std::size_t)> Capacities(std::vector<std::size_t> capacity) {
  return [capacity](std::size_t c, std::size_t r) { return r < capacity[c]; };
}

TEST(Search, FindsTheCheapestCandidateMeetingEachRateAsExhaustiveSearchDoes) {
  // 40 candidates in cost order with capacities (in rate levels) that wander up and down.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t n = 40, rates = 5;
    std::vector<std::size_t> capacity(n);
    std::uniform_int_distribution<std::size_t> cap(0, rates);
    for (auto& c : capacity) c = cap(rng);
    std::vector<bool> out(n, false);
    for (std::size_t c = 0; c < n; ++c) out[c] = capacity[c] == 0 && c % 3 == 0;
    const auto meets = Capacities(capacity);
    const Walk full = Drive(n, rates, out, /*exhaustive=*/true, meets, 1, 1);
    ASSERT_EQ(full.simulated, n * rates);
    for (std::size_t parallel : {1u, 2u, 5u}) {
      const Walk pruned = Drive(n, rates, out, false, meets, parallel, 100 + trial);
      EXPECT_EQ(pruned.winners, full.winners) << "trial " << trial << ", " << parallel << " jobs";
      EXPECT_LT(pruned.simulated, full.simulated);
    }
  }
}

TEST(Search, StopsAtTheFirstCandidateThatMeetsAndSimulatesNothingCostlier) {
  // Candidates 0-5 miss at rate 0; 6 meets at rates 0 and 1; 9 is the first to meet rate 2.
  std::vector<std::size_t> capacity = {0, 0, 0, 0, 0, 0, 2, 1, 2, 3, 3, 3};
  const Walk run = Drive(12, 3, std::vector<bool>(12, false), false, Capacities(capacity), 1, 0);
  EXPECT_EQ(run.winners, (std::vector<std::optional<std::size_t>>{6, 6, 9}));
  // Rate 0: 0..6 (7 jobs); rate 1: 6 (1); rate 2: 6, 7, 8, 9 (4).
  EXPECT_EQ(run.simulated, 12u);
}

TEST(Search, ABoundSavesItsCandidatesAndARateNoneMeetsEndsTheSearch) {
  std::vector<std::size_t> capacity = {0, 0, 1, 1, 2};
  std::vector<bool> out = {true, true, false, false, false};
  const Walk run = Drive(5, 4, out, false, Capacities(capacity), 1, 0);
  // Rate 0: 2 meets (0 and 1 never run); rate 1: 2, 3 miss, 4 meets; rate 2: 4 misses: the end.
  EXPECT_EQ(run.winners,
            (std::vector<std::optional<std::size_t>>{2, 4, std::nullopt, std::nullopt}));
  EXPECT_EQ(run.simulated, 1u + 3u + 1u);
}

TEST(Search, SpeculativeJobsCostlierThanAWinnerAreCancelled) {
  // With 4 in flight, candidates 0..3 start together; 0 meets first: 1..3 are obsolete.
  Search search(4, 1, std::vector<bool>(4, false), false);
  for (std::size_t c = 0; c < 4; ++c) ASSERT_EQ(search.Next(), (Job{c, 0}));
  search.Report({0, 0}, true);
  EXPECT_EQ(search.Obsolete().size(), 3u);
  for (const Job& j : search.Obsolete()) search.Forget(j);
  EXPECT_EQ(search.Next(), std::nullopt);
  EXPECT_TRUE(search.Done());
  EXPECT_EQ(search.Winners(), (std::vector<std::optional<std::size_t>>{0}));
}

TEST(Search, ACheaperCandidateStillRunningDecidesTheWinner) {
  Search search(3, 1, std::vector<bool>(3, false), false);
  ASSERT_EQ(search.Next(), (Job{0, 0}));
  ASSERT_EQ(search.Next(), (Job{1, 0}));
  search.Report({1, 0}, true);
  EXPECT_TRUE(search.Obsolete().empty());
  EXPECT_EQ(search.Next(), std::nullopt) << "candidate 0 may still win";
  EXPECT_FALSE(search.Done());
  search.Report({0, 0}, true);
  EXPECT_EQ(search.Next(), std::nullopt);
  EXPECT_TRUE(search.Done());
  EXPECT_EQ(search.Winners(), (std::vector<std::optional<std::size_t>>{0}));
}

TEST(Search, NoCandidateMeetsAnyRate) {
  const Walk run =
      Drive(6, 3, std::vector<bool>(6, false), false, Capacities({0, 0, 0, 0, 0, 0}), 2, 3);
  EXPECT_EQ(run.winners, (std::vector<std::optional<std::size_t>>(3, std::nullopt)));
  EXPECT_EQ(run.simulated, 6u);
}

}  // namespace
}  // namespace duet::plan
