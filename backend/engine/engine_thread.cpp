// One instance's engine loop on its own thread (see engine_thread.h).
#include "backend/engine/engine_thread.h"

namespace duet::backend {

EngineThread::EngineThread(policies::EngineConfig config, ForwardModel& model, Ports ports,
                           std::function<void()> after_iteration)
    : clock_(*ports.clock),
      inbox_(*ports.clock),
      executor_(model, *ports.clock, {.record_timings = false}),
      engine_(config, policies::EnginePorts{ports.clock, &inbox_, ports.outbox, &executor_,
                                            ports.transport, ports.sink, nullptr}),
      after_iteration_(std::move(after_iteration)) {
  PublishLoad();
}

EngineThread::~EngineThread() { Stop(); }

void EngineThread::Start() {
  DUET_CHECK(!thread_.joinable());
  thread_ = std::thread([this] { Loop(); });
}

void EngineThread::Stop() {
  if (!thread_.joinable()) return;
  inbox_.Post({policies::EngineMessage::Kind::kShutdown, nullptr, policies::kNoInstance});
  thread_.join();
}

void EngineThread::Loop() {
  while (true) {
    const bool stepped = engine_.RunOnce();
    if (after_iteration_) after_iteration_();
    PublishLoad();
    if (stepped) continue;
    if (engine_.done()) return;
    inbox_.WaitUntil(engine_.awaiting_transfers() ? clock_.Now() + kTransferPollInterval
                                                  : policies::kForever);
  }
}

void EngineThread::PublishLoad() {
  waiting_.store(static_cast<std::int64_t>(engine_.scheduler().waiting().size()),
                 std::memory_order_relaxed);
  running_.store(static_cast<std::int64_t>(engine_.scheduler().running().size()),
                 std::memory_order_relaxed);
  kv_used_.store(engine_.blocks().kv_blocks_used(), std::memory_order_relaxed);
  kv_free_.store(engine_.blocks().kv_blocks_free(), std::memory_order_relaxed);
}

InstanceLoad EngineThread::load() const {
  return {waiting_.load(std::memory_order_relaxed), running_.load(std::memory_order_relaxed),
          kv_used_.load(std::memory_order_relaxed), kv_free_.load(std::memory_order_relaxed)};
}

}  // namespace duet::backend
