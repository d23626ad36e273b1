// GPU benchmark of the CUDA model on real model shapes with random bf16 weights (default
// Llama-3.1-8B from models/specs; nothing is downloaded), beside the device's physical limits
// measured in the same run:
//   - copy bandwidth: device-to-device cudaMemcpy of 2 GiB (bytes read + written / time);
//   - bf16 matrix-multiply rate: cuBLAS 8192^3 GEMM, fp32 accumulation (the model's GEMMs).
// Then, through CudaModel::ForwardGreedy (what the step executor calls):
//   - prefill: one prompt of 1k, 4k and 8k tokens in one pass: tokens / s, and FLOP/s against
//     the measured GEMM rate;
//   - decode: one step of batch 1, 8, 64, 256 at context 1k and 8k: step time, and for batch 1
//     the HBM limit (the weights a step reads, without the embedding table it only gathers
//     from, plus the KV read, over the measured copy bandwidth) / step time.
// Shapes whose KV cache does not fit in device memory are reported as such.
// Usage: duet_cuda_bench [MODEL_SPEC.json [--profile-decode]]   (exit 2 without a CUDA device)
// --profile-decode: only one decode step (batch 1, context 1024) after a warm-up, between
// cudaProfilerStart and Stop, for `ncu --profile-from-start off` to time its kernels.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_buffer.h"
#include "models/model_spec.h"

namespace {

using duet::backend::CudaModel;
using duet::backend::SequenceChunk;
namespace kc = duet::kernels::cuda;

double CopyBandwidth() {
  const std::size_t bytes = std::size_t{2} << 30;
  kc::DeviceBuffer<char> a(bytes), b(bytes);
  cudaEvent_t start, stop;
  DUET_CUDA_CHECK(cudaEventCreate(&start));
  DUET_CUDA_CHECK(cudaEventCreate(&stop));
  DUET_CUDA_CHECK(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));  // warm-up
  const int reps = 10;
  DUET_CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i)
    DUET_CUDA_CHECK(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
  DUET_CUDA_CHECK(cudaEventRecord(stop));
  DUET_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  DUET_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3);
}

kc::Bf16 BitsOf(float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return static_cast<kc::Bf16>(bits >> 16);
}

double GemmRate() {
  const std::int64_t n = 8192;
  // Random operands: products of zeros run faster than real data does.
  std::vector<kc::Bf16> host(static_cast<std::size_t>(n * n));
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& x : host) x = BitsOf(dist(rng));
  kc::DeviceBuffer<kc::Bf16> a(host), b(host);
  kc::DeviceBuffer<float> c(n * n);
  cublasHandle_t handle;
  DUET_CUBLAS_CHECK(cublasCreate(&handle));
  kc::MatMul(handle, c.get(), a.get(), n, b.get(), n, n);  // warm-up
  DUET_CUDA_CHECK(cudaDeviceSynchronize());
  const int reps = 10;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) kc::MatMul(handle, c.get(), a.get(), n, b.get(), n, n);
  DUET_CUDA_CHECK(cudaDeviceSynchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cublasDestroy(handle);
  return 2.0 * static_cast<double>(n) * n * n * reps / s;
}

// Random bf16 weights for every tensor of `config`: all views share one buffer as large as the
// largest tensor (the values do not matter for speed).
duet::backend::LoadedModel RandomModel(const duet::models::ModelSpec& c,
                                       std::vector<std::uint16_t>* storage) {
  using duet::backend::Dtype;
  using duet::backend::TensorView;
  const std::int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const std::int64_t largest = std::max(
      {static_cast<std::int64_t>(c.vocab_size) * hidden, inter * hidden, c.QWidth() * hidden});
  storage->resize(static_cast<std::size_t>(largest));
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (auto& x : *storage) x = BitsOf(dist(rng));
  auto view = [&](std::vector<std::int64_t> shape) {
    TensorView t;
    t.dtype = Dtype::kBF16;
    t.shape = shape;
    t.data = reinterpret_cast<const std::byte*>(storage->data());
    t.bytes = static_cast<std::size_t>(t.NumElements()) * 2;
    return t;
  };
  duet::backend::LoadedModel m;
  m.config = c;
  m.weights.embed_tokens = view({c.vocab_size, hidden});
  m.weights.norm = view({hidden});
  m.weights.lm_head = view({c.vocab_size, hidden});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    duet::backend::LlamaLayerWeights w;
    w.input_layernorm = view({hidden});
    w.post_attention_layernorm = view({hidden});
    w.q_proj = view({c.QWidth(), hidden});
    w.k_proj = view({c.KvWidth(), hidden});
    w.v_proj = view({c.KvWidth(), hidden});
    w.o_proj = view({hidden, c.QWidth()});
    w.gate_proj = view({inter, hidden});
    w.up_proj = view({inter, hidden});
    w.down_proj = view({hidden, inter});
    m.weights.layers.push_back(w);
  }
  return m;
}

// Seconds of one ForwardGreedy of `batch` (median of `reps` after one warm-up).
double TimeStep(CudaModel& model, const std::vector<SequenceChunk>& batch, int reps) {
  std::vector<std::int32_t> tokens;
  DUET_CHECK(model.ForwardGreedy(batch, &tokens).ok());
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    tokens.clear();
    const auto t0 = std::chrono::steady_clock::now();
    DUET_CHECK(model.ForwardGreedy(batch, &tokens).ok());
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (kc::DeviceCount() == 0) {
    std::fprintf(stderr, "duet_cuda_bench: %s\n", kc::DescribeDevice().c_str());
    return 2;
  }
  const std::string spec =
      argc > 1 ? argv[1] : std::string(DUET_SOURCE_DIR) + "/models/specs/llama-3.1-8b.json";
  auto config = duet::models::LoadModelSpec(spec);
  if (!config.ok()) {
    std::fprintf(stderr, "duet_cuda_bench: %s\n", config.error().c_str());
    return 1;
  }
  const duet::models::ModelSpec& c = *config;
  const bool profile_decode = argc > 2 && std::string(argv[2]) == "--profile-decode";
  std::printf("device: %s\nmodel: %s shapes, random bf16 weights\n", kc::DescribeDevice().c_str(),
              spec.c_str());
  const double copy_bw = profile_decode ? 0 : CopyBandwidth();
  const double gemm = profile_decode ? 0 : GemmRate();
  std::printf("measured copy bandwidth %.0f GB/s; bf16 GEMM 8192^3 %.0f TFLOP/s\n\n", copy_bw / 1e9,
              gemm / 1e12);

  std::vector<std::uint16_t> storage;
  const duet::backend::LoadedModel loaded = RandomModel(c, &storage);
  const std::int32_t bt = 16;
  const std::int64_t kv_token_bytes = c.KvBytesPerToken(duet::models::Dtype::kBF16);
  std::size_t free_bytes = 0, total_bytes = 0;
  DUET_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  std::int64_t weight_bytes = 0;
  // As CudaModel counts: every tensor as bf16.
  weight_bytes += 2 * (2LL * c.vocab_size * c.hidden_size + c.hidden_size);
  weight_bytes += 2LL * c.num_hidden_layers *
                  (2LL * c.hidden_size + 2LL * c.QWidth() * c.hidden_size +
                   2LL * c.KvWidth() * c.hidden_size + 3LL * c.intermediate_size * c.hidden_size);
  // KV blocks: what is free after the weights, less 6 GiB for activations and cuBLAS.
  const std::int64_t budget =
      static_cast<std::int64_t>(free_bytes) - weight_bytes - (std::int64_t{6} << 30);
  const std::int64_t num_blocks = budget / (kv_token_bytes * bt);
  auto model = CudaModel::Create(loaded, {num_blocks, bt, 0});
  if (!model.ok()) {
    std::fprintf(stderr, "duet_cuda_bench: %s\n", model.error().c_str());
    return 1;
  }
  CudaModel& m = **model;
  std::printf("weights %.2f GB, KV cache %lld blocks of %d tokens (%.1f GB, %lld tokens)\n\n",
              static_cast<double>(m.WeightBytes()) / 1e9, static_cast<long long>(num_blocks), bt,
              static_cast<double>(m.kv_cache_bytes()) / 1e9,
              static_cast<long long>(num_blocks * bt));

  std::vector<std::int32_t> ids(8192);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i % 1000 + 10);
  std::vector<std::int32_t> all_blocks(static_cast<std::size_t>(num_blocks));
  for (std::int64_t i = 0; i < num_blocks; ++i)
    all_blocks[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);

  if (profile_decode) {
    const SequenceChunk chunk{std::span(ids).subspan(0, 1), 1024,
                              std::span(all_blocks).subspan(0, 1025 / bt + 1),
                              SequenceChunk::Logits::kLast};
    TimeStep(m, {chunk}, 3);  // warm-up
    std::vector<std::int32_t> tokens;
    DUET_CUDA_CHECK(cudaProfilerStart());
    DUET_CHECK(m.ForwardGreedy({&chunk, 1}, &tokens).ok());
    DUET_CUDA_CHECK(cudaProfilerStop());
    return 0;
  }

  // Prefill FLOPs: 2 per parameter per token (projections, MLP, LM head of the last token
  // only), and attention 4 * head_dim * heads per (query, key) pair of the causal triangle.
  const double layer_params = 2.0 * c.QWidth() * c.hidden_size + 2.0 * c.KvWidth() * c.hidden_size +
                              3.0 * c.intermediate_size * c.hidden_size;
  std::printf("| prefill tokens | time ms | tokens / s | TFLOP/s | of measured GEMM rate |\n");
  std::printf("|---|---|---|---|---|\n");
  for (std::int64_t len : {1024, 4096, 8192}) {
    const std::int64_t blocks = (len + bt - 1) / bt;
    if (blocks > num_blocks) {
      std::printf("| %lld | KV cache does not fit | | | |\n", static_cast<long long>(len));
      continue;
    }
    const SequenceChunk chunk{std::span(ids).subspan(0, static_cast<std::size_t>(len)), 0,
                              std::span(all_blocks).subspan(0, static_cast<std::size_t>(blocks)),
                              SequenceChunk::Logits::kLast};
    const double s = TimeStep(m, {chunk}, 5);
    const double flops = 2.0 * layer_params * c.num_hidden_layers * static_cast<double>(len) +
                         2.0 * c.vocab_size * c.hidden_size +
                         4.0 * c.head_dim * c.num_attention_heads * c.num_hidden_layers *
                             (static_cast<double>(len) * (len + 1) / 2);
    std::printf("| %lld | %.2f | %.0f | %.1f | %.0f%% |\n", static_cast<long long>(len), s * 1e3,
                static_cast<double>(len) / s, flops / s / 1e12, 100 * flops / s / gemm);
  }

  std::printf(
      "\n| decode batch | context | step ms | tokens / s | HBM limit ms (batch 1) | of limit |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (std::int64_t context : {1024, 8192}) {
    for (std::int64_t batch : {1, 8, 64, 256}) {
      const std::int64_t per_seq = (context + 1 + bt - 1) / bt;
      if (per_seq * batch > num_blocks) {
        std::printf("| %lld | %lld | KV cache does not fit (%.0f GB) | | | |\n",
                    static_cast<long long>(batch), static_cast<long long>(context),
                    static_cast<double>(batch * (context + 1) * kv_token_bytes) / 1e9);
        continue;
      }
      std::vector<SequenceChunk> chunks;
      for (std::int64_t b = 0; b < batch; ++b) {
        chunks.push_back(
            {std::span(ids).subspan(0, 1), context,
             std::span(all_blocks)
                 .subspan(static_cast<std::size_t>(b * per_seq), static_cast<std::size_t>(per_seq)),
             SequenceChunk::Logits::kLast});
      }
      const double s = TimeStep(m, chunks, 20);
      if (batch == 1) {
        // The bytes a decode step must read: every weight but the embedding table (of which
        // it gathers one row; a tied LM head reads it whole), and the KV cache of the context.
        const std::int64_t embedding_bytes =
            loaded.weights.lm_head_tied ? 0 : 2LL * c.vocab_size * c.hidden_size;
        const double limit = static_cast<double>(m.WeightBytes() - embedding_bytes +
                                                 (context + 1) * kv_token_bytes) /
                             copy_bw;
        std::printf("| 1 | %lld | %.3f | %.0f | %.3f | %.0f%% |\n", static_cast<long long>(context),
                    s * 1e3, 1 / s, limit * 1e3, 100 * limit / s);
      } else {
        std::printf("| %lld | %lld | %.3f | %.0f | | |\n", static_cast<long long>(batch),
                    static_cast<long long>(context), s * 1e3, static_cast<double>(batch) / s);
      }
    }
  }
  return 0;
}
