// The real-time ports of an instance's engine loop in this process: a steady clock, a
// thread-safe inbox that wakes the engine thread when work arrives (new requests, aborts,
// KV messages, transfer completions), an outbox that delivers to the inboxes of this process,
// and the KV transport of instances that move no KV.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "policies/ports.h"

namespace duet::backend {

// Seconds of steady (monotonic) time since construction: the clock
// every port and request timestamp of one run shares (a worker process sets its own clock to
// it: backend/cluster/clock_sync.h). Thread-safe.
class SteadyClock final : public policies::Clock {
 public:
  SteadyClock() : start_(std::chrono::steady_clock::now()) {}
  Seconds Now() const override;
  Seconds At(std::chrono::steady_clock::time_point t) const;  // t on this clock
  std::chrono::steady_clock::time_point start() const { return start_; }

 private:
  std::chrono::steady_clock::time_point start_;
};

// One instance's inbox. Any thread posts; one engine thread takes and waits.
class ThreadSafeInbox final : public policies::Inbox {
 public:
  explicit ThreadSafeInbox(const policies::Clock& clock) : clock_(clock) {}

  // Any thread: queues the message and wakes the engine thread.
  void Post(const policies::EngineMessage& message);
  // Any thread: ends the engine thread's current or next wait (a transfer completed, ...).
  void Wake();

  // Engine thread.
  bool TryReceive(policies::EngineMessage* message) override;
  // Returns at once when a message or a wake-up is pending; else blocks until one arrives or
  // `deadline` (on the clock) passes. Consumes a pending wake-up.
  void WaitUntil(Seconds deadline) override;
  // When the message that ended the last WaitUntil was posted, once (none: it did not block,
  // it returned at its deadline or for a Wake, or this was asked since): the engine's wake-up
  // is measured from it.
  std::optional<std::chrono::steady_clock::time_point> TakeWokenBy() {
    return std::exchange(woken_by_, std::nullopt);
  }

 private:
  const policies::Clock& clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<policies::EngineMessage> queue_;
  bool woken_ = false;
  bool waiting_ = false;  // the engine thread blocks in WaitUntil
  std::optional<std::chrono::steady_clock::time_point> woken_by_;
};

// Delivers to the inboxes of this process's instances (by instance id). Send is thread-safe;
// Add every inbox before the first Send.
class LocalOutbox final : public policies::Outbox {
 public:
  LocalOutbox() = default;
  explicit LocalOutbox(std::vector<ThreadSafeInbox*> inboxes) : inboxes_(std::move(inboxes)) {}
  // The inbox of the next instance id (0, 1, ...).
  void Add(ThreadSafeInbox* inbox) { inboxes_.push_back(inbox); }
  void Send(policies::InstanceId to, const policies::EngineMessage& message) override;

 private:
  std::vector<ThreadSafeInbox*> inboxes_;
};

// The transport of instances that move no KV (colocated): every transfer fails, reported once,
// so a misrouted PD request fails with a reason instead of hanging. Engine thread only.
class NoKvTransport final : public policies::KvTransport {
 public:
  policies::TransferId Post(const policies::KvTransferRequest&) override { return next_++; }
  policies::TransferStatus Poll(policies::TransferId) override {
    return policies::TransferStatus::kFailed;
  }

 private:
  policies::TransferId next_ = 1;
};

}  // namespace duet::backend
