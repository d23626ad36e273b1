// The one description of a model, read from its Hugging Face config.json (bundled specs under
// models/specs use the same field names): a Llama-shaped dense decoder and what follows from it
// (parameters, weight and KV cache bytes, rotary frequencies). The simulator sizes and costs it;
// the real backend maps and runs its weights. Also the GPU specs and the instance memory plan.
// Pure C++ (STL + nlohmann_json).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "models/dtype.h"

namespace duet::models {

enum class RopeScalingType {
  kNone,         // rope_scaling null/absent, or rope_type "default"
  kLinear,       // positions divided by `factor` (every inverse frequency divided by it)
  kLlama3,       // Llama 3.1 frequency-dependent scaling (_compute_llama3_parameters)
  kUnsupported,  // any other rope_type (yarn, dynamic, ...): sizes are known, the backend refuses
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  // Llama 3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
  std::string unsupported_type;  // kUnsupported: the rope_type as written
};

// A Llama-shaped decoder: per layer RMSNorm, q/k/v/o projections (grouped-query attention),
// RMSNorm, gate/up/down MLP; embeddings, final norm and LM head. Fields have config.json's
// names; every optional one may be absent or null.
struct ModelSpec {
  std::string name;          // "name" (Duet's; default: the file stem, or the model directory)
  std::string model_type;    // "llama", "qwen2", "mistral", ... ("" when absent)
  std::string architecture;  // architectures[0], e.g. "LlamaForCausalLM" ("" when absent)
  int num_hidden_layers = 0;
  int hidden_size = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // defaults to num_attention_heads
  int head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int intermediate_size = 0;
  int vocab_size = 0;
  double rms_norm_eps = 1e-6;  // Hugging Face's default when absent
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  std::int64_t max_position_embeddings = 0;  // absent: the model type's transformers default
  std::optional<Dtype> torch_dtype;          // "torch_dtype" (or newer "dtype")
  bool tie_word_embeddings = false;
  // Biases: Qwen2 always has q/k/v biases; Llama's attention_bias adds q/k/v *and* o biases
  // (as LlamaAttention does), mlp_bias gate/up/down biases; Mistral has none.
  bool attention_qkv_bias = false;
  bool attention_o_bias = false;
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  double partial_rotary_factor = 1.0;
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;  // one or more (Llama 3.1 lists three)
  // Mistral's (and Qwen2's, when use_sliding_window) attention window in tokens. Recorded
  // only: Duet's attention is always full, which equals sliding-window attention exactly as
  // long as every sequence fits in the window.
  std::optional<std::int64_t> sliding_window;

  std::int64_t QWidth() const { return std::int64_t(num_attention_heads) * head_dim; }
  std::int64_t KvWidth() const { return std::int64_t(num_key_value_heads) * head_dim; }
  // The dtype of the weights: torch_dtype, bf16 when absent.
  Dtype WeightDtype() const { return torch_dtype.value_or(Dtype::kBF16); }
  Bytes BytesPerElement() const { return Bytes(DtypeBytes(WeightDtype())); }
  // Every weight the checkpoint holds: embeddings, LM head unless tied, per layer q/k/v/o,
  // gate/up/down, their biases where the config has them, two norms; the final norm.
  std::int64_t ParamCount() const;
  Bytes WeightBytes() const;  // ParamCount * BytesPerElement
  // The KV cache dtype "auto" means: the weights' dtype, as a GPU engine stores it.
  Dtype AutoKvCacheDtype() const { return WeightDtype(); }
  // K and V for every layer: 2 * layers * kv_heads * head_dim * bytes of `kv_cache_dtype`
  // (nullopt: AutoKvCacheDtype). The one formula the simulator plans with and every backend
  // allocates with.
  Bytes KvBytesPerToken(std::optional<Dtype> kv_cache_dtype = std::nullopt) const;

  // head_dim / 2 rotary inverse frequencies theta^(-2i/head_dim), then the rope_scaling
  // adjustment with transformers' formulas. Computed in double and rounded to float once;
  // transformers computes in float32, so values agree with it to a few float32 ulps (at most
  // 2 seen, in Llama 3's smoothed band) rather than bit for bit. Not for kUnsupported scaling.
  std::vector<float> RopeInvFrequencies() const;
};

// Parses a config.json (or bundled spec) document; `where` (the file name) starts every error,
// which also names the field. Accepts any model_type whose config describes a dense
// Llama-shaped decoder (see docs/simulator.md); rejects malformed values, out-of-bounds sizes
// and mixture-of-experts configs.
Result<ModelSpec> ParseModelSpec(const nlohmann::json& doc, const std::string& where);
// `path`: a .json file, or a Hugging Face model directory (its config.json is read).
Result<ModelSpec> LoadModelSpec(const std::string& path);

// The config.json for `spec` (Hugging Face field names; "name" is not written), as the
// test-model generator writes it; ParseModelSpec(ModelSpecToJson(s)) gives back s.
nlohmann::json ModelSpecToJson(const ModelSpec& spec);

// Whether the real backend's Llama forward pass implements everything `spec` describes:
// model types llama, qwen2 and mistral (with their *ForCausalLM classes), SiLU, no MLP
// biases, full rotary embeddings with default, linear or llama3 scaling. The error names
// `where` and what is unsupported. The simulator does not need this.
Status CheckExecutable(const ModelSpec& spec, const std::string& where);

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
  std::optional<Dtype> kv_cache_dtype;  // nullopt: "auto" (ModelSpec::AutoKvCacheDtype)
};

// Error (naming model, hardware and the numbers) when the weights and reserve do not fit, or
// the remainder holds less than one block, or tp does not divide the KV heads.
Result<InstanceMemory> PlanInstanceMemory(const ModelSpec& model, const HardwareSpec& hw,
                                          const MemoryOptions& options);

}  // namespace duet::models
