// A single colocated instance served on the calling thread: the shared engine loop (scheduler,
// KV block manager, prefix cache) driving the model's step executor through the real-time
// ports (backend/engine/realtime_ports.h). Used by `duet generate` and the parity tests; the
// server runs the same pieces on engine threads (backend/frontend/frontend.h).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/engine/realtime_ports.h"
#include "backend/engine/step_executor.h"
#include "policies/engine.h"
#include "policies/frontend_policy.h"
#include "policies/metrics.h"
#include "policies/router.h"

namespace duet::backend {

struct GenerationRequest {
  std::vector<std::int32_t> prompt;  // token ids, at least one
  Tokens max_tokens = 16;            // generated tokens at most (a stop token ends earlier)
  policies::SamplingParams sampling;
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // generated ids (a stop token, when hit, is the last)
  policies::RequestRecord record;    // the final lifecycle record (times, cached tokens)
};

struct LocalEngineOptions {
  policies::SchedulerConfig scheduler;
  bool enable_prefix_caching = true;
  bool async_steps = false;  // policies::EngineConfig::async_steps
  // Called with each request and the token it just got (streaming), from the event sink.
  std::function<void(const policies::RequestSpec&, std::int32_t)> on_token;
};

class LocalEngine final : private policies::EventSink {
 public:
  // `model` holds the KV memory; its num_blocks and block_tokens size the block manager.
  LocalEngine(ForwardModel& model, LocalEngineOptions options);
  ~LocalEngine() override;

  // Serves the requests, all arriving now, to completion. The prefix cache persists across
  // calls. A request that can never fit in the KV cache is returned rejected.
  std::vector<GenerationResult> Generate(const std::vector<GenerationRequest>& requests);

  const std::vector<StepTiming>& timings() const { return executor_.timings(); }
  const policies::MetricsCollector& metrics() const { return metrics_; }
  const policies::InstanceEngine& engine() const { return *engine_; }

 private:
  void OnFinished(const policies::RequestSpec& spec,
                  const policies::RequestRecord& record) override;
  void OnPrefillDone(const policies::RequestSpec& spec,
                     const policies::RequestRecord& record) override {
    router_->OnPrefillDone(spec, record);
  }
  void OnTokenGaps(Seconds gap_s, std::int64_t count) override {
    metrics_.OnTokenGaps(gap_s, count);
  }
  void OnPreempted(const policies::RequestSpec& spec, const policies::RequestRecord& record,
                   policies::InstanceId i) override {
    metrics_.OnPreempted(spec, record, i);
  }
  void OnToken(const policies::RequestSpec& spec, const policies::RequestRecord& record,
               std::int32_t token) override;

  ForwardModel& model_;
  LocalEngineOptions options_;
  SteadyClock clock_;
  ThreadSafeInbox inbox_{clock_};
  LocalOutbox outbox_{{&inbox_}};
  NoKvTransport transport_;
  ModelStepExecutor executor_;
  policies::MetricsCollector metrics_;
  std::unique_ptr<policies::InstanceEngine> engine_;
  // The frontend policy over the one instance (admission; routing has one choice).
  std::unique_ptr<policies::Router> router_;
  std::optional<policies::FrontendPolicy> policy_;
  policies::RequestId next_id_ = 0;
  // The results of the requests the engine serves now, by id (filled from the sink).
  std::unordered_map<policies::RequestId, GenerationResult*> serving_;
};

}  // namespace duet::backend
