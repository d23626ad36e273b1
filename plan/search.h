// The order in which `duet plan` simulates candidate clusters, as a state machine with no I/O:
// the driver asks for the next job, runs it (a simulation of one candidate at one rate), and
// reports whether the candidate met the SLO target there. Candidates come sorted by cost, the
// cheapest first; rates ascend (the first is the trace's own).
//
// Pruned search (the default) finds, for each rate, the cheapest candidate that meets the
// target there, assuming that a candidate that misses at a rate misses at every higher rate:
//  - at a rate, it walks candidates in cost order and stops at the first that meets: nothing
//    costlier can win;
//  - a candidate ruled out by a bound (`out_of_reach`, e.g. prompts it cannot prefill within
//    the TTFT whatever the load) is never simulated;
//  - the next rate starts at the previous rate's winner: every cheaper candidate missed at a
//    lower rate, so it misses at this one;
//  - up to `parallel` jobs run at once, speculatively further along the cost order; a job
//    costlier than a candidate already known to meet is obsolete and should be cancelled.
// The winners are the same whatever order results arrive in: a rate's winner is the cheapest
// meeting candidate, decided only once every cheaper one has a result.
//
// Exhaustive search simulates every candidate at every rate (no bound, no pruning) and picks
// the same winners from the full table: the yardstick the pruned search is checked against.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

namespace duet::plan {

struct Job {
  std::size_t candidate = 0;  // position in cost order
  std::size_t rate = 0;       // index into the rates

  bool operator==(const Job&) const = default;
};

enum class Outcome : unsigned char { kUnknown, kMet, kMissed, kOutOfReach };

class Search {
 public:
  // `out_of_reach[c]`: candidate c cannot meet the target at any rate (ignored when exhaustive).
  Search(std::size_t num_candidates, std::size_t num_rates, std::vector<bool> out_of_reach,
         bool exhaustive);

  // The next job to start, or nullopt when none can start before a running one reports (or the
  // search is done).
  std::optional<Job> Next();
  void Report(const Job& job, bool met);
  // Running jobs whose results can no longer change a winner: cancel them, then Forget them.
  std::vector<Job> Obsolete() const;
  void Forget(const Job& job);

  bool Done() const;
  // After Done(): the cheapest candidate meeting the target at each rate (nullopt: none does;
  // then none does at higher rates either, in a pruned search).
  std::vector<std::optional<std::size_t>> Winners() const;
  Outcome At(std::size_t candidate, std::size_t rate) const;

 private:
  bool MissedAtOrBelow(std::size_t candidate, std::size_t rate) const;
  void AdvanceLevel();

  std::size_t n_, rates_;
  std::vector<bool> out_of_reach_;
  bool exhaustive_;
  std::vector<Outcome> results_;  // candidate-major: [c * rates_ + r]
  std::vector<Job> running_;
  // Pruned: the rate being searched, the next candidate to consider at it, the cheapest known
  // to meet there, and the winners of the rates already decided.
  std::size_t level_ = 0, cursor_ = 0;
  std::optional<std::size_t> best_;
  std::vector<std::optional<std::size_t>> winners_;
  bool done_ = false;
};

}  // namespace duet::plan
