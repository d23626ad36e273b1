// The real step executor: runs the shared scheduler's planned batches (prefill chunks and
// decode tokens) through a ForwardModel (CPU or CUDA), from the rows the plan carries by value
// (token ids, positions, sampling and stop settings) into the KV blocks its block table
// snapshot names, and samples each row's next token with the row's own sampling settings. It
// reads no request and changes none: it returns the tokens as a StepResult and the engine
// applies them. Optionally records every step's shape and forward-pass time for calibration.
#pragma once

#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/engine/forward_model.h"
#include "models/cost_model.h"
#include "policies/kv_tiers.h"
#include "policies/ports.h"

namespace duet::backend {

// One executed step: its shape and how long its forward pass took (sampling excluded, as is
// everything else the loop does between passes).
struct StepTiming {
  models::StepShape shape;
  Seconds seconds = 0;
  // models::StepShapeToJson(shape) and "seconds": a line ParseStepMeasurements reads.
  nlohmann::json ToJson() const;
};
Status WriteStepTimings(const std::vector<StepTiming>& timings, const std::string& path);

class ModelStepExecutor final : public policies::StepExecutor {
 public:
  struct Options {
    bool record_timings = false;  // keep every step's StepTiming (timings()); grows per step
    bool keep_last = false;       // keep the last step's StepTiming (last_timing())
    // The KV tiers the engine offloads to, if any, and this instance's id there: a step waits
    // until no tier write is still reading the instance's blocks (one evicted to make room in
    // this step's tables may be written into).
    policies::TierManager* tiers = nullptr;
    policies::InstanceId instance = 0;
  };

  // `clock` stamps the end of each step (the engine's clock).
  ModelStepExecutor(ForwardModel& model, const policies::Clock& clock, Options options);

  // Never coalesces decode runs; needs the rows' inputs; does not overlap tier loads with a
  // step (its engine loads a prefix before it schedules the request). Holds two steps
  // (asynchronous steps) and runs each, in order, when it is waited for: a row whose token the
  // step before samples (StepRow::previous_token) gets it then. A step submitted after a
  // failed one fails too: its rows may read tokens that were never sampled.
  bool NeedsInputs() const override { return true; }
  int max_in_flight() const override { return 2; }
  void Submit(const policies::StepPlan& plan, policies::StepEvents& events) override;
  void Wait(policies::StepResult* result) override;

  const std::vector<StepTiming>& timings() const { return timings_; }
  const StepTiming& last_timing() const { return last_; }

 private:
  ForwardModel& model_;
  const policies::Clock& clock_;
  Options options_;
  void Run(const policies::StepPlan& plan, policies::StepResult* result);

  std::vector<StepTiming> timings_;
  StepTiming last_;
  std::deque<const policies::StepPlan*> submitted_;
  // The tokens the last step run sampled, by request, and whether it failed.
  std::unordered_map<policies::RequestId, std::int32_t> previous_;
  bool previous_failed_ = false;
  std::vector<std::int32_t> token_ids_;  // the step's token ids, previous tokens put in
  std::vector<SequenceChunk> chunks_;
  std::vector<const policies::StepRow*> sampled_;  // rows that get a token, in plan order
  std::vector<float> logits_;
  std::vector<std::int32_t> greedy_;
};

}  // namespace duet::backend
