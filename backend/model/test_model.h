// A deterministic tiny random Llama-architecture model the project generates itself (no
// downloads): config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
// generation_config.json in Hugging Face layout, so Duet's backend and the HF reference load
// the same files. A preset makes a ~125M-parameter variant for speed benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/model/safetensors.h"
#include "common/status.h"
#include "models/model_spec.h"

namespace duet::backend {

struct TestModelOptions {
  std::uint64_t seed = 1;
  Dtype dtype = Dtype::kF32;  // every tensor; torch_dtype says the same
  int hidden_size = 64;
  int intermediate_size = 176;
  int num_hidden_layers = 2;
  int num_attention_heads = 4;
  int num_key_value_heads = 2;  // GQA: two query heads per KV head
  int head_dim = 16;
  // BPE vocabulary (bytes + merges) asked of MakeTestTokenizerJson; its 7 special tokens
  // follow these ids.
  int tokenizer_vocab_size = 512;
  // 0: the tokenizer's total size (BPE + special tokens). Larger: the embedding and LM head get
  // rows for ids the tokenizer never produces (the benchmark preset uses this).
  int vocab_size = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 500000.0;
  // Llama 3 scaling with a short original context so that tests with a few dozen tokens
  // already cover all three frequency bands.
  models::RopeScaling rope_scaling{models::RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 64, ""};
  std::int64_t max_position_embeddings = 256;
  bool tie_word_embeddings = false;
  bool attention_bias = false;   // Llama's attention_bias: q/k/v/o biases
  double weight_std = 0.02;      // projections, embeddings and biases ~ N(0, weight_std)
  double norm_noise_std = 0.02;  // RMSNorm weights ~ 1 + N(0, norm_noise_std)

  // hidden 768, 12 layers, 12 heads (head_dim 64), 4 KV heads, intermediate 2048, vocab 32000
  // (the small tokenizer; rows past its 519 ids are unused), BF16: 124.7M parameters.
  static TestModelOptions Benchmark();
  // Llama-3.2-1B's dimensions (hidden 2048, 16 layers, 32/8 heads, intermediate 8192, vocab
  // 128256, tied embeddings, Llama 3 RoPE scaling 32 over 8192), BF16: 1.24B parameters, where
  // the weights dwarf the caches.
  static TestModelOptions Llama32_1B();
};

// The config the options describe (vocab and bos/eos ids from the test tokenizer).
Result<models::ModelSpec> TestModelConfig(const TestModelOptions& options);

// The tensors in file order: HF names, the options' dtype, shapes from the config.
std::vector<TensorSpec> TestModelTensorSpecs(const models::ModelSpec& config, Dtype dtype);

// The fp32 values of one tensor before rounding to the file's dtype. Each tensor has its own
// std::mt19937_64 stream seeded from (seed, name), turned into normals by Box-Muller written
// here, so values do not depend on tensor order or on the standard library's distributions.
// (sqrt is exact in IEEE arithmetic; log and cos may differ by an ulp between C libraries,
// which after the rounding to fp32 changes a value only in rare ties.)
std::vector<float> TestModelTensorValues(const TestModelOptions& options, const TensorSpec& spec);

// Writes the model into `dir` (created if needed; existing files are replaced).
Status WriteTestModel(const std::string& dir, const TestModelOptions& options);

}  // namespace duet::backend
