// Roofline step-cost model: FLOPs and HBM bytes of one engine step from its shape, turned into
// time with derated peak rates, plus TP all-reduce time and a fixed per-step overhead.
// The simulator calls StepTime for every step, so everything shape-independent is
// precomputed in the constructor and StepTime neither allocates nor branches on the model.
#include "models/cost_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/status.h"

namespace duet::models {

Tokens StepShape::PrefillTokens() const {
  Tokens total = 0;
  for (const PrefillChunk& chunk : prefill) total += chunk.tokens;
  return total;
}

RooflineCostModel::RooflineCostModel(ModelSpec model, HardwareSpec hw, RooflineOptions options)
    : model_(std::move(model)), hw_(std::move(hw)), options_(options) {
  // Bad options here are a programming error (callers validate user input), so check hard.
  DUET_CHECK(options_.tp >= 1);
  DUET_CHECK(options_.compute_efficiency > 0 && std::isfinite(options_.compute_efficiency));
  DUET_CHECK(options_.memory_efficiency > 0 && std::isfinite(options_.memory_efficiency));
  DUET_CHECK(options_.comm_efficiency > 0 && std::isfinite(options_.comm_efficiency));
  DUET_CHECK(options_.step_overhead >= 0 && options_.allreduce_latency >= 0);
  DUET_CHECK(hw_.bf16_flops > 0 && hw_.hbm_bw > 0 && hw_.nvlink_bw > 0);
  DUET_CHECK(model_.num_hidden_layers > 0 && model_.hidden_size > 0 && model_.head_dim > 0);

  DUET_CHECK(options_.dp >= 1);
  DUET_CHECK(options_.nodes >= 1 && (options_.tp * options_.dp) % options_.nodes == 0);
  DUET_CHECK(options_.nodes == 1 || options_.nic_bw > 0);
  const double layers = model_.num_hidden_layers;
  const double hidden = model_.hidden_size;
  const double heads = model_.num_attention_heads;
  const double bytes_per_element = double(model_.BytesPerElement());
  const WeightBreakdown weights = model_.Weights();

  // Matrix-multiply weights per layer of the attention: q/k/v/o, or MLA's.
  double attention_params = 0;
  for (const MatrixShape& m : model_.AttentionProjections())
    attention_params += double(m.in) * m.out;
  if (const auto& mla = model_.mla) {
    // Prefill: QK^T over the full key width, PV over v; the cached latents it attends to are
    // expanded to keys and values first. Decode: both over the latent (the rotary key too).
    prefill_flops_per_pair_ = layers * 2.0 * heads * (mla->QkHeadDim() + mla->v_head_dim);
    decode_flops_per_pair_ = layers * 2.0 * heads * (mla->CachedWidth() + mla->kv_lora_rank);
    prefill_context_flops_ =
        layers * 2.0 * mla->kv_lora_rank * heads * (mla->qk_nope_head_dim + mla->v_head_dim);
  } else {
    // QK^T and PV each cost 2 * q_width FLOPs per (query, key) pair.
    prefill_flops_per_pair_ = decode_flops_per_pair_ = layers * 4.0 * double(model_.QWidth());
  }
  // 2 FLOPs per multiply-add; gate, up and down of every MLP a token passes through.
  const double dense_layers = model_.DenseLayers();
  const double intermediate = model_.intermediate_size;
  double mlp_widths = dense_layers * intermediate;  // summed over layers, per token
  double router_params = 0;
  if (const auto& moe = model_.moe; moe && moe->moe_layers > 0) {
    experts_ = moe->experts;
    experts_per_token_ = moe->experts_per_token;
    moe_layers_ = moe->moe_layers;
    mlp_widths +=
        moe_layers_ * (experts_per_token_ + moe->shared_experts) * moe->expert_intermediate;
    router_params = moe_layers_ * hidden * experts_;
    expert_bytes_ = double(weights.routed_experts.bytes) / (experts_ * moe_layers_);
    a2a_bytes_per_token_ = experts_per_token_ * hidden * bytes_per_element;
  }
  linear_flops_per_token_ =
      2.0 * (layers * attention_params + 3.0 * hidden * mlp_widths + router_params);
  lm_head_flops_per_row_ = 2.0 * hidden * double(model_.vocab_size);
  // A step gathers its tokens' embedding rows; it reads the whole table only as the LM head,
  // which an untied model keeps as a separate matrix. Routed experts: as the step reaches them.
  weight_bytes_ = double(weights.NonExpert().bytes) -
                  (model_.tie_word_embeddings ? 0 : double(weights.embedding.bytes));
  embedding_row_bytes_ = hidden * bytes_per_element;
  kv_bytes_per_token_ = double(model_.KvBytesPerToken(options_.kv_cache_dtype));
  activation_bytes_per_token_ = bytes_per_element * (layers * 4.0 * hidden + 2.0 * mlp_widths);
  allreduce_bytes_per_token_ = hidden * bytes_per_element;
  allreduces_per_step_ = 2.0 * layers;  // after attention and after the MLP
  seconds_per_flop_ = 1.0 / (hw_.bf16_flops * options_.compute_efficiency);
  seconds_per_byte_ = 1.0 / (hw_.hbm_bw * options_.memory_efficiency);
  seconds_per_link_byte_ = 1.0 / (hw_.nvlink_bw * options_.comm_efficiency);
}

StepFeatures FeaturesOf(const StepShape& shape) {
  StepFeatures f;
  for (const PrefillChunk& chunk : shape.prefill) {
    DUET_CHECK(chunk.tokens >= 0 && chunk.context >= 0);
    if (chunk.tokens == 0) continue;
    const double n = double(chunk.tokens);
    const double c = double(chunk.context);
    f.prefill_chunks += 1.0;
    f.prefill_tokens += n;
    f.prefill_context_tokens += c;
    // Token i of the chunk (1-based) attends to the c cached tokens and i chunk tokens.
    f.prefill_pairs += n * c + n * (n + 1.0) * 0.5;
  }
  DUET_CHECK(shape.decode_tokens >= 0 && shape.decode_context_tokens >= 0 && shape.tp >= 1);
  f.decode_rows = double(shape.decode_tokens);
  f.decode_context_tokens = double(shape.decode_context_tokens);
  DUET_CHECK(shape.decode_draft_tokens >= 0);
  f.decode_draft_tokens = double(shape.decode_draft_tokens);
  f.tp = shape.tp;
  return f;
}

StepCostModel::Before StepCostModel::AfterWhatRanBefore(const StepShape& shape, Seconds idle_s,
                                                        const StepShape* previous) const {
  if (!previous || idle_s >= kIdleGap) return {AfterIdle(shape, idle_s), true};
  return {AfterStep(shape, *previous), false};
}

void StepCostModel::AppendDecodeRunEnds(StepShape shape, int steps, Seconds start,
                                        std::vector<Seconds>* ends) const {
  Seconds t = start;
  for (int s = 0; s < steps; ++s) {
    t += StepTime(shape);
    ends->push_back(t);
    shape.decode_context_tokens += shape.decode_tokens;
  }
}

StepCostBreakdown RooflineCostModel::Breakdown(const StepShape& shape) const {
  StepCostBreakdown cost;
  const StepFeatures f = FeaturesOf(shape);
  if (f.empty()) return cost;  // an empty step costs nothing, not even the overhead
  const double tokens = f.tokens();
  const double tp = TpOf(f);
  const double dp = options_.dp;
  const double gpus = tp * dp;
  // Every GPU does 1/G of the work: DP splits the tokens, TP the heads and widths, EP the
  // experts.
  const double flops =
      tokens * linear_flops_per_token_ + f.prefill_pairs * prefill_flops_per_pair_ +
      f.decode_pairs() * decode_flops_per_pair_ +
      f.prefill_context_tokens * prefill_context_flops_ + f.logit_rows() * lm_head_flops_per_row_;
  if (experts_ > 0) {
    // The experts T tokens reach when each picks k of E uniformly: E(1 - (1 - k/E)^T).
    cost.experts_read = moe_layers_ * experts_ *
                        -std::expm1(tokens * std::log1p(-experts_per_token_ / experts_)) / gpus;
  }
  // MLA's latent is whole on every GPU of a TP group; GQA's KV heads split up to tp ways.
  const double kv_split = dp * std::max(1, model_.KvShards(static_cast<int>(tp)));
  const double kv_bytes =
      (f.prefill_context_tokens + f.decode_context_tokens + tokens) * kv_bytes_per_token_;
  cost.flops = flops / gpus;
  cost.bytes = weight_bytes_ / tp + cost.experts_read * expert_bytes_ + kv_bytes / kv_split +
               tokens * (embedding_row_bytes_ + activation_bytes_per_token_) / gpus;
  cost.compute_s = cost.flops * seconds_per_flop_;
  cost.memory_s = cost.bytes * seconds_per_byte_;
  if (tp > 1) {
    const double ring_bytes = 2.0 * (tp - 1.0) / tp * tokens / dp * allreduce_bytes_per_token_;
    cost.comm_s =
        allreduces_per_step_ * (ring_bytes * seconds_per_link_byte_ + options_.allreduce_latency);
  }
  const AllToAll a2a = AllToAllOf(tokens, gpus);
  cost.a2a_bytes = a2a.bytes_per_gpu;
  if (cost.a2a_bytes > 0) {
    cost.comm_s +=
        a2a.seconds / options_.comm_efficiency + 2.0 * moe_layers_ * options_.allreduce_latency;
  }
  cost.total_s = std::max(cost.compute_s, cost.memory_s) + cost.comm_s + options_.step_overhead;
  return cost;
}

Seconds RooflineCostModel::StepTime(const StepShape& shape) const {
  return Breakdown(shape).total_s;
}

double RooflineCostModel::TpOf(const StepFeatures& f) const {
  return double(f.tp > 1 ? f.tp : options_.tp);
}

double RooflineCostModel::AllToAllBytes(double tokens, double gpus) const {
  if (experts_ == 0 || gpus <= 1) return 0;
  // Dispatch and combine: each GPU sends its 1/G of the tokens to their experts elsewhere.
  return 2.0 * moe_layers_ * tokens / gpus * a2a_bytes_per_token_ * (gpus - 1.0) / gpus;
}

StepCostModel::AllToAll RooflineCostModel::AllToAllOf(double tokens, double gpus) const {
  AllToAll a2a;
  a2a.bytes_per_gpu = AllToAllBytes(tokens, gpus);
  if (a2a.bytes_per_gpu <= 0) return a2a;
  // Peers are spread evenly: g - 1 of the G - 1 on the sender's node.
  const double per_node = gpus / options_.nodes;
  a2a.inter_node_bytes_per_gpu = a2a.bytes_per_gpu * (gpus - per_node) / (gpus - 1.0);
  const double intra = a2a.bytes_per_gpu - a2a.inter_node_bytes_per_gpu;
  a2a.seconds = intra / hw_.nvlink_bw;
  if (a2a.inter_node_bytes_per_gpu > 0)
    a2a.seconds = std::max(a2a.seconds, a2a.inter_node_bytes_per_gpu / options_.nic_bw);
  return a2a;
}

StepCostModel::AllToAll RooflineCostModel::ExpertTraffic(const StepShape& shape) const {
  if (experts_ == 0) return {};
  const StepFeatures f = FeaturesOf(shape);
  return AllToAllOf(f.tokens(), TpOf(f) * options_.dp);
}

SpeculativeCostModel::SpeculativeCostModel(std::unique_ptr<StepCostModel> target,
                                           std::unique_ptr<StepCostModel> drafter, int draft_tokens)
    : target_(std::move(target)), drafter_(std::move(drafter)), draft_tokens_(draft_tokens) {
  DUET_CHECK(target_ && drafter_ && draft_tokens_ >= 1);
}

Seconds SpeculativeCostModel::StepTime(const StepShape& shape) const {
  Seconds t = target_->StepTime(shape) + drafter_->StepTime(shape);
  if (shape.decode_tokens == 0) return t;
  // The later drafts: one token per row each, over the context grown by the tokens before.
  StepShape next;
  next.tp = shape.tp;
  next.decode_tokens = shape.decode_tokens;
  next.decode_context_tokens = shape.decode_context_tokens + shape.decode_tokens;
  for (int i = 1; i < draft_tokens_; ++i) {
    t += drafter_->StepTime(next);
    next.decode_context_tokens += next.decode_tokens;
  }
  return t;
}

}  // namespace duet::models
