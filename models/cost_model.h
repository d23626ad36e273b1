// Step cost models: predict how long one engine step takes from its shape. The roofline model
// is built from the model and hardware specs; a calibrated model (from measured step records)
// will implement the same interface. Pure C++.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "common/units.h"
#include "models/host_time.h"
#include "models/model_spec.h"

namespace duet::models {

// One prefill chunk: `tokens` new prompt tokens computed after `context` tokens already in
// the KV cache (from a prefix-cache hit or earlier chunks).
struct PrefillChunk {
  Tokens tokens = 0;
  Tokens context = 0;
};

// The shape of one step (a mixed batch). Decode requests are aggregated: each decodes one
// token; `decode_context_tokens` is the sum of the tokens already in their KV caches (the
// token being decoded is not included: like a prefill chunk's `context`).
struct StepShape {
  std::vector<PrefillChunk> prefill;
  Tokens decode_tokens = 0;
  Tokens decode_context_tokens = 0;
  int tp = 1;

  Tokens PrefillTokens() const;
  Tokens TotalTokens() const { return PrefillTokens() + decode_tokens; }
};

// What a step does, in the quantities its cost depends on: the roofline's inputs, and the
// columns a fitted cost model (models/step_profile.h) is fitted on. O(chunks) to compute.
struct StepFeatures {
  double prefill_chunks = 0;          // chunks with tokens: each emits one logit row
  double prefill_tokens = 0;          // new prompt tokens
  double prefill_context_tokens = 0;  // cached tokens those chunks attend to (KV read)
  double prefill_pairs = 0;           // causal (query, key) pairs of the chunks, context included
  double decode_rows = 0;             // decoding requests, one token each
  double decode_context_tokens = 0;   // cached tokens they attend to (KV read)
  int tp = 1;                         // the shape's TP degree as given (1: the model's own)

  double tokens() const { return prefill_tokens + decode_rows; }
  double logit_rows() const { return prefill_chunks + decode_rows; }
  // Pairs of decode attention: each row attends to its context and to itself.
  double decode_pairs() const { return decode_context_tokens + decode_rows; }
  bool empty() const { return tokens() == 0; }
};
StepFeatures FeaturesOf(const StepShape& shape);

class StepCostModel {
 public:
  virtual ~StepCostModel() = default;
  // Predicted wall time of the step. Must be > 0 for a non-empty step, and pure: the same
  // shape always gives the same time. Thread-safe (const).
  virtual Seconds StepTime(const StepShape& shape) const = 0;
  // A decode run: `steps` steps of `shape` (decodes only), step s attending over s more tokens
  // per request than step 0. Appends each step's end time, the first step starting at
  // `start`: the times StepTime gives step by step, which a model may compute faster.
  virtual void AppendDecodeRunEnds(StepShape shape, int steps, Seconds start,
                                   std::vector<Seconds>* ends) const;
  // The engine's host time outside the forward pass of a step with these counts
  // (models/host_time.h), where the model prices it apart (a fitted profile with a host fit);
  // 0 otherwise (the roofline's per-step overhead stands for it).
  virtual bool PricesHost() const { return false; }
  virtual Seconds HostTime(const HostCounts& counts) const { return 0; }
};

struct RooflineOptions {
  int tp = 1;
  double compute_efficiency = 0.6;      // achieved / peak FLOP/s on matrix multiplies
  double memory_efficiency = 0.8;       // achieved / peak HBM bandwidth
  double comm_efficiency = 0.7;         // achieved / peak NVLink bandwidth for TP all-reduce
  Seconds step_overhead = 0.002;        // per-step fixed cost (scheduling, launch), seconds
  Seconds allreduce_latency = 10e-6;    // per all-reduce call
  std::optional<Dtype> kv_cache_dtype;  // KV bytes read and written; nullopt: "auto"
};

// What a step costs, per GPU of the instance.
struct StepCostBreakdown {
  double flops = 0;  // per GPU
  double bytes = 0;  // HBM bytes per GPU: weights once per step + KV reads/writes + activations
  Seconds compute_s = 0;  // flops / (peak * compute_efficiency)
  Seconds memory_s = 0;   // bytes / (bw * memory_efficiency)
  Seconds comm_s = 0;     // TP all-reduces (0 when tp == 1)
  Seconds total_s = 0;    // max(compute, memory) + comm + overhead
};

// Roofline: per layer, FLOPs of q/k/v/o projections, attention (QK^T and PV over the cached
// context plus the causal part of the chunk), the SwiGLU MLP; plus the LM head for the tokens
// that produce logits (last token of each finished prefill chunk and each decode token —
// conservatively every decode token and one per chunk). Bytes: weights read once per step,
// KV read for attention context, KV written for new tokens. Divided across `tp` GPUs.
//
// With T tokens in the step, h = hidden, q = heads*head_dim, kv = kv_heads*head_dim,
// I = intermediate, L = layers, V = vocab, e = bytes per element:
//   flops  = L * 2T(hq + 2h*kv + qh + 3hI)                       linear layers
//          + L * 4q * (sum over chunks of n(c + (n+1)/2)          causal attention
//                      + decode_context_tokens + decode_tokens)
//          + 2hV * (chunks with tokens + decode_tokens)           LM head
//   bytes  = WeightBytes - embedding table (when not tied)        weights, once per step
//          + e * h * T                                           the embedding rows gathered
//          + KvBytesPerToken * (sum of chunk contexts + decode_context_tokens)   KV read
//          + KvBytesPerToken * T                                  KV written
//          + e * L * T * (4h + 2I)                                activations: the residual
//            stream in and out of both sublayers, the MLP intermediate written and read
//   comm_s = 2L all-reduces of T*h*e bytes, ring: 2(tp-1)/tp * size / (nvlink * eff) + latency
// flops and bytes are divided by tp. Every term is linear in decode_context_tokens, so
// memory-bound decode steps cost exactly a + b * context.
//
// Tensor parallelism is options.tp; a shape whose tp is set above 1 overrides it, so one model
// can price shapes of several TP degrees. StepTime allocates nothing and costs O(chunks).
class RooflineCostModel : public StepCostModel {
 public:
  RooflineCostModel(ModelSpec model, HardwareSpec hw, RooflineOptions options);
  Seconds StepTime(const StepShape& shape) const override;
  StepCostBreakdown Breakdown(const StepShape& shape) const;
  const RooflineOptions& options() const { return options_; }

 private:
  ModelSpec model_;
  HardwareSpec hw_;
  RooflineOptions options_;
  // Per-model constants, precomputed so StepTime is a few dozen flops.
  double linear_flops_per_token_ = 0;    // all layers
  double attention_flops_per_pair_ = 0;  // one query-key pair, all layers, QK^T and PV
  double lm_head_flops_per_row_ = 0;
  double weight_bytes_ = 0;         // read once per step: all but an untied embedding table
  double embedding_row_bytes_ = 0;  // one token's embedding row, gathered per token
  double kv_bytes_per_token_ = 0;
  double activation_bytes_per_token_ = 0;  // all layers
  double allreduce_bytes_per_token_ = 0;   // one all-reduce of one token's hidden state
  double allreduces_per_step_ = 0;         // 2 per layer
  double seconds_per_flop_ = 0;            // 1 / (peak * compute_efficiency)
  double seconds_per_byte_ = 0;            // 1 / (HBM bandwidth * memory_efficiency)
  double seconds_per_link_byte_ = 0;       // 1 / (NVLink bandwidth * comm_efficiency)
};

}  // namespace duet::models
