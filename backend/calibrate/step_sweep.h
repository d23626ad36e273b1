// The sweep of `duet calibrate`: which step shapes it times on a backend, and the timer that
// runs one shape's forward pass. The fit is models/step_fit.h.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "backend/engine/forward_model.h"
#include "common/units.h"
#include "models/cost_model.h"

namespace duet::backend {

struct SweepLimits {
  Tokens max_tokens = 1024;   // largest prefill chunk
  Tokens max_context = 2048;  // largest cached context per sequence
  Tokens max_batch = 32;      // largest decode batch
  Tokens positions = 0;       // the model's max_position_embeddings
  // From a trace (`duet calibrate --trace`): prompt lengths and decode contexts it holds (e.g. its
  // quantiles), each also swept; empty: the ladders alone.
  std::vector<Tokens> trace_prompts;
  std::vector<Tokens> trace_contexts;
};

// Prefill chunks of 16 tokens up to max_tokens over cached contexts 0, 256, 1024, ... up to
// max_context, batches of equal fresh chunks; decode batches of every row count up to 16, then
// 24, 32, 48, 64, ... up to max_batch rows over contexts 64, 256, ... up to max_context; mixed
// steps of a chunk beside a decode batch. In a fixed order (the fit holds out one in four shapes of
// each class), each shape once, every sequence within the model's positions. Then, from a trace:
// each of its prompt lengths as the engine's chunks at max_tokens cut it (the first chunk, and the
// last after the context of the others), and decode batches of 1, 4, 16, ... rows at each of its
// contexts.
std::vector<models::StepShape> CalibrationShapes(const SweepLimits& limits);

// The idle spells `duet calibrate` times a step after (models::AfterIdleFit), in seconds: a
// live engine sits idle between bursts, and a CPU pass after a spell of a second ran 1.9x on the
// development VM (docs/validation.md).
inline constexpr std::array<Seconds, 4> kIdleSpells = {0.01, 0.1, 0.3, 1.0};
// The shapes timed after them: one prefill chunk of min(256, max_tokens) tokens at no context,
// and a one-row decode step at min(256, max_context) tokens of context.
struct AfterIdleShapes {
  models::StepShape prefill, decode;
};
AfterIdleShapes AfterIdleShapesFor(const SweepLimits& limits);

// The reference shapes `duet calibrate` times each right after the others
// (models::ShapePairFit): decode steps of 1 and min(8, max_batch) rows at min(256, max_context)
// tokens of context per row, and one prefill chunk of each of min(64, max_tokens),
// min(256, max_tokens) and min(1024, max_tokens) tokens at no context, each size once.
struct AfterStepShapes {
  std::vector<Tokens> decode_rows, prefill_tokens;
  Tokens decode_context = 0;              // of each decode row
  std::vector<models::StepShape> shapes;  // the decode steps, then the prefills, as above
};
AfterStepShapes AfterStepShapesFor(const SweepLimits& limits);

// The KV transfers `duet calibrate --transport` times, in blocks: 1, 2, 3, 4, 6, 8, 12, ...
// (powers of two and halfway between) up to max_blocks, which is always among them. Ascending.
std::vector<std::int64_t> TransferBlockCounts(std::int64_t max_blocks);

// KV blocks a shape needs: each sequence its own, ceil((context + tokens) / block) of them.
std::int64_t BlocksFor(const models::StepShape& shape, std::int32_t block_tokens);

// Times one forward pass of a shape (prefill chunks and decode rows, each emitting its last
// logits row, as the engine runs them) over blocks 0.. of the model's cache, which must hold
// BlocksFor(shape). The cached context is whatever those blocks hold: attention does the same
// work whatever the values are. Token ids are fixed, spread over the vocabulary.
class StepTimer {
 public:
  explicit StepTimer(ForwardModel& model);
  Seconds Time(const models::StepShape& shape);
  // Times a pass right after an untimed pass of the same shape: as in a run of such steps,
  // whatever ran before. A CPU pass runs slower after another kind of step (a one-row decode
  // step up to 1.5 times after a 1,024-token prefill on the development VM,
  // bench/step_order.sh), so a sweep in a fixed order would time each shape by its predecessor.
  Seconds TimeInARun(const models::StepShape& shape);
  // What a pass of `shape` takes beyond its time in a run right after sleeping each of `spells`:
  // per spell, each of `repeats` passes over the spells' pass after the spell less the pass just
  // before it (in a run). models::FitAfterIdle fits them.
  std::vector<std::vector<Seconds>> TimeAfterIdle(const models::StepShape& shape,
                                                  std::span<const Seconds> spells, int repeats);
  // What a pass of each of `shapes` takes beyond its time in a run right after a pass of each
  // other one: [shape][before][repeat], each repeat a pass over all of them (each shape timed
  // in a run, then after each other shape in turn); empty where shape == before.
  std::vector<std::vector<std::vector<Seconds>>> TimeAfterSteps(
      std::span<const models::StepShape> shapes, int repeats);
  // What a pass of each of `shapes` takes beyond its time in a run while `neighbour`, a second
  // copy of the model, runs each of them over and over on its own thread (NeighbourLoop), as two
  // instances on one machine share its memory bandwidth and caches: `extra`
  // [shape][neighbour's][repeat], each repeat a pass over all of them (each shape timed in a run
  // alone, `alone` [shape][repeat], then beside each).
  struct Beside {
    std::vector<std::vector<std::vector<Seconds>>> extra;
    std::vector<std::vector<Seconds>> alone;
  };
  Beside TimeBeside(std::span<const models::StepShape> shapes, ForwardModel& neighbour,
                    int repeats);

 private:
  void Build(const models::StepShape& shape);

  ForwardModel& model_;
  std::vector<std::int32_t> ids_;
  std::vector<std::int32_t> tokens_;
  std::vector<std::vector<std::int32_t>> tables_;
  std::vector<SequenceChunk> batch_;
  std::vector<float> logits_;
};

// Another instance on the same machine: runs `shape`'s pass on `model` over and over on its own
// thread from construction (once the thread runs) until destruction (after the pass in
// progress).
class NeighbourLoop {
 public:
  NeighbourLoop(ForwardModel& model, const models::StepShape& shape);
  ~NeighbourLoop();
  NeighbourLoop(const NeighbourLoop&) = delete;
  NeighbourLoop& operator=(const NeighbourLoop&) = delete;

 private:
  std::atomic<bool> started_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace duet::backend
