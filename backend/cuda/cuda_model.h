// A Llama-family model on one CUDA device: the same forward pass as CpuModel (mixed batches of
// prefill chunks and decode tokens over the paged KV cache, block tables from the shared block
// manager) on the kernels of kernels/cuda. Weights and the KV cache live in device memory as
// bf16 (weights stored as f32 or f16 are rounded once at load); activations are fp32 between
// kernels and bf16 into the matrix multiplies, which accumulate in fp32 (kernels::cuda::MatMul).
//
// Forward enqueues the whole pass on the model's stream and waits only for what the caller
// needs back: the logits rows, or with ForwardGreedy just the sampled token ids.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "backend/engine/forward_model.h"
#include "backend/model/llama_weights.h"
#include "common/status.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_buffer.h"

namespace duet::backend {

struct CudaModelOptions {
  std::int64_t num_blocks = 0;  // KV blocks (of block_tokens tokens) for all sequences
  std::int32_t block_tokens = 16;
  int device = 0;
};

class CudaModel final : public ForwardModel {
 public:
  // Errors: no CUDA device, not enough device memory for the weights and the KV cache.
  static Result<std::unique_ptr<CudaModel>> Create(const LoadedModel& model,
                                                   const CudaModelOptions& options);
  ~CudaModel() override;

  // A CUDA error reported by the copy back or the stream's synchronization (where the pass's
  // asynchronous failures surface) fails the pass; a sticky error fails every later one too.
  Status Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) override;
  Status ForwardGreedy(std::span<const SequenceChunk> batch,
                       std::vector<std::int32_t>* tokens) override;

  const models::ModelSpec& config() const override { return config_; }
  std::int64_t num_blocks() const override { return options_.num_blocks; }
  std::int32_t block_tokens() const override { return options_.block_tokens; }
  models::Dtype kv_cache_dtype() const override { return models::Dtype::kBF16; }
  std::int64_t kv_cache_bytes() const override;               // the whole KV cache
  std::int64_t WeightBytes() const { return weight_bytes_; }  // bf16 weights on the device
  cudaStream_t stream() const { return stream_; }

 private:
  using Bf16Buffer = kernels::cuda::DeviceBuffer<kernels::cuda::Bf16>;
  struct Layer {
    Bf16Buffer input_norm, q, k, v, o, post_norm, gate_up, down;  // gate_up: gate rows, up rows
    std::optional<Bf16Buffer> q_bias, k_bias, v_bias, o_bias;
    Bf16Buffer k_cache, v_cache;
  };

  CudaModel(const models::ModelSpec& config, const CudaModelOptions& options);
  Bf16Buffer Upload(std::initializer_list<const TensorView*> tensors);
  // Runs the layers and the final norm + LM head over the wanted rows; returns their count.
  std::int64_t Run(std::span<const SequenceChunk> batch);

  models::ModelSpec config_;
  CudaModelOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  Bf16Buffer embed_, final_norm_, lm_head_;
  bool tied_ = false;
  std::vector<Layer> layers_;
  kernels::cuda::DeviceBuffer<float> inv_freq_;
  std::int64_t weight_bytes_ = 0;
  // Per-pass inputs (host staging, device copies) and activations, grown as needed.
  std::vector<std::int32_t> ids_, positions_, table_offset_, tables_, wanted_rows_, decode_rows_;
  std::vector<kernels::cuda::PrefillTile> tiles_;
  kernels::cuda::DeviceBuffer<kernels::cuda::PrefillTile> d_tiles_;
  std::vector<std::int64_t> slots_;
  kernels::cuda::DeviceBuffer<std::int32_t> d_ids_, d_positions_, d_table_offset_, d_tables_,
      d_wanted_rows_, d_decode_rows_, d_tokens_;
  kernels::cuda::DeviceBuffer<std::int64_t> d_slots_;
  kernels::cuda::DeviceBuffer<float> x_, q_, k_, v_, gate_up_, rows_, logits_, attention_partials_;
  Bf16Buffer h16_;
};

}  // namespace duet::backend
