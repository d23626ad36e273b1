// The real step executor: runs the shared scheduler's planned batches (prefill chunks and
// decode tokens) through a ForwardModel (CPU or CUDA), from the rows the plan carries by value
// (token ids, positions, sampling and stop settings) into the KV blocks its block table
// snapshot names, and samples each row's next token with the row's own sampling settings. It
// reads no request and changes none: it returns the tokens as a StepResult and the engine
// applies them. Optionally records every step's shape and forward-pass time for calibration.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/engine/forward_model.h"
#include "models/cost_model.h"
#include "models/step_profile.h"
#include "policies/kv_tiers.h"
#include "policies/ports.h"

namespace duet::backend {

using models::StepTiming;
// The calling thread's CPU time: it advances only while the thread runs on a core (what the
// executor reads around each forward pass, policies::StepLogLine::forward_cpu_s).
Seconds ThreadCpuSeconds();
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
    // Run the steps on a thread of the executor's own, from construction on (asynchronous
    // steps: a step's forward pass runs while the engine plans, applies and streams). Else
    // each runs in the Wait that asks for it. The model must not be used elsewhere then.
    bool step_thread = false;
  };

  // `clock` stamps the end of each step (the engine's clock).
  ModelStepExecutor(ForwardModel& model, const policies::Clock& clock, Options options);
  ~ModelStepExecutor() override;
  ModelStepExecutor(const ModelStepExecutor&) = delete;
  ModelStepExecutor& operator=(const ModelStepExecutor&) = delete;

  // Never coalesces decode runs; needs the rows' inputs; does not overlap tier loads with a
  // step (its engine loads a prefix before it schedules the request). Holds two steps
  // (asynchronous steps) and runs them in order, on its step thread or when waited for: a row
  // whose token the step before samples (StepRow::previous_token) gets it then. A step that
  // needs the tokens of a failed one fails too.
  bool NeedsInputs() const override { return true; }
  int max_in_flight() const override { return 2; }
  void Submit(const policies::StepPlan& plan, policies::StepEvents& events) override;
  void Wait(policies::StepResult* result) override;

  // Of the steps waited for (the engine's thread reads them).
  const std::vector<StepTiming>& timings() const { return timings_; }
  const StepTiming& last_timing() const { return last_; }
  // The CPU time of the thread that ran that step's forward pass, within the pass
  // (policies::StepLogLine::forward_cpu_s).
  Seconds last_cpu_s() const { return last_cpu_s_; }

 private:
  // A step run and not yet waited for.
  struct Ran {
    policies::StepResult result;
    StepTiming timing;
    Seconds cpu_s = 0;   // its forward pass's thread CPU time
    bool timed = false;  // a forward pass that succeeded
  };
  // Runs a step, and keeps what the step after it needs (its tokens, whether it failed).
  void RunStep(const policies::StepPlan& plan, Ran* ran);
  void Run(const policies::StepPlan& plan, Ran* ran);
  void Loop();  // the step thread
  ForwardModel& model_;
  const policies::Clock& clock_;
  Options options_;
  std::vector<StepTiming> timings_;
  StepTiming last_;
  Seconds last_cpu_s_ = 0;
  // Steps submitted and not yet run, and run and not yet waited for (under mu_ with a step
  // thread); at most two in all.
  std::deque<const policies::StepPlan*> submitted_;
  std::deque<Ran> ran_;
  std::mutex mu_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::thread thread_;
  // Of the thread that runs the steps: the tokens the last step run sampled, by request,
  // whether it failed, and scratch.
  std::unordered_map<policies::RequestId, std::int32_t> previous_;
  bool previous_failed_ = false;
  std::vector<std::int32_t> token_ids_;  // the step's token ids, previous tokens put in
  std::vector<SequenceChunk> chunks_;
  std::vector<const policies::StepRow*> sampled_;           // rows that get a token, in plan order
  std::vector<policies::KvBlockManager::BlockId> written_;  // the KV blocks the step writes
  std::vector<float> logits_;
  std::vector<std::int32_t> greedy_;
};

}  // namespace duet::backend
