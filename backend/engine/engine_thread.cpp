// One instance's engine loop on its own thread (see engine_thread.h).
#include "backend/engine/engine_thread.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <utility>

namespace duet::backend {

EngineThread::EngineThread(policies::EngineConfig config, ForwardModel& model, Ports ports,
                           std::function<void()> after_iteration, bool warm_up)
    : clock_(*ports.clock),
      inbox_(*ports.clock),
      model_(model),
      warm_up_(warm_up),
      executor_(model, *ports.clock,
                {.keep_last = ports.step_log != nullptr,
                 .tiers = ports.tiers,
                 .instance = config.id,
                 .step_thread = config.async_steps}),
      engine_(config, policies::EnginePorts{ports.clock, &inbox_, ports.outbox, &executor_,
                                            ports.transport, ports.sink, ports.tiers,
                                            ports.step_log ? ports.clock : nullptr}),
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
  // The engine's wake-up, from the message that ended its last idle wait to the iteration that
  // followed, until a step's line carries it (an asynchronous step's ends an iteration later).
  std::optional<Seconds> woke_s;
  while (true) {
    // The iteration's start on the run's clock; its durations on this process's steady clock,
    // which no clock correction moves (a worker's run clock slews toward its frontend's).
    const Seconds start = step_log_ ? clock_.Now() : 0;
    const auto started = std::chrono::steady_clock::now();
    if (const auto woken_by = inbox_.TakeWokenBy(); woken_by && step_log_)
      woke_s = std::chrono::duration<double>(started - *woken_by).count();
    const std::int64_t failures_before = engine_.forward_failures();
    const std::int64_t steps_before = engine_.steps();
    const bool stepped = engine_.RunOnce();
    const auto handed_from = std::chrono::steady_clock::now();
    if (after_iteration_) after_iteration_();
    // A line per step ended (asynchronous steps: an iteration that only submitted one ends
    // none). A failed step has no timing of its own (last_timing is the step before it).
    if (engine_.steps() > steps_before && step_log_ &&
        engine_.forward_failures() == failures_before) {
      // What runs after the iteration hands its events on (a worker process sends them to the
      // frontend then): part of streaming.
      models::HostStep host = engine_.last_host_step();
      const auto end = std::chrono::steady_clock::now();
      host.at(models::HostPhase::kStream) +=
          std::chrono::duration<double>(end - handed_from).count();
      step_log_->Write({engine_.config().id, start,
                        std::chrono::duration<double>(end - started).count(),
                        executor_.last_timing(), host, engine_.config().async_steps,
                        std::exchange(woke_s, std::nullopt), executor_.last_cpu_s()});
    }
    PublishLoad();
    if (stepped) continue;
    if (engine_.done()) return;
    // Wake for the next lease to end, and to poll pulls in flight.
    Seconds deadline = engine_.next_lease_expiry();
    if (engine_.awaiting_transfers())
      deadline = std::min(deadline, clock_.Now() + kTransferPollInterval);
    woke_s.reset();  // the wake-up ran no step
    inbox_.WaitUntil(deadline);
  }
}

void EngineThread::PublishLoad() {
  const InstanceLoad load = engine_.CurrentLoad();
  std::lock_guard lock(load_mu_);
  load_ = load;
}

InstanceLoad EngineThread::load() const {
  std::lock_guard lock(load_mu_);
  return load_;
}

}  // namespace duet::backend
