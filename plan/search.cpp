#include "plan/search.h"

#include <algorithm>
#include <cassert>

namespace duet::plan {

Search::Search(std::size_t num_candidates, std::size_t num_rates, std::vector<bool> out_of_reach,
               bool exhaustive)
    : n_(num_candidates),
      rates_(num_rates),
      out_of_reach_(std::move(out_of_reach)),
      exhaustive_(exhaustive),
      results_(num_candidates * num_rates, Outcome::kUnknown) {
  assert(out_of_reach_.size() == n_);
  if (exhaustive_) std::fill(out_of_reach_.begin(), out_of_reach_.end(), false);
  for (std::size_t c = 0; c < n_; ++c) {
    if (!out_of_reach_[c]) continue;
    for (std::size_t r = 0; r < rates_; ++r) results_[c * rates_ + r] = Outcome::kOutOfReach;
  }
  if (n_ == 0 || rates_ == 0) done_ = true;
}

Outcome Search::At(std::size_t candidate, std::size_t rate) const {
  return results_[candidate * rates_ + rate];
}

bool Search::MissedAtOrBelow(std::size_t candidate, std::size_t rate) const {
  for (std::size_t r = 0; r <= rate; ++r) {
    const Outcome o = At(candidate, r);
    if (o == Outcome::kMissed || o == Outcome::kOutOfReach) return true;
  }
  return false;
}

std::optional<Job> Search::Next() {
  if (done_) return std::nullopt;
  if (exhaustive_) {
    // Row by row: every rate of a candidate, then the next candidate.
    if (cursor_ >= n_ * rates_) return std::nullopt;
    const Job job{cursor_ / rates_, cursor_ % rates_};
    ++cursor_;
    running_.push_back(job);
    return job;
  }
  while (!done_) {
    const std::size_t end = best_ ? *best_ : n_;
    while (cursor_ < end && MissedAtOrBelow(cursor_, level_)) ++cursor_;
    if (cursor_ < end) {
      const Job job{cursor_++, level_};
      running_.push_back(job);
      return job;
    }
    // Nothing cheaper than the best is left to start: wait for those running, if any is cheaper.
    const bool cheaper_running = std::any_of(running_.begin(), running_.end(), [&](const Job& j) {
      return j.rate == level_ && j.candidate < end;
    });
    if (cheaper_running) return std::nullopt;
    AdvanceLevel();
  }
  return std::nullopt;
}

void Search::AdvanceLevel() {
  winners_.push_back(best_);
  if (!best_ || winners_.size() == rates_) {
    // No candidate meets this rate: none meets a higher one.
    winners_.resize(rates_);
    done_ = true;
    return;
  }
  // Every candidate cheaper than this rate's winner missed here, so misses at the next rate.
  ++level_;
  cursor_ = *best_;
  best_.reset();
}

void Search::Report(const Job& job, bool met) {
  Forget(job);
  results_[job.candidate * rates_ + job.rate] = met ? Outcome::kMet : Outcome::kMissed;
  if (exhaustive_) {
    if (cursor_ >= n_ * rates_ && running_.empty()) {
      done_ = true;
      for (std::size_t r = 0; r < rates_; ++r) {
        std::optional<std::size_t> w;
        for (std::size_t c = 0; c < n_ && !w; ++c)
          if (At(c, r) == Outcome::kMet) w = c;
        winners_.push_back(w);
      }
    }
    return;
  }
  // Next() decides the rate once nothing cheaper is left to run.
  if (met && job.rate == level_ && (!best_ || job.candidate < *best_)) best_ = job.candidate;
}

std::vector<Job> Search::Obsolete() const {
  std::vector<Job> out;
  if (exhaustive_) return out;
  for (const Job& j : running_) {
    if (done_ || j.rate < level_ || (j.rate == level_ && best_ && j.candidate > *best_))
      out.push_back(j);
  }
  return out;
}

void Search::Forget(const Job& job) { std::erase(running_, job); }

bool Search::Done() const { return done_ && running_.empty(); }

std::vector<std::optional<std::size_t>> Search::Winners() const { return winners_; }

}  // namespace duet::plan
