// A single colocated instance served in this process: the shared engine loop (scheduler, KV
// block manager, prefix cache) driving the CPU step executor through in-process ports. Used by
// `duet generate` and by the parity tests; the server's workers will build on the same pieces.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "backend/engine/step_executor.h"
#include "policies/engine.h"
#include "policies/metrics.h"

namespace duet::backend {

struct GenerationRequest {
  std::vector<std::int32_t> prompt;  // token ids, at least one
  Tokens max_tokens = 16;            // generated tokens at most (a stop token ends earlier)
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // generated ids (a stop token, when hit, is the last)
  policies::Request record;          // the final lifecycle record (times, cached tokens)
};

struct LocalEngineOptions {
  policies::SchedulerConfig scheduler;
  bool enable_prefix_caching = true;
  kernels::cpu::SamplingParams sampling;
  std::vector<std::int32_t> stop_token_ids;
  std::function<void(const policies::Request&, std::int32_t)> on_token;
};

class LocalEngine {
 public:
  // `model` holds the KV memory; its num_blocks and block_tokens size the block manager.
  LocalEngine(ForwardModel& model, LocalEngineOptions options);
  ~LocalEngine();

  // Serves the requests, all arriving now, to completion. The prefix cache persists across
  // calls. A request that can never fit in the KV cache is returned rejected.
  std::vector<GenerationResult> Generate(const std::vector<GenerationRequest>& requests);

  const std::vector<StepTiming>& timings() const { return executor_.timings(); }
  const policies::MetricsCollector& metrics() const { return metrics_; }
  const policies::InstanceEngine& engine() const { return *engine_; }

 private:
  struct Ports;
  ForwardModel& model_;
  LocalEngineOptions options_;
  policies::MetricsCollector metrics_;
  std::unique_ptr<Ports> ports_;
  ModelStepExecutor executor_;
  std::unique_ptr<policies::InstanceEngine> engine_;
  policies::RequestId next_id_ = 0;
};

}  // namespace duet::backend
