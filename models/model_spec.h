// Model and hardware specifications, and what follows from them: parameter and weight bytes,
// KV cache bytes per token, and how many KV tokens an instance holds after its weights.
// Model specs use Hugging Face config.json field names. Pure C++ (STL + nlohmann_json).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "common/units.h"

namespace duet::models {

struct ModelSpec {
  std::string name;  // "name" (not in HF config.json; defaults to the file stem)
  int num_hidden_layers = 0;
  int hidden_size = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads when absent
  int head_dim = 0;             // defaults to hidden_size / num_attention_heads when absent
  int intermediate_size = 0;
  int vocab_size = 0;
  std::string torch_dtype = "bfloat16";  // bfloat16, float16, float32
  bool tie_word_embeddings = false;

  Bytes BytesPerElement() const;  // of torch_dtype
  // Parameters: embeddings, (untied) LM head, per layer q/k/v/o, gate/up/down, two norms,
  // and the final norm. Attention biases and rope buffers are ignored (< 0.01%).
  std::int64_t ParamCount() const;
  Bytes WeightBytes() const;  // ParamCount * BytesPerElement
  // K and V for every layer: 2 * layers * kv_heads * head_dim * bytes per element.
  Bytes KvBytesPerToken() const;
};

Result<ModelSpec> ParseModelSpec(const nlohmann::json& doc, const std::string& where);
Result<ModelSpec> LoadModelSpec(const std::string& path);

// One GPU model. Bandwidths are per direction.
struct HardwareSpec {
  std::string name;
  FlopsPerSecond bf16_flops = 0;  // dense peak, "bf16_tflops" in JSON
  Bytes hbm_bytes = 0;            // "hbm_gib"
  BytesPerSecond hbm_bw = 0;      // "hbm_bandwidth_gbps" (GB/s)
  BytesPerSecond nvlink_bw = 0;   // "nvlink_bandwidth_gbps" (GB/s, per direction)
  BytesPerSecond pcie_bw = 0;     // "pcie_bandwidth_gbps" (GB/s, per direction)
};

Result<HardwareSpec> ParseHardwareSpec(const nlohmann::json& doc, const std::string& where);
Result<HardwareSpec> LoadHardwareSpec(const std::string& path);

// Memory plan of one serving instance of `model` on `tp` GPUs of `hw`.
struct InstanceMemory {
  Bytes weight_bytes_per_gpu = 0;
  Bytes reserved_bytes_per_gpu = 0;  // activations, CUDA graphs, allocator slack
  Bytes kv_bytes_per_gpu = 0;
  Tokens kv_tokens = 0;        // whole-instance KV capacity in tokens
  std::int64_t kv_blocks = 0;  // kv_tokens / block_tokens
};

struct MemoryOptions {
  int tp = 1;
  double gpu_memory_utilization = 0.9;  // fraction of HBM the engine may use (vLLM's meaning)
  Bytes reserved_bytes_per_gpu = Bytes(2) * 1024 * 1024 * 1024;  // activation workspace
  Tokens block_tokens = 16;
};

// Error (naming model, hardware and the numbers) when the weights and reserve do not fit, or
// the remainder holds less than one block, or tp does not divide the KV heads.
Result<InstanceMemory> PlanInstanceMemory(const ModelSpec& model, const HardwareSpec& hw,
                                          const MemoryOptions& options);

}  // namespace duet::models
