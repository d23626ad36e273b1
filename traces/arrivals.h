// When each request of a trace is sent, as a run unfolds: open loop at the trace's arrival
// times; a request that depends on others (sessions, agent steps) `delay_s` after the last of
// them finished and not before its arrival bound; or closed loop, N virtual users each sending
// the next request of the trace once its previous one finished (plus a think time), until a
// duration. Pure logic on the caller's clock: the simulator's frontend drives it.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <vector>

#include "common/status.h"
#include "traces/trace.h"

namespace duet::traces {

struct ClosedLoop {
  std::size_t users = 0;  // 0: open loop
  Seconds think_s = 0;    // a user's pause between a reply and its next request
  // No request is sent at or after this time; those in flight finish.
  Seconds duration_s = std::numeric_limits<double>::infinity();
};
// {"users", "think_time_ms", "duration_s" (0: none)}, as summary.json's run section shows it.
nlohmann::json ToJson(const ClosedLoop& loop);

class Arrivals {
 public:
  // Errors: a dependency that is not in the trace, or not before its dependent (a deadlock);
  // a closed loop over a trace with
  // dependencies (its sessions set their own pace); a negative or non-finite think time, a
  // duration that is not > 0. `trace` must outlive the Arrivals.
  static Result<Arrivals> Create(const Trace& trace, const ClosedLoop& loop = {});

  // Whether send times depend on when requests finish (dependencies or a closed loop).
  bool dynamic() const { return dynamic_; }
  // The earliest send time known now; nullopt while the next one waits on a request to finish
  // (or nothing more will be sent).
  std::optional<Seconds> NextArrival() const;
  struct Due {
    std::size_t index;  // into trace.requests
    Seconds arrival_s;
  };
  // The request to send next if its time has come (arrival_s <= now).
  std::optional<Due> TakeDue(Seconds now);
  // Request `index`, sent earlier, finished at `now`; `completed` false when it was rejected or
  // failed: whatever depends on it will not be sent and comes out of TakeDropped instead.
  void OnFinished(std::size_t index, Seconds now, bool completed);
  // Whatever depends on a dropped request is dropped too (its cause: that request).
  struct Dropped {
    std::size_t index;
    std::size_t cause;  // the dependency that did not complete (rejected, failed or dropped)
  };
  std::optional<Dropped> TakeDropped();
  // Nothing more will be sent or dropped.
  bool Exhausted() const;
  // Requests sent or dropped so far: the run's total once it is over.
  std::size_t released() const { return released_; }
  // The index of the request whose context request `index` continues (TraceRequest::parent).
  std::optional<std::size_t> parent(std::size_t index) const {
    if (parent_.empty() || parent_[index] == kNone) return std::nullopt;
    return parent_[index];
  }
  // How many requests that continue request `index`'s context (name it as their parent) are
  // neither sent (TakeDue) nor dropped (TakeDropped) yet: its context is needed until then.
  std::uint32_t continuations_left(std::size_t index) const {
    return continuations_.empty() ? 0 : continuations_[index];
  }
  // The number of request `index`'s session (its closed-loop user, or its trace session in
  // order of first appearance), -1 for none.
  std::int64_t session(std::size_t index) const {
    if (!user_of_.empty()) return user_of_[index];
    return session_of_.empty() ? -1 : session_of_[index];
  }
  // The closed-loop user that sent request `index` (-1: open loop).
  std::int64_t user(std::size_t index) const { return user_of_.empty() ? -1 : user_of_[index]; }

 private:
  Arrivals() = default;

  const std::vector<TraceRequest>* requests_ = nullptr;
  ClosedLoop loop_;
  bool dynamic_ = false;
  std::size_t released_ = 0;
  // Open loop: the next request without dependencies, in arrival order (advanced past
  // dependents by lookups too).
  std::size_t FirstRoot() const;
  // Request `index` did not complete: drops its dependents, and theirs, into dropped_queue_.
  void Drop(std::size_t index);
  mutable std::size_t next_root_ = 0;
  // Dependencies: per request, unfinished ones, its dependents, when it may be sent.
  std::vector<std::uint32_t> pending_;
  std::vector<std::vector<std::uint32_t>> dependents_;
  std::vector<Seconds> ready_s_;
  std::vector<bool> dropped_;
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> parent_;               // kNone: no parent
  std::vector<std::uint32_t> continuations_;      // continuations_left, per request
  std::vector<std::int64_t> session_of_;          // trace sessions, numbered; -1: none
  std::size_t waiting_ = 0;                       // dependents neither released nor dropped
  using Timed = std::pair<Seconds, std::size_t>;  // (time, request or user), earliest first
  std::priority_queue<Timed, std::vector<Timed>, std::greater<>> ready_;
  std::deque<Dropped> dropped_queue_;
  // Closed loop: the next request to hand out, users' ready times, users busy.
  std::size_t next_ = 0;
  std::priority_queue<Timed, std::vector<Timed>, std::greater<>> users_;
  std::size_t busy_ = 0;
  std::vector<std::int64_t> user_of_;
};

}  // namespace duet::traces
