// A Llama-family model (Llama 2/3/3.1, Qwen2, Mistral) running on the CPU reference kernels
// over a paged KV cache: one forward pass computes a mixed batch of prefill chunks and decode
// tokens, each sequence writing into and attending over the KV blocks of its block table.
// The block tables come from the shared KV block manager; this class owns the KV memory: one
// block-major region in the cache dtype (the model's unless told otherwise), block b holding
// [layer][K, V][slot][kv_head][head_dim] (kv_region()).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/engine/forward_model.h"
#include "backend/model/llama_weights.h"
#include "common/status.h"
#include "kernels/cpu/kernels.h"

namespace duet::backend {

struct CpuModelOptions {
  std::int64_t num_blocks = 0;  // KV blocks (of block_tokens tokens) for all sequences
  std::int32_t block_tokens = 16;
  int threads = 0;  // 0: one per hardware thread
  // The KV cache's dtype; nullopt: the model's (ModelSpec::AutoKvCacheDtype, the simulator's
  // "auto"). fp32, bf16 and f16 caches are kept; attention reads them widened to fp32.
  std::optional<models::Dtype> kv_cache_dtype;
  // Where the KV cache lives (a transport's memory: forward_model.h); null: the heap.
  KvAllocator kv_allocator;
};

class CpuModel final : public ForwardModel {
 public:
  static Result<std::unique_ptr<CpuModel>> Create(LoadedModel model,
                                                  const CpuModelOptions& options);

  Status Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) override;

  const models::ModelSpec& config() const override { return model_.config; }
  const LoadedModel& model() const { return model_; }
  std::int64_t num_blocks() const override { return options_.num_blocks; }
  std::int32_t block_tokens() const override { return options_.block_tokens; }
  models::Dtype kv_cache_dtype() const override { return kv_dtype_; }
  std::int64_t kv_cache_bytes() const override { return kv_bytes_; }
  std::optional<KvRegion> kv_region() override;
  int threads() const { return pool_.threads(); }
  // Bytes a decode step must read at least: every weight once (the memory roofline's numerator).
  std::int64_t WeightBytes() const { return weight_bytes_; }

 private:
  struct Layer {
    kernels::cpu::Weight input_norm, q, k, v, o, post_norm, gate, up, down;
    std::optional<kernels::cpu::Weight> q_bias, k_bias, v_bias, o_bias;
  };

  CpuModel(LoadedModel model, const CpuModelOptions& options);
  kernels::cpu::Weight ToWeight(const TensorView& t);
  kernels::cpu::PagedKvLayer KvLayer(std::int64_t layer);

  LoadedModel model_;
  CpuModelOptions options_;
  kernels::cpu::ThreadPool pool_;
  std::vector<float> inv_freq_;
  kernels::cpu::Weight embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  models::Dtype kv_dtype_ = models::Dtype::kF32;
  std::unique_ptr<KvMemory> kv_memory_;  // the block-major region
  unsigned char* kv_cache_ = nullptr;    // its bytes
  std::int64_t kv_bytes_ = 0;
  std::vector<std::vector<float>> realigned_;  // copies of the rare unaligned tensors
  std::int64_t weight_bytes_ = 0;
  // Scratch, reused across passes.
  std::vector<float> x_, h_, q_, k_, v_, attn_, o_, gate_, up_, act_, rows_;
  std::vector<std::int32_t> ids_, positions_;
};

}  // namespace duet::backend
