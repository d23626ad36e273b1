// The real-time ports (see realtime_ports.h).
#include "backend/engine/realtime_ports.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace duet::backend {

Seconds SteadyClock::Now() const { return At(std::chrono::steady_clock::now()); }

Seconds SteadyClock::At(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration<double>(t - start_).count();
}

void ThreadSafeInbox::Post(const policies::EngineMessage& message) {
  const Seconds now = clock_.Now();
  {
    std::lock_guard lock(mu_);
    if (waiting_ && queue_.empty() && !woken_) woken_by_ = std::chrono::steady_clock::now();
    queue_.push_back(message);
    queue_.back().delivered_s = now;
  }
  cv_.notify_one();
}

void ThreadSafeInbox::Wake() {
  {
    std::lock_guard lock(mu_);
    woken_ = true;
  }
  cv_.notify_one();
}

bool ThreadSafeInbox::TryReceive(policies::EngineMessage* message) {
  std::lock_guard lock(mu_);
  if (queue_.empty()) return false;
  *message = queue_.front();
  queue_.pop_front();
  return true;
}

void ThreadSafeInbox::WaitUntil(Seconds deadline) {
  std::unique_lock lock(mu_);
  auto ready = [&] { return !queue_.empty() || woken_; };
  woken_by_.reset();
  waiting_ = !ready();
  if (std::isinf(deadline)) {
    cv_.wait(lock, ready);
  } else {
    // A wait of at most a day: a later deadline is met by the engine waiting again.
    const Seconds wait = std::clamp(deadline - clock_.Now(), 0.0, 86400.0);
    cv_.wait_for(lock, std::chrono::duration<double>(wait), ready);
  }
  woken_ = false;
  waiting_ = false;
}

void LocalOutbox::Send(policies::InstanceId to, const policies::EngineMessage& message) {
  DUET_CHECK(to >= 0 && static_cast<std::size_t>(to) < inboxes_.size());
  inboxes_[static_cast<std::size_t>(to)]->Post(message);
}

}  // namespace duet::backend
