// The real step executor: runs the shared scheduler's planned batches (prefill chunks and
// decode tokens) through a ForwardModel (CPU or CUDA), into the KV blocks the shared block
// manager allocated, samples each request's next token, and records every step's shape and
// measured time in the form the calibration reads.
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/engine/forward_model.h"
#include "kernels/cpu/sampling.h"
#include "models/cost_model.h"
#include "policies/ports.h"

namespace duet::backend {

// One executed step: its shape and how long the forward pass and sampling took.
struct StepTiming {
  models::StepShape shape;
  Seconds seconds = 0;
  nlohmann::json ToJson() const;  // {"prefill": [[tokens, context], ...], "decode_tokens": ..}
};
Status WriteStepTimings(const std::vector<StepTiming>& timings, const std::string& path);

class ModelStepExecutor final : public policies::StepExecutor, public policies::Clock {
 public:
  struct Options {
    kernels::cpu::SamplingParams sampling;  // seed is mixed with each request's id
    // Called with each request and the token it just got (for streaming).
    std::function<void(const policies::Request&, std::int32_t token)> on_token;
    // Sampling one of these ends the request (it is its last output token), and ends a decode
    // run at that step's boundary.
    std::vector<std::int32_t> stop_token_ids;
    // Polled between the steps of a decode run: true stops the run at that boundary.
    std::function<bool()> work_arrived;
  };

  ModelStepExecutor(ForwardModel& model, Options options);

  // The backend's clock: seconds of steady time since construction.
  Seconds Now() const override;
  void Execute(const policies::StepPlan& plan, int tp, int max_steps,
               std::vector<Seconds>* step_end_s) override;

  const std::vector<StepTiming>& timings() const { return timings_; }

 private:
  ForwardModel& model_;
  Options options_;
  std::chrono::steady_clock::time_point start_;
  std::vector<StepTiming> timings_;
  std::vector<SequenceChunk> chunks_;
  std::vector<policies::Request*> sampled_;  // requests that get a token this step, in order
  std::vector<float> logits_;
  std::vector<std::int32_t> greedy_;
};

}  // namespace duet::backend
