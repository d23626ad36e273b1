// One instance's engine loop on its own thread (see engine_thread.h).
#include "backend/engine/engine_thread.h"

#include <algorithm>
#include <future>

namespace duet::backend {

EngineThread::EngineThread(policies::EngineConfig config, ForwardModel& model, Ports ports,
                           std::function<void()> after_iteration, bool warm_up)
    : clock_(*ports.clock),
      inbox_(*ports.clock),
      model_(model),
      warm_up_(warm_up),
      executor_(model, *ports.clock, {.keep_last = ports.step_log != nullptr}),
      engine_(config, policies::EnginePorts{ports.clock, &inbox_, ports.outbox, &executor_,
                                            ports.transport, ports.sink, nullptr}),
      after_iteration_(std::move(after_iteration)),
      step_log_(ports.step_log) {
  PublishLoad();
}

EngineThread::~EngineThread() { Stop(); }

void EngineThread::Start() {
  DUET_CHECK(!thread_.joinable());
  std::promise<void> warm;
  std::future<void> warmed = warm.get_future();
  thread_ = std::thread([this, &warm] {
    // A warm-up pass that failed leaves the model cold, not unusable: each step that fails
    // later ends its own requests with an error.
    if (warm_up_) (void)WarmUp(model_, WarmUpPrompt(model_));
    warm.set_value();
    Loop();
  });
  warmed.wait();
}

void EngineThread::Stop() {
  if (!thread_.joinable()) return;
  inbox_.Post({policies::EngineMessage::Kind::kShutdown, nullptr, policies::kNoInstance});
  thread_.join();
}

void EngineThread::Loop() {
  while (true) {
    const Seconds start = step_log_ ? clock_.Now() : 0;
    const std::int64_t failures_before = engine_.forward_failures();
    const bool stepped = engine_.RunOnce();
    if (after_iteration_) after_iteration_();
    // A failed step has no timing of its own (last_timing is the step before it).
    if (stepped && step_log_ && engine_.forward_failures() == failures_before)
      step_log_->Write({engine_.config().id, start, clock_.Now() - start, executor_.last_timing()});
    PublishLoad();
    if (stepped) continue;
    if (engine_.done()) return;
    // Wake for the next lease to end, and to poll pulls in flight.
    Seconds deadline = engine_.next_lease_expiry();
    if (engine_.awaiting_transfers())
      deadline = std::min(deadline, clock_.Now() + kTransferPollInterval);
    inbox_.WaitUntil(deadline);
  }
}

void EngineThread::PublishLoad() {
  waiting_.store(static_cast<std::int64_t>(engine_.scheduler().waiting().size()),
                 std::memory_order_relaxed);
  running_.store(static_cast<std::int64_t>(engine_.scheduler().running().size()),
                 std::memory_order_relaxed);
  kv_used_.store(engine_.blocks().kv_blocks_used(), std::memory_order_relaxed);
  kv_free_.store(engine_.blocks().kv_blocks_free(), std::memory_order_relaxed);
  leases_held_.store(engine_.leases_held(), std::memory_order_relaxed);
  leases_expired_.store(engine_.leases_expired(), std::memory_order_relaxed);
  load_failures_.store(engine_.kv_load_failures(), std::memory_order_relaxed);
  load_recomputes_.store(engine_.kv_load_recomputes(), std::memory_order_relaxed);
  forward_failures_.store(engine_.forward_failures(), std::memory_order_relaxed);
}

InstanceLoad EngineThread::load() const {
  return {waiting_.load(std::memory_order_relaxed),
          running_.load(std::memory_order_relaxed),
          kv_used_.load(std::memory_order_relaxed),
          kv_free_.load(std::memory_order_relaxed),
          leases_held_.load(std::memory_order_relaxed),
          leases_expired_.load(std::memory_order_relaxed),
          load_failures_.load(std::memory_order_relaxed),
          load_recomputes_.load(std::memory_order_relaxed),
          forward_failures_.load(std::memory_order_relaxed)};
}

}  // namespace duet::backend
