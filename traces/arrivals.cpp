#include "traces/arrivals.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <unordered_map>

namespace duet::traces {

nlohmann::json ToJson(const ClosedLoop& loop) {
  return {{"users", loop.users},
          {"think_time_ms", loop.think_s * 1e3},
          {"duration_s", std::isinf(loop.duration_s) ? 0.0 : loop.duration_s}};
}

Result<Arrivals> Arrivals::Create(const Trace& trace, const ClosedLoop& loop) {
  Arrivals a;
  a.requests_ = &trace.requests;
  a.loop_ = loop;
  const std::size_t n = trace.requests.size();
  if (loop.users > 0) {
    // NaN would break the users' ordering; a loop that can send nothing is surely a mistake.
    if (!(loop.think_s >= 0) || !std::isfinite(loop.think_s))
      return Status::Error("closed loop: the think time must be finite and >= 0");
    if (!(loop.duration_s > 0))
      return Status::Error("closed loop: the duration must be > 0 (infinite: no limit)");
    if (trace.HasDependencies())
      return Status::Error(trace.source +
                           ": a closed loop cannot replay a trace whose requests follow others "
                           "(sessions set their own pace); replay it open loop");
    a.dynamic_ = true;
    a.user_of_.assign(n, -1);
    for (std::size_t u = 0; u < loop.users; ++u) a.users_.emplace(0.0, u);
    return a;
  }
  if (!trace.HasDependencies()) return a;
  a.dynamic_ = true;
  std::unordered_map<std::uint64_t, std::size_t> index;
  for (std::size_t k = 0; k < n; ++k) index.emplace(trace.requests[k].id, k);
  a.pending_.assign(n, 0);
  a.dependents_.resize(n);
  a.ready_s_.assign(n, 0);
  a.dropped_.assign(n, false);
  a.parent_.assign(n, kNone);
  a.continuations_.assign(n, 0);
  a.session_of_.assign(n, -1);
  std::map<std::string, std::int64_t> sessions;
  for (std::size_t k = 0; k < n; ++k) {
    const TraceRequest& r = trace.requests[k];
    if (!r.session.empty())
      a.session_of_[k] =
          sessions.emplace(r.session, static_cast<std::int64_t>(sessions.size())).first->second;
    std::vector<std::uint64_t> deps = r.after;
    if (r.parent) deps.push_back(*r.parent);
    for (std::uint64_t id : deps) {
      auto it = index.find(id);
      if (it == index.end())
        return Status::Error(trace.source + ": request " + std::to_string(r.id) +
                             " depends on request " + std::to_string(id) +
                             ", which is not in the trace");
      // One later in the trace (or itself) would never let it be sent, nor the run end.
      if (it->second >= k)
        return Status::Error(trace.source + ": request " + std::to_string(r.id) +
                             " depends on request " + std::to_string(id) +
                             ", which is not before it in the trace");
      if (std::find(a.dependents_[it->second].begin(), a.dependents_[it->second].end(), k) !=
          a.dependents_[it->second].end())
        continue;
      if (r.parent && id == *r.parent) {
        a.parent_[k] = it->second;
        ++a.continuations_[it->second];
      }
      a.dependents_[it->second].push_back(static_cast<std::uint32_t>(k));
      ++a.pending_[k];
    }
    if (a.pending_[k] > 0) ++a.waiting_;
  }
  return a;
}

std::size_t Arrivals::FirstRoot() const {
  const std::vector<TraceRequest>& requests = *requests_;
  while (next_root_ < requests.size() && !pending_.empty() &&
         requests[next_root_].HasDependencies())
    ++next_root_;
  return next_root_;
}

std::optional<Seconds> Arrivals::NextArrival() const {
  const std::vector<TraceRequest>& requests = *requests_;
  if (loop_.users > 0) {
    if (next_ >= requests.size() || users_.empty() || users_.top().first >= loop_.duration_s)
      return std::nullopt;
    return users_.top().first;
  }
  std::optional<Seconds> next;
  if (const std::size_t k = FirstRoot(); k < requests.size()) next = requests[k].arrival_s;
  if (!ready_.empty() && (!next || ready_.top().first < *next)) next = ready_.top().first;
  return next;
}

std::optional<Arrivals::Due> Arrivals::TakeDue(Seconds now) {
  const std::vector<TraceRequest>& requests = *requests_;
  if (loop_.users > 0) {
    if (next_ >= requests.size() || users_.empty()) return std::nullopt;
    const auto [ready_s, user] = users_.top();
    if (ready_s > now || ready_s >= loop_.duration_s) return std::nullopt;
    users_.pop();
    ++busy_;
    ++released_;
    user_of_[next_] = static_cast<std::int64_t>(user);
    return Due{next_++, ready_s};
  }
  // Requests without dependencies, in trace order; dependents by their ready time (ties: the
  // earlier request), a root first on equal times.
  FirstRoot();
  const bool root_due = next_root_ < requests.size() && requests[next_root_].arrival_s <= now;
  const bool dependent_due = !ready_.empty() && ready_.top().first <= now;
  if (root_due && (!dependent_due || requests[next_root_].arrival_s <= ready_.top().first)) {
    ++released_;
    const std::size_t k = next_root_++;
    return Due{k, requests[k].arrival_s};
  }
  if (!dependent_due) return std::nullopt;
  const auto [ready_s, k] = ready_.top();
  ready_.pop();
  ++released_;
  if (parent_[k] != kNone) --continuations_[parent_[k]];
  return Due{k, ready_s};
}

void Arrivals::OnFinished(std::size_t index, Seconds now, bool completed) {
  if (loop_.users > 0) {
    --busy_;
    users_.emplace(now + loop_.think_s, static_cast<std::size_t>(user_of_[index]));
    return;
  }
  if (dependents_.empty()) return;
  const std::vector<TraceRequest>& requests = *requests_;
  if (!completed) {
    Drop(index);
    return;
  }
  for (std::uint32_t d : dependents_[index]) {
    if (dropped_[d]) continue;
    ready_s_[d] = std::max(ready_s_[d], now + requests[d].delay_s);
    if (--pending_[d] == 0) {
      --waiting_;
      ready_.emplace(std::max(ready_s_[d], requests[d].arrival_s), d);
    }
  }
}

void Arrivals::Drop(std::size_t index) {
  // Breadth first: the direct dependents, then theirs, each naming the one it waited for. A
  // dropped request is never sent, so no OnFinished would reach its own dependents.
  std::deque<Dropped> todo;
  for (std::uint32_t d : dependents_[index]) todo.push_back({d, index});
  while (!todo.empty()) {
    const Dropped next = todo.front();
    todo.pop_front();
    if (dropped_[next.index]) continue;
    dropped_[next.index] = true;
    --waiting_;
    dropped_queue_.push_back(next);
    for (std::uint32_t d : dependents_[next.index]) todo.push_back({d, next.index});
  }
}

std::optional<Arrivals::Dropped> Arrivals::TakeDropped() {
  if (dropped_queue_.empty()) return std::nullopt;
  const Dropped d = dropped_queue_.front();
  dropped_queue_.pop_front();
  ++released_;
  if (parent_[d.index] != kNone) --continuations_[parent_[d.index]];
  return d;
}

bool Arrivals::Exhausted() const {
  const std::vector<TraceRequest>& requests = *requests_;
  if (loop_.users > 0) {
    return next_ >= requests.size() ||
           (busy_ == 0 && (users_.empty() || users_.top().first >= loop_.duration_s));
  }
  return !NextArrival() && waiting_ == 0 && ready_.empty() && dropped_queue_.empty();
}

}  // namespace duet::traces
