// Fault injection for the forward pass, by wrapping, as LevelDB's FaultInjectionTestEnv wraps
// its Env: FaultInjectingModel delegates to the ForwardModel it owns and fails the passes a
// rule picks, for tests of what a failed pass leads to (the engine ends that step's requests
// with an error and keeps serving). InjectForwardFaultsFromEnvironment is the test-only hook
// through which a real `duet serve` or `duet worker` wraps its model (docs/development.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/engine/forward_model.h"

namespace duet::backend {

class FaultInjectingModel final : public ForwardModel {
 public:
  //   kFailBefore  the pass fails without reaching the model: nothing computed, no KV written
  //   kFailAfter   the model runs the pass (its KV blocks written), then the pass fails, as a
  //                CUDA error that surfaces at the stream's synchronization does; what the
  //                model appended to the output is taken back
  enum class Fault { kNone, kFailBefore, kFailAfter };
  // Asked once per pass (Forward or ForwardGreedy), on the thread that runs it, with the pass's
  // number (0: the first through this wrapper, warm-up passes included) and its batch.
  using Rule = std::function<Fault(std::int64_t pass, std::span<const SequenceChunk> batch)>;

  FaultInjectingModel(std::unique_ptr<ForwardModel> inner, Rule rule);

  Status Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) override;
  Status ForwardGreedy(std::span<const SequenceChunk> batch,
                       std::vector<std::int32_t>* tokens) override;
  const models::ModelSpec& config() const override { return inner_->config(); }
  std::int64_t num_blocks() const override { return inner_->num_blocks(); }
  std::int32_t block_tokens() const override { return inner_->block_tokens(); }
  models::Dtype kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }
  std::int64_t kv_cache_bytes() const override { return inner_->kv_cache_bytes(); }
  std::optional<KvRegion> kv_region() override { return inner_->kv_region(); }

  // Passes run through the wrapper, and those it failed (any thread).
  std::int64_t passes() const { return passes_.load(std::memory_order_relaxed); }
  std::int64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  // Numbers the next pass and asks the rule about it.
  Fault Next(std::span<const SequenceChunk> batch, std::int64_t* pass);
  Status Failed(std::int64_t pass, Fault fault);

  std::unique_ptr<ForwardModel> inner_;
  Rule rule_;
  std::atomic<std::int64_t> passes_{0};
  std::atomic<std::int64_t> failures_{0};
};

// The environment variable of the hook below: a path.
inline constexpr char kFailForwardWhileFileEnv[] = "DUET_FAULT_INJECTION_FAIL_FORWARD_WHILE";

// Test-only fault-injection hook of `duet serve` and `duet worker`: with the environment
// variable DUET_FAULT_INJECTION_FAIL_FORWARD_WHILE set to a path, returns `model` wrapped in a
// FaultInjectingModel that fails every forward pass (kFailAfter) made while a file exists at
// that path (one stat per pass), so an end-to-end test turns failures on and off by creating
// and removing the file. Unset or empty: returns `model` itself.
std::unique_ptr<ForwardModel> InjectForwardFaultsFromEnvironment(
    std::unique_ptr<ForwardModel> model);

}  // namespace duet::backend
