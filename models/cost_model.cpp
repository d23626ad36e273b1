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

  const double layers = model_.num_hidden_layers;
  const double hidden = model_.hidden_size;
  const double q_width = double(model_.num_attention_heads) * model_.head_dim;
  const double kv_width = double(model_.num_key_value_heads) * model_.head_dim;
  const double intermediate = model_.intermediate_size;
  const double bytes_per_element = double(model_.BytesPerElement());
  const double embedding_bytes = double(model_.vocab_size) * hidden * bytes_per_element;

  // 2 FLOPs per multiply-add: q, k, v, o projections and gate, up, down.
  linear_flops_per_token_ =
      layers * 2.0 *
      (hidden * q_width + 2.0 * hidden * kv_width + q_width * hidden + 3.0 * hidden * intermediate);
  // QK^T and PV each cost 2 * q_width FLOPs per (query, key) pair.
  attention_flops_per_pair_ = layers * 4.0 * q_width;
  lm_head_flops_per_row_ = 2.0 * hidden * double(model_.vocab_size);
  // A step gathers its tokens' embedding rows; it reads the whole table only as the LM head,
  // which an untied model keeps as a separate matrix (counted in WeightBytes).
  weight_bytes_ = double(model_.WeightBytes()) - (model_.tie_word_embeddings ? 0 : embedding_bytes);
  embedding_row_bytes_ = hidden * bytes_per_element;
  kv_bytes_per_token_ = double(model_.KvBytesPerToken(options_.kv_cache_dtype));
  activation_bytes_per_token_ = bytes_per_element * layers * (4.0 * hidden + 2.0 * intermediate);
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
  f.tp = shape.tp;
  return f;
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
  const double tp = double(f.tp > 1 ? f.tp : options_.tp);
  const double flops = tokens * linear_flops_per_token_ +
                       (f.prefill_pairs + f.decode_pairs()) * attention_flops_per_pair_ +
                       f.logit_rows() * lm_head_flops_per_row_;
  const double bytes =
      weight_bytes_ + tokens * embedding_row_bytes_ +
      (f.prefill_context_tokens + f.decode_context_tokens + tokens) * kv_bytes_per_token_ +
      tokens * activation_bytes_per_token_;
  cost.flops = flops / tp;
  cost.bytes = bytes / tp;
  cost.compute_s = cost.flops * seconds_per_flop_;
  cost.memory_s = cost.bytes * seconds_per_byte_;
  if (tp > 1) {
    const double ring_bytes = 2.0 * (tp - 1.0) / tp * tokens * allreduce_bytes_per_token_;
    cost.comm_s =
        allreduces_per_step_ * (ring_bytes * seconds_per_link_byte_ + options_.allreduce_latency);
  }
  cost.total_s = std::max(cost.compute_s, cost.memory_s) + cost.comm_s + options_.step_overhead;
  return cost;
}

Seconds RooflineCostModel::StepTime(const StepShape& shape) const {
  return Breakdown(shape).total_s;
}

}  // namespace duet::models
