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
  // Speculative decoding's verify step: the draft tokens the decode requests check beside
  // their own, each a query over the request's context and the tokens before it. (Last, so
  // that braced shapes {prefill, decode, context, tp} keep their meaning.)
  Tokens decode_draft_tokens = 0;

  Tokens PrefillTokens() const;
  Tokens TotalTokens() const { return PrefillTokens() + decode_tokens + decode_draft_tokens; }
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
  double decode_draft_tokens = 0;     // speculative drafts verified beside them
  int tp = 1;                         // the shape's TP degree as given (1: the model's own)

  double tokens() const { return prefill_tokens + decode_rows + decode_draft_tokens; }
  double logit_rows() const { return prefill_chunks + decode_rows + decode_draft_tokens; }
  // Pairs of decode attention: each row's w = 1 + drafts queries attend to its context and
  // causally to each other, w c + w (w + 1) / 2 (exact when every row has as many drafts).
  double decode_pairs() const {
    if (decode_rows == 0) return 0;
    const double w = 1 + decode_draft_tokens / decode_rows;
    return w * decode_context_tokens + decode_rows * w * (w + 1) / 2;
  }
  bool empty() const { return tokens() == 0; }
};
StepFeatures FeaturesOf(const StepShape& shape);

// An instance idle this long or longer before a step has sat idle (StepCostModel::AfterIdle);
// below it, the step follows the one before (AfterStep).
inline constexpr Seconds kIdleGap = 1e-3;

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
  // An idle engine's wake-up: from the message that wakes it to its next iteration, where the
  // model prices it (a host fit that measured it); 0 otherwise.
  virtual Seconds WakeTime() const { return 0; }
  // What a step takes beyond StepTime after its instance sat idle for `idle_s` (its previous
  // step ended that long before this one began), where the model prices it (a profile whose
  // calibration timed it: models/step_profile.h's AfterIdleFit); 0 otherwise.
  virtual Seconds AfterIdle(const StepShape& shape, Seconds idle_s) const { return 0; }
  // What a step takes beyond StepTime right after its instance's step `previous` (no idle spell
  // between them), where the model prices it (models/step_profile.h's ShapePairFit); 0 otherwise.
  virtual Seconds AfterStep(const StepShape& shape, const StepShape& previous) const { return 0; }
  // What the model adds to a step for what its instance ran before it, the one rule both worlds
  // price by: after an idle spell of kIdleGap or more since its previous step ended, or with no
  // step before it (`previous` null, `idle_s` since the start), AfterIdle; else AfterStep after
  // `previous`.
  struct Before {
    Seconds seconds = 0;
    bool after_idle = false;  // which of the two it is
  };
  Before AfterWhatRanBefore(const StepShape& shape, Seconds idle_s,
                            const StepShape* previous) const;
  // What a step takes beyond StepTime when it runs its whole length beside a step `neighbour` of
  // another instance on the same machine (sharing its memory bandwidth and caches), where the
  // model prices it (models/step_profile.h's ShapePairFit, `duet calibrate --beside`); 0
  // otherwise. The simulator runs a step at alone / (alone + this) of its pace while the other
  // instance's step runs (sim/instance_ports.cpp).
  virtual bool PricesBeside() const { return false; }
  virtual Seconds Beside(const StepShape& shape, const StepShape& neighbour) const { return 0; }

  // A step's expert-parallel all-to-all: the bytes each GPU sends (dispatch and combine, every
  // MoE layer) and what moving them at the link's full bandwidth takes, the part of StepTime
  // the simulator replaces by moving them over its network, where KV transfers and tier
  // traffic share the links: the step lasts StepTime - seconds, then the exchange (the rest of
  // the priced exchange, the link efficiency's share and each call's latency, stays in the
  // step). Zero on one GPU, for a dense model, or where the model does not price it apart (a
  // fitted profile). Of an instance across nodes, `inter_node_bytes_per_gpu` of each GPU's
  // bytes go to GPUs on other nodes (over its NIC), the rest within its node (over NVLink), the
  // two at once.
  struct AllToAll {
    double bytes_per_gpu = 0;
    double inter_node_bytes_per_gpu = 0;
    Seconds seconds = 0;
  };
  virtual AllToAll ExpertTraffic(const StepShape& shape) const { return {}; }
};

struct RooflineOptions {
  int tp = 1;
  int dp = 1;  // attention data-parallel ranks (models/model_spec.h's MemoryOptions)
  // The nodes the instance's tp * dp GPUs span, as many on each; a TP group stays within a
  // node. Across nodes the expert all-to-all crosses each GPU's NIC of `nic_bw` per direction.
  int nodes = 1;
  BytesPerSecond nic_bw = 0;
  double compute_efficiency = 0.6;      // achieved / peak FLOP/s on matrix multiplies
  double memory_efficiency = 0.8;       // achieved / peak HBM bandwidth
  double comm_efficiency = 0.7;         // achieved / peak NVLink bandwidth for TP all-reduce
  Seconds step_overhead = 0.002;        // per-step fixed cost (scheduling, launch), seconds
  Seconds allreduce_latency = 10e-6;    // per all-reduce (or expert all-to-all) call
  std::optional<Dtype> kv_cache_dtype;  // KV bytes read and written; nullopt: "auto"
};

// What a step costs, per GPU of the instance.
struct StepCostBreakdown {
  double flops = 0;  // per GPU
  double bytes = 0;  // HBM bytes per GPU: weights once per step + KV reads/writes + activations
  Seconds compute_s = 0;    // flops / (peak * compute_efficiency)
  Seconds memory_s = 0;     // bytes / (bw * memory_efficiency)
  double experts_read = 0;  // routed experts whose weights the step reads, all layers, per GPU
  double a2a_bytes = 0;     // expert-parallel dispatch and combine, sent per GPU
  Seconds comm_s = 0;       // TP all-reduces and expert all-to-alls (0 on one GPU)
  Seconds total_s = 0;      // max(compute, memory) + comm + overhead
};

// Roofline: per layer, FLOPs of the attention's projections, attention itself (QK^T and PV over
// the cached context plus the causal part of the chunk), the SwiGLU MLP or the experts each
// token is routed to; plus the LM head for the tokens that produce logits (last token of each
// finished prefill chunk and each decode token: conservatively every decode token and one per
// chunk). Bytes: weights read once per step, KV read for attention context, KV written for
// new tokens.
//
// With T tokens in the step, h = hidden, q = heads*head_dim, kv = kv_heads*head_dim,
// I = intermediate, L = layers, V = vocab, e = bytes per element, for a dense GQA model:
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
// flops and bytes are divided by tp.
//
// A mixture of experts (E routed experts, k per token, on G = tp * dp GPUs): each token's
// linear FLOPs cover its k experts and the shared ones; the step reads the weights of the
// experts its tokens reach, E(1 - (1 - k/E)^T) per MoE layer when tokens route uniformly,
// spread over the G GPUs; dispatch and combine each send T/G * k * h * e * (G-1)/G bytes per
// GPU per MoE layer (the tokens leaving for experts on other GPUs). Over N nodes of g = G/N GPUs
// each, (G - g)/(G - 1) of those bytes cross the GPU's NIC while the rest moves over NVLink:
// the exchange lasts the longer of the two. MLA attention: prefill runs
// as multi-head attention of (qk_nope + qk_rope) key and v_head_dim value widths after
// expanding the cached latents; decode runs absorbed, over the kv_lora_rank + qk_rope latent.
// dp ranks split the tokens and the KV cache; the non-expert weights are read once per TP
// group; TP does not split MLA's latent, so each GPU reads all of its rank's.
//
// Tensor parallelism is options.tp; a shape whose tp is set above 1 overrides it, so one model
// can price shapes of several TP degrees. Every term is linear in decode_context_tokens, so
// memory-bound decode steps cost exactly a + b * context. StepTime allocates nothing and costs
// O(chunks).
class RooflineCostModel : public StepCostModel {
 public:
  RooflineCostModel(ModelSpec model, HardwareSpec hw, RooflineOptions options);
  Seconds StepTime(const StepShape& shape) const override;
  AllToAll ExpertTraffic(const StepShape& shape) const override;
  StepCostBreakdown Breakdown(const StepShape& shape) const;
  const RooflineOptions& options() const { return options_; }

 private:
  double TpOf(const StepFeatures& f) const;  // the shape's TP degree, else the options'
  // The expert-parallel dispatch and combine bytes each of `gpus` GPUs sends for `tokens`.
  double AllToAllBytes(double tokens, double gpus) const;
  // That exchange split by where it goes, and how long it takes at full link bandwidth.
  AllToAll AllToAllOf(double tokens, double gpus) const;

  ModelSpec model_;
  HardwareSpec hw_;
  RooflineOptions options_;
  // Per-model constants, precomputed so StepTime is a few dozen flops.
  double linear_flops_per_token_ = 0;  // all layers, the routed experts a token uses included
  double prefill_flops_per_pair_ = 0;  // one query-key pair, all layers, QK^T and PV
  double decode_flops_per_pair_ = 0;
  double prefill_context_flops_ = 0;  // per cached token a chunk attends to (MLA expands it)
  double lm_head_flops_per_row_ = 0;
  double weight_bytes_ = 0;  // read once per step: all but an untied table and routed experts
  double expert_bytes_ = 0;  // one routed expert of one layer
  double experts_ = 0, experts_per_token_ = 0, moe_layers_ = 0;
  double a2a_bytes_per_token_ = 0;  // one token's hidden state to each of its k experts
  double embedding_row_bytes_ = 0;  // one token's embedding row, gathered per token
  double kv_bytes_per_token_ = 0;
  double activation_bytes_per_token_ = 0;  // all layers
  double allreduce_bytes_per_token_ = 0;   // one all-reduce of one token's hidden state
  double allreduces_per_step_ = 0;         // 2 per layer
  double seconds_per_flop_ = 0;            // 1 / (peak * compute_efficiency)
  double seconds_per_byte_ = 0;            // 1 / (HBM bandwidth * memory_efficiency)
  double seconds_per_link_byte_ = 0;       // 1 / (NVLink bandwidth * comm_efficiency)
};

// Speculative decoding's steps: the target model's step, its decode rows verifying their drafts
// (StepShape::decode_draft_tokens), plus the drafter's work for the next step: one pass over
// the same tokens (the prompt chunks it caches too, and each row's verified tokens), then
// k - 1 passes of one token per decode row. The drafter is a draft model, or the target's own
// multi-token-prediction layers (ModelSpec::MtpDrafter), priced by its own model. Without
// drafts (a prefill-only step) the drafter still runs its pass over the prompt.
class SpeculativeCostModel : public StepCostModel {
 public:
  SpeculativeCostModel(std::unique_ptr<StepCostModel> target,
                       std::unique_ptr<StepCostModel> drafter, int draft_tokens);
  Seconds StepTime(const StepShape& shape) const override;
  AllToAll ExpertTraffic(const StepShape& shape) const override {
    return target_->ExpertTraffic(shape);
  }

 private:
  std::unique_ptr<StepCostModel> target_, drafter_;
  int draft_tokens_;
};

}  // namespace duet::models
