// Forward pass of a Llama-family model on CUDA (see cuda_model.h). The layer loop is CpuModel's,
// kernel for kernel, so the two can be compared step by step.
#include "backend/cuda/cuda_model.h"

#include <cmath>
#include <cstring>
#include <string>

namespace duet::backend {

namespace kc = kernels::cuda;

CudaModel::CudaModel(const models::ModelSpec& config, const CudaModelOptions& options)
    : config_(config), options_(options) {}

CudaModel::~CudaModel() {
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
}

CudaModel::Bf16Buffer CudaModel::Upload(std::initializer_list<const TensorView*> tensors) {
  // Stored bf16 goes as it is; f32 and f16 are rounded to bf16 once, here. Several tensors are
  // stacked (the rows of the first, then of the next) into one buffer.
  std::int64_t elements = 0;
  for (const TensorView* t : tensors) elements += t->NumElements();
  std::vector<kc::Bf16> bits(static_cast<std::size_t>(elements));
  std::size_t at = 0;
  for (const TensorView* t : tensors) {
    if (t->dtype == Dtype::kBF16) {
      std::memcpy(bits.data() + at, t->data, t->bytes);
    } else {
      const std::vector<float> values = ToFloat32(*t);
      for (std::size_t i = 0; i < values.size(); ++i) bits[at + i] = FloatToBf16(values[i]);
    }
    at += static_cast<std::size_t>(t->NumElements());
  }
  weight_bytes_ += static_cast<std::int64_t>(bits.size() * sizeof(kc::Bf16));
  return Bf16Buffer(bits);
}

std::int64_t CudaModel::kv_cache_bytes() const {
  std::int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    bytes +=
        static_cast<std::int64_t>((layer.k_cache.size() + layer.v_cache.size()) * sizeof(kc::Bf16));
  }
  return bytes;
}

Result<std::unique_ptr<CudaModel>> CudaModel::Create(const LoadedModel& model,
                                                     const CudaModelOptions& options) {
  if (options.num_blocks < 1 || options.block_tokens < 1)
    return Status::Error("CUDA model needs at least one KV block of at least one token");
  if (kc::DeviceCount() <= options.device)
    return Status::Error("CUDA model: " + kc::DescribeDevice());
  const models::ModelSpec& c = model.config;
  if (c.head_dim > 256) return Status::Error("CUDA model: head_dim above 256 is not supported");
  DUET_CUDA_CHECK(cudaSetDevice(options.device));
  // Room for the weights (as bf16) and the cache, before allocating anything.
  std::int64_t weight_elements = 0;
  const LlamaWeights& w = model.weights;
  weight_elements += w.embed_tokens.NumElements() + w.norm.NumElements();
  if (!w.lm_head_tied) weight_elements += w.lm_head.NumElements();
  for (const LlamaLayerWeights& lw : w.layers) {
    for (const TensorView* t :
         {&lw.input_layernorm, &lw.q_proj, &lw.k_proj, &lw.v_proj, &lw.o_proj,
          &lw.post_attention_layernorm, &lw.gate_proj, &lw.up_proj, &lw.down_proj})
      weight_elements += t->NumElements();
  }
  // Sized by the one KV formula (bf16), as the simulator plans it.
  const std::int64_t kv_tokens = options.num_blocks * options.block_tokens;
  const std::int64_t kv_bytes = kv_tokens * c.KvBytesPerToken(models::Dtype::kBF16);
  std::size_t free_bytes = 0, total_bytes = 0;
  DUET_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::int64_t need = 2 * weight_elements + kv_bytes;
  if (need > static_cast<std::int64_t>(free_bytes))
    return Status::Error("CUDA model: needs " + std::to_string(need >> 20) + " MiB (weights " +
                         std::to_string((2 * weight_elements) >> 20) + " MiB, KV cache " +
                         std::to_string(kv_bytes >> 20) + " MiB) but the device has " +
                         std::to_string(free_bytes >> 20) + " MiB free");

  std::unique_ptr<CudaModel> m(new CudaModel(c, options));
  DUET_CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking));
  DUET_CUBLAS_CHECK(cublasCreate(&m->cublas_));
  DUET_CUBLAS_CHECK(cublasSetStream(m->cublas_, m->stream_));
  m->inv_freq_ = kc::DeviceBuffer<float>(c.RopeInvFrequencies());
  m->embed_ = m->Upload({&w.embed_tokens});
  m->final_norm_ = m->Upload({&w.norm});
  m->tied_ = w.lm_head_tied;
  if (!m->tied_) m->lm_head_ = m->Upload({&w.lm_head});
  // A K and a V array per layer, each [block][slot][kv_head][head_dim] bf16.
  const std::size_t cache = static_cast<std::size_t>(
      kv_bytes / (2 * std::int64_t(c.num_hidden_layers)) / std::int64_t(sizeof(kc::Bf16)));
  DUET_CHECK(cache == static_cast<std::size_t>(kv_tokens * c.KvWidth()));
  for (const LlamaLayerWeights& lw : w.layers) {
    Layer l;
    l.input_norm = m->Upload({&lw.input_layernorm});
    l.q = m->Upload({&lw.q_proj});
    l.k = m->Upload({&lw.k_proj});
    l.v = m->Upload({&lw.v_proj});
    l.o = m->Upload({&lw.o_proj});
    if (lw.q_bias) l.q_bias = m->Upload({&*lw.q_bias});
    if (lw.k_bias) l.k_bias = m->Upload({&*lw.k_bias});
    if (lw.v_bias) l.v_bias = m->Upload({&*lw.v_bias});
    if (lw.o_bias) l.o_bias = m->Upload({&*lw.o_bias});
    l.post_norm = m->Upload({&lw.post_attention_layernorm});
    l.gate_up = m->Upload({&lw.gate_proj, &lw.up_proj});  // one multiply for both
    l.down = m->Upload({&lw.down_proj});
    l.k_cache = Bf16Buffer(cache);
    l.v_cache = Bf16Buffer(cache);
    DUET_CUDA_CHECK(cudaMemset(l.k_cache.get(), 0, cache * sizeof(kc::Bf16)));
    DUET_CUDA_CHECK(cudaMemset(l.v_cache.get(), 0, cache * sizeof(kc::Bf16)));
    m->layers_.push_back(std::move(l));
  }
  DUET_CUDA_CHECK(cudaDeviceSynchronize());
  return m;
}

std::int64_t CudaModel::Run(std::span<const SequenceChunk> batch) {
  // The current device is per thread: a pass may run on a step thread (engine.async_steps).
  DUET_CUDA_CHECK(cudaSetDevice(options_.device));
  const models::ModelSpec& c = config_;
  const std::int64_t hidden = c.hidden_size, qw = c.QWidth(), kvw = c.KvWidth();
  const std::int64_t inter = c.intermediate_size;
  const std::int32_t bt = options_.block_tokens;
  ids_.clear();
  positions_.clear();
  table_offset_.clear();
  tables_.clear();
  slots_.clear();
  wanted_rows_.clear();
  decode_rows_.clear();
  tiles_.clear();
  // Attention: chunks of at least kPrefillMinTokens go to the tensor-core prefill kernel in
  // tiles, the other tokens (decode) to the split kernel, whose longest context is max_context.
  constexpr std::int64_t kPrefillMinTokens = 16;
  const bool tiled = kc::PrefillAttentionSupports(config_.head_dim);
  std::int64_t max_context = 1;
  std::int64_t row = 0;
  for (const SequenceChunk& s : batch) {
    const auto len = static_cast<std::int64_t>(s.tokens.size());
    DUET_CHECK(len > 0);
    DUET_CHECK(static_cast<std::int64_t>(s.block_table.size()) * bt >= s.context_before + len);
    const auto offset = static_cast<std::int32_t>(tables_.size());
    tables_.insert(tables_.end(), s.block_table.begin(), s.block_table.end());
    for (std::int64_t i = 0; i < len; ++i) {
      const std::int64_t p = s.context_before + i;
      DUET_CHECK(s.block_table[static_cast<std::size_t>(p / bt)] < options_.num_blocks);
      ids_.push_back(s.tokens[static_cast<std::size_t>(i)]);
      positions_.push_back(static_cast<std::int32_t>(p));
      table_offset_.push_back(offset);
      slots_.push_back(
          static_cast<std::int64_t>(s.block_table[static_cast<std::size_t>(p / bt)]) * bt + p % bt);
    }
    if (tiled && len >= kPrefillMinTokens) {
      for (std::int64_t i = 0; i < len; i += kc::kPrefillTileRows)
        tiles_.push_back(
            {static_cast<std::int32_t>(row + i),
             static_cast<std::int32_t>(std::min<std::int64_t>(kc::kPrefillTileRows, len - i))});
    } else {
      for (std::int64_t i = 0; i < len; ++i)
        decode_rows_.push_back(static_cast<std::int32_t>(row + i));
      max_context = std::max(max_context, s.context_before + len);
    }
    if (s.logits == SequenceChunk::Logits::kAll) {
      for (std::int64_t i = 0; i < len; ++i)
        wanted_rows_.push_back(static_cast<std::int32_t>(row + i));
    } else if (s.logits == SequenceChunk::Logits::kLast) {
      wanted_rows_.push_back(static_cast<std::int32_t>(row + len - 1));
    }
    row += len;
  }
  const std::int64_t n = row;
  const auto wanted = static_cast<std::int64_t>(wanted_rows_.size());
  d_ids_.Upload(ids_.data(), ids_.size(), stream_);
  d_positions_.Upload(positions_.data(), positions_.size(), stream_);
  d_table_offset_.Upload(table_offset_.data(), table_offset_.size(), stream_);
  d_tables_.Upload(tables_.data(), tables_.size(), stream_);
  d_slots_.Upload(slots_.data(), slots_.size(), stream_);
  d_wanted_rows_.Upload(wanted_rows_.data(), wanted_rows_.size(), stream_);
  d_decode_rows_.Upload(decode_rows_.data(), decode_rows_.size(), stream_);
  d_tiles_.Upload(tiles_.data(), tiles_.size(), stream_);
  const auto decode_rows = static_cast<std::int64_t>(decode_rows_.size());
  const auto num_tiles = static_cast<std::int64_t>(tiles_.size());
  auto grow = [](auto& buffer, std::int64_t elements) {
    buffer.Reserve(static_cast<std::size_t>(elements));
  };
  grow(x_, n * hidden);
  grow(q_, n * qw);
  grow(k_, n * kvw);
  grow(v_, n * kvw);
  grow(gate_up_, n * 2 * inter);
  grow(h16_, n * std::max({hidden, qw, inter}));
  grow(rows_, wanted * hidden);
  grow(logits_, wanted * c.vocab_size);

  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // The kernels feeding a matrix multiply (norms, attention, SwiGLU) write its bf16 input to
  // h16_ directly; the residual connections accumulate into x_ in the multiply itself.
  auto linear = [&](float* out, std::int64_t rows, const Bf16Buffer& weight,
                    std::int64_t out_features, std::int64_t in_features,
                    const std::optional<Bf16Buffer>& bias, bool accumulate = false) {
    kc::MatMul(cublas_, out, h16_.get(), rows, weight.get(), out_features, in_features, accumulate);
    if (bias) kc::AddBias(out, bias->get(), rows, out_features, stream_);
  };
  const std::optional<Bf16Buffer> none;

  kc::Embedding(x_.get(), d_ids_.get(), n, embed_.get(), hidden, stream_);
  for (Layer& layer : layers_) {
    kc::RmsNorm(h16_.get(), x_.get(), n, hidden, layer.input_norm.get(), eps, stream_);
    linear(q_.get(), n, layer.q, qw, hidden, layer.q_bias);
    linear(k_.get(), n, layer.k, kvw, hidden, layer.k_bias);
    linear(v_.get(), n, layer.v, kvw, hidden, layer.v_bias);
    kc::Rope(q_.get(), c.num_attention_heads, k_.get(), c.num_key_value_heads, c.head_dim,
             d_positions_.get(), n, inv_freq_.get(), 1.0f, stream_);
    const kc::PagedKvLayer kv{layer.k_cache.get(),   layer.v_cache.get(), bt,
                              c.num_key_value_heads, c.head_dim,          options_.num_blocks};
    kc::WriteKv(kv, d_slots_.get(), n, k_.get(), v_.get(), stream_);
    if (num_tiles > 0)
      kc::PrefillAttention(h16_.get(), q_.get(), c.num_attention_heads, kv, d_tables_.get(),
                           d_table_offset_.get(), d_positions_.get(), d_tiles_.get(), num_tiles,
                           scale, stream_);
    if (decode_rows > 0)
      kc::PagedAttention(h16_.get(), q_.get(), decode_rows,
                         num_tiles > 0 ? d_decode_rows_.get() : nullptr, c.num_attention_heads, kv,
                         d_tables_.get(), d_table_offset_.get(), d_positions_.get(), max_context,
                         scale, &attention_partials_, 0, stream_);
    linear(x_.get(), n, layer.o, hidden, qw, layer.o_bias, /*accumulate=*/true);
    kc::RmsNorm(h16_.get(), x_.get(), n, hidden, layer.post_norm.get(), eps, stream_);
    linear(gate_up_.get(), n, layer.gate_up, 2 * inter, hidden, none);
    kc::SwiGluFused(h16_.get(), gate_up_.get(), n, inter, stream_);
    linear(x_.get(), n, layer.down, hidden, inter, none, /*accumulate=*/true);
  }
  if (wanted == 0) return 0;
  // Final norm and LM head only for the rows whose logits are wanted.
  kc::GatherRows(rows_.get(), x_.get(), d_wanted_rows_.get(), wanted, hidden, stream_);
  kc::RmsNorm(h16_.get(), rows_.get(), wanted, hidden, final_norm_.get(), eps, stream_);
  linear(logits_.get(), wanted, tied_ ? embed_ : lm_head_, c.vocab_size, hidden, none);
  return wanted;
}

namespace {

// A CUDA call of a forward pass: its error fails the pass (ForwardModel::Forward), not the
// process.
Status PassStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  return Status::Error(std::string("CUDA forward pass: ") + what + ": " +
                       cudaGetErrorString(error));
}

}  // namespace

Status CudaModel::Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) {
  const std::int64_t wanted = Run(batch);
  const std::size_t at = logits->size();
  const auto count = static_cast<std::size_t>(wanted * config_.vocab_size);
  logits->resize(at + count);
  if (count)
    DUET_RETURN_IF_ERROR(
        PassStatus(cudaMemcpyAsync(logits->data() + at, logits_.get(), count * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_),
                   "copying the logits back"));
  return PassStatus(cudaStreamSynchronize(stream_), "synchronizing the stream");
}

Status CudaModel::ForwardGreedy(std::span<const SequenceChunk> batch,
                                std::vector<std::int32_t>* tokens) {
  const std::int64_t wanted = Run(batch);
  d_tokens_.Reserve(static_cast<std::size_t>(wanted));
  kc::Argmax(d_tokens_.get(), logits_.get(), wanted, config_.vocab_size, stream_);
  const std::size_t at = tokens->size();
  tokens->resize(at + static_cast<std::size_t>(wanted));
  if (wanted)
    DUET_RETURN_IF_ERROR(
        PassStatus(cudaMemcpyAsync(tokens->data() + at, d_tokens_.get(),
                                   static_cast<std::size_t>(wanted) * sizeof(std::int32_t),
                                   cudaMemcpyDeviceToHost, stream_),
                   "copying the tokens back"));
  return PassStatus(cudaStreamSynchronize(stream_), "synchronizing the stream");
}

}  // namespace duet::backend
