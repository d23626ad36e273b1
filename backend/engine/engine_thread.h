// One instance's engine loop on a thread of its own: the shared InstanceEngine driving the
// model's step executor over the real-time ports. Other threads reach it only through its
// inbox (messages wake it), the event sink it calls (on this thread) and the load it publishes
// after every iteration.
#pragma once

#include <functional>
#include <mutex>
#include <thread>

#include "backend/engine/forward_model.h"
#include "backend/engine/realtime_ports.h"
#include "backend/engine/step_executor.h"
#include "backend/engine/step_log.h"
#include "policies/engine.h"

namespace duet::backend {

using policies::InstanceLoad;

class EngineThread {
 public:
  struct Ports {
    // The run's clock, shared by every instance and the frontend (a worker process's is set to
    // its frontend's).
    const policies::Clock* clock = nullptr;
    policies::Outbox* outbox = nullptr;
    policies::KvTransport* transport = nullptr;  // used on this thread only
    policies::EventSink* sink = nullptr;         // called on this thread
    StepLog* step_log = nullptr;                 // every step, when set (shared by threads)
    // KV tiers below this instance's blocks, shared by the instances (ShareAcrossThreads), or
    // null. Its storage must have this instance's KV region.
    policies::TierManager* tiers = nullptr;
  };

  // `model` (which holds the KV memory) must outlive the thread. `after_iteration`, if set,
  // runs on the engine thread after every iteration of the loop (the requests finished in it
  // are no longer referenced by the engine then). `warm_up`: Start warms the model up first
  // (false where the caller has: a worker process warms up before it registers).
  EngineThread(policies::EngineConfig config, ForwardModel& model, Ports ports,
               std::function<void()> after_iteration, bool warm_up = true);
  // Stop(), if not done yet.
  ~EngineThread();
  EngineThread(const EngineThread&) = delete;
  EngineThread& operator=(const EngineThread&) = delete;

  ThreadSafeInbox& inbox() { return inbox_; }
  // Starts the thread and returns once it has warmed the model up (WarmUp, on that thread,
  // unless told not to): the first request meets no cold step.
  void Start();
  // Sends kShutdown and joins: the engine serves what it holds to the end first.
  void Stop();
  InstanceLoad load() const;  // any thread: as of the last iteration

 private:
  void Loop();
  void PublishLoad();

  // How often KV transfers in flight are polled while no message arrives (the transports do
  // not wake the engine thread yet).
  static constexpr Seconds kTransferPollInterval = 0.0005;

  const policies::Clock& clock_;
  ThreadSafeInbox inbox_;
  ForwardModel& model_;
  bool warm_up_;
  ModelStepExecutor executor_;
  policies::InstanceEngine engine_;
  std::function<void()> after_iteration_;
  StepLog* step_log_;
  mutable std::mutex load_mu_;
  InstanceLoad load_;  // under load_mu_
  std::thread thread_;
};

}  // namespace duet::backend
