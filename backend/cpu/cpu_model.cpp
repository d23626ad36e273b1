// CPU forward pass of a Llama-family model over the paged KV cache (see cpu_model.h).
#include "backend/cpu/cpu_model.h"

#include <cmath>
#include <cstring>

namespace duet::backend {

namespace k = kernels::cpu;

namespace {

// The loader admits exactly the dtypes the kernels take.
k::WeightDtype KernelDtype(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32:
      return k::WeightDtype::kF32;
    case Dtype::kBF16:
      return k::WeightDtype::kBF16;
    case Dtype::kF16:
      return k::WeightDtype::kF16;
  }
  DUET_CHECK_MSG(false, "unknown dtype");
  return k::WeightDtype::kF32;
}

}  // namespace

CpuModel::CpuModel(LoadedModel model, const CpuModelOptions& options)
    : model_(std::move(model)), options_(options), pool_(options.threads) {}

k::Weight CpuModel::ToWeight(const TensorView& t) {
  k::Weight w;
  w.dtype = KernelDtype(t.dtype);
  w.rows = t.shape.size() == 2 ? t.shape[0] : 1;
  w.cols = t.shape.size() == 2 ? t.shape[1] : (t.shape.empty() ? 1 : t.shape[0]);
  w.data = t.data;
  if (!t.IsAligned()) {
    // The kernels load whole elements; a misaligned tensor (legal in safetensors, rare in
    // practice) gets an aligned copy. A vector's buffer keeps its address when moved.
    std::vector<float> copy((t.bytes + sizeof(float) - 1) / sizeof(float));
    std::memcpy(copy.data(), t.data, t.bytes);
    realigned_.push_back(std::move(copy));
    w.data = realigned_.back().data();
  }
  weight_bytes_ += static_cast<std::int64_t>(t.bytes);
  return w;
}

Result<std::unique_ptr<CpuModel>> CpuModel::Create(LoadedModel model,
                                                   const CpuModelOptions& options) {
  if (options.num_blocks < 1 || options.block_tokens < 1)
    return Status::Error("CPU model needs at least one KV block of at least one token");
  std::unique_ptr<CpuModel> m(new CpuModel(std::move(model), options));
  const models::ModelSpec& c = m->model_.config;
  const LlamaWeights& w = m->model_.weights;
  m->inv_freq_ = c.RopeInvFrequencies();
  m->embed_ = m->ToWeight(w.embed_tokens);
  m->final_norm_ = m->ToWeight(w.norm);
  m->lm_head_ = w.lm_head_tied ? m->embed_ : m->ToWeight(w.lm_head);
  // Sized by the one KV formula: kv_bytes_per_token() for every token of every block.
  m->kv_dtype_ = options.kv_cache_dtype.value_or(c.AutoKvCacheDtype());
  m->kv_bytes_ = options.num_blocks * options.block_tokens * m->kv_bytes_per_token();
  if (options.kv_allocator) {
    auto memory = options.kv_allocator(m->kv_bytes_);
    if (!memory.ok()) return Status::Error("allocating the KV cache: " + memory.error());
    m->kv_memory_ = std::move(*memory);
  } else {
    m->kv_memory_ = AllocateHeapKvMemory(m->kv_bytes_);
  }
  m->kv_cache_ = static_cast<unsigned char*>(m->kv_memory_->data());
  std::memset(m->kv_cache_, 0, static_cast<std::size_t>(m->kv_bytes_));
  for (const LlamaLayerWeights& lw : w.layers) {
    Layer l;
    l.input_norm = m->ToWeight(lw.input_layernorm);
    l.q = m->ToWeight(lw.q_proj);
    l.k = m->ToWeight(lw.k_proj);
    l.v = m->ToWeight(lw.v_proj);
    l.o = m->ToWeight(lw.o_proj);
    if (lw.q_bias) l.q_bias = m->ToWeight(*lw.q_bias);
    if (lw.k_bias) l.k_bias = m->ToWeight(*lw.k_bias);
    if (lw.v_bias) l.v_bias = m->ToWeight(*lw.v_bias);
    if (lw.o_bias) l.o_bias = m->ToWeight(*lw.o_bias);
    l.post_norm = m->ToWeight(lw.post_attention_layernorm);
    l.gate = m->ToWeight(lw.gate_proj);
    l.up = m->ToWeight(lw.up_proj);
    l.down = m->ToWeight(lw.down_proj);
    m->layers_.push_back(std::move(l));
  }
  return m;
}

std::optional<KvRegion> CpuModel::kv_region() {
  return KvRegion{kv_cache_, options_.block_tokens * kv_bytes_per_token(), options_.num_blocks,
                  options_.kv_allocator ? kv_memory_.get() : nullptr};
}

k::PagedKvLayer CpuModel::KvLayer(std::int64_t layer) {
  const models::ModelSpec& c = model_.config;
  k::PagedKvLayer kv{nullptr,
                     nullptr,
                     options_.block_tokens,
                     c.num_key_value_heads,
                     c.head_dim,
                     options_.num_blocks,
                     KernelDtype(kv_dtype_),
                     0};
  const std::int64_t block_elements = kv.block_elements();
  kv.block_stride = 2 * static_cast<std::int64_t>(layers_.size()) * block_elements;
  const auto element_bytes = static_cast<std::int64_t>(models::DtypeBytes(kv_dtype_));
  unsigned char* k_base = kv_cache_ + 2 * layer * block_elements * element_bytes;
  kv.k = k_base;
  kv.v = k_base + block_elements * element_bytes;
  return kv;
}

Status CpuModel::Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) {
  const models::ModelSpec& c = model_.config;
  const std::int64_t hidden = c.hidden_size, qw = c.QWidth(), kvw = c.KvWidth();
  const std::int64_t inter = c.intermediate_size;
  ids_.clear();
  positions_.clear();
  for (const SequenceChunk& s : batch) {
    DUET_CHECK(!s.tokens.empty());
    DUET_CHECK(static_cast<std::int64_t>(s.block_table.size()) * options_.block_tokens >=
               s.context_before + static_cast<std::int64_t>(s.tokens.size()));
    for (std::size_t i = 0; i < s.tokens.size(); ++i) {
      ids_.push_back(s.tokens[i]);
      positions_.push_back(
          static_cast<std::int32_t>(s.context_before + static_cast<std::int64_t>(i)));
    }
  }
  const auto n = static_cast<std::int64_t>(ids_.size());
  auto size = [n](std::vector<float>& v, std::int64_t width) {
    v.resize(static_cast<std::size_t>(n * width));
  };
  size(x_, hidden);
  size(h_, hidden);
  size(q_, qw);
  size(k_, kvw);
  size(v_, kvw);
  size(attn_, qw);
  size(o_, hidden);
  size(gate_, inter);
  size(up_, inter);
  size(act_, inter);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  auto bias = [](const std::optional<k::Weight>& b) { return b ? &*b : nullptr; };

  k::Embedding(x_.data(), ids_, embed_);
  for (std::size_t index = 0; index < layers_.size(); ++index) {
    const Layer& layer = layers_[index];
    k::RmsNorm(h_.data(), x_.data(), n, hidden, layer.input_norm, eps, &pool_);
    k::MatMul(q_.data(), h_.data(), n, layer.q, bias(layer.q_bias), &pool_);
    k::MatMul(k_.data(), h_.data(), n, layer.k, bias(layer.k_bias), &pool_);
    k::MatMul(v_.data(), h_.data(), n, layer.v, bias(layer.v_bias), &pool_);
    k::Rope(q_.data(), c.num_attention_heads, k_.data(), c.num_key_value_heads, c.head_dim,
            positions_, inv_freq_.data(), 1.0f, &pool_);
    const k::PagedKvLayer kv = KvLayer(static_cast<std::int64_t>(index));
    std::int64_t row = 0;
    for (const SequenceChunk& s : batch) {
      const auto len = static_cast<std::int64_t>(s.tokens.size());
      k::WriteKv(kv, s.block_table, s.context_before, len, k_.data() + row * kvw,
                 v_.data() + row * kvw);
      k::PagedAttention(attn_.data() + row * qw, q_.data() + row * qw, len, c.num_attention_heads,
                        kv, s.block_table, s.context_before, scale, &pool_);
      row += len;
    }
    k::MatMul(o_.data(), attn_.data(), n, layer.o, bias(layer.o_bias), &pool_);
    for (std::size_t i = 0; i < x_.size(); ++i) x_[i] += o_[i];
    k::RmsNorm(h_.data(), x_.data(), n, hidden, layer.post_norm, eps, &pool_);
    k::MatMul(gate_.data(), h_.data(), n, layer.gate, nullptr, &pool_);
    k::MatMul(up_.data(), h_.data(), n, layer.up, nullptr, &pool_);
    k::SwiGlu(act_.data(), gate_.data(), up_.data(), n, inter, &pool_);
    k::MatMul(o_.data(), act_.data(), n, layer.down, nullptr, &pool_);
    for (std::size_t i = 0; i < x_.size(); ++i) x_[i] += o_[i];
  }

  // Final norm and LM head only for the rows whose logits are wanted.
  rows_.clear();
  std::int64_t row = 0, wanted = 0;
  for (const SequenceChunk& s : batch) {
    const auto len = static_cast<std::int64_t>(s.tokens.size());
    const std::int64_t first = s.logits == SequenceChunk::Logits::kAll ? 0 : len - 1;
    if (s.logits != SequenceChunk::Logits::kNone) {
      for (std::int64_t t = first; t < len; ++t, ++wanted) {
        rows_.insert(rows_.end(), x_.begin() + (row + t) * hidden,
                     x_.begin() + (row + t + 1) * hidden);
      }
    }
    row += len;
  }
  if (wanted == 0) return Status::Ok();
  h_.resize(static_cast<std::size_t>(wanted * hidden));
  k::RmsNorm(h_.data(), rows_.data(), wanted, hidden, final_norm_, eps, &pool_);
  const std::size_t at = logits->size();
  logits->resize(at + static_cast<std::size_t>(wanted * c.vocab_size));
  k::MatMul(logits->data() + at, h_.data(), wanted, lm_head_, nullptr, &pool_);
  return Status::Ok();
}

}  // namespace duet::backend
