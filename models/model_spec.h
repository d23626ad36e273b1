// The one description of a model, read from its Hugging Face config.json (bundled specs under
// models/specs use the same field names): a Llama-shaped decoder, dense or mixture-of-experts,
// with grouped-query or multi-head latent attention, and what follows from it (parameters,
// weight and KV cache bytes, rotary frequencies). The simulator sizes and costs it; the real
// backend maps and runs the dense Llama-family ones. Also the GPU specs and the instance memory
// plan. Pure C++ (STL + nlohmann_json).
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

// Mixture-of-experts MLPs (Mixtral, Qwen3-MoE, DeepSeek-V2/V3): in each MoE layer a router
// picks `experts_per_token` of `experts` gate/up/down MLPs of width `expert_intermediate` for
// every token, beside `shared_experts` of the same width that every token uses. The other
// layers keep a dense MLP of intermediate_size.
struct MoeSpec {
  int experts = 0;              // num_local_experts, num_experts or n_routed_experts
  int experts_per_token = 0;    // num_experts_per_tok
  int expert_intermediate = 0;  // moe_intermediate_size (Mixtral: intermediate_size)
  int shared_experts = 0;       // n_shared_experts (DeepSeek)
  int moe_layers = 0;           // layers whose MLP is the experts
  bool router_bias = false;     // DeepSeek-V3's e_score_correction_bias (topk_method noaux_tc)
  std::int64_t ExpertParams(std::int64_t hidden) const { return 3 * hidden * expert_intermediate; }
};

// Multi-head latent attention (DeepSeek-V2/V3): queries through a low-rank projection (or a
// direct one when q_lora_rank is 0), keys and values from a compressed latent of kv_lora_rank
// plus a shared rotary key of qk_rope_head_dim per token, which is all the KV cache holds.
struct MlaSpec {
  int q_lora_rank = 0;  // 0: q_proj maps hidden straight to the heads
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int QkHeadDim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // What one layer caches per token: the latent and the rotary key.
  int CachedWidth() const { return kv_lora_rank + qk_rope_head_dim; }
};

// Block-wise FP8 checkpoints (quantization_config quant_method "fp8", as DeepSeek-V3 and
// Qwen3's -FP8 releases): every linear layer of the decoder stores one byte per weight and one
// float32 scale per block (one per matrix without weight_block_size); embeddings, LM head,
// norms and routers keep the model's dtype.
struct Fp8Weights {
  std::int64_t block_rows = 0, block_cols = 0;  // weight_block_size; 0: one scale per matrix
};

// A linear layer's weight, [out, in] as checkpoints store it.
struct MatrixShape {
  std::int64_t in = 0, out = 0;
};

// Parameters and bytes of one part of the weights.
struct WeightPart {
  std::int64_t params = 0;
  Bytes bytes = 0;
  WeightPart& operator+=(const WeightPart& o) {
    params += o.params;
    bytes += o.bytes;
    return *this;
  }
};

// Where a model's weights are, summed over its layers.
struct WeightBreakdown {
  WeightPart embedding;       // the input embedding table
  WeightPart lm_head;         // the output projection (none when tied to the embeddings)
  WeightPart attention;       // projections, their biases and norms (Qwen3's q/k, MLA's latents)
  WeightPart dense_mlp;       // the dense layers' MLPs
  WeightPart routed_experts;  // every routed expert of every MoE layer
  WeightPart shared_experts;  // the MoE layers' shared experts
  WeightPart router;          // the MoE layers' gates (and score-correction biases)
  WeightPart norms;           // two RMSNorms per layer and the final one
  WeightPart Total() const;
  // All but the routed experts: what every GPU of a TP group holds a 1/tp share of.
  WeightPart NonExpert() const;
};

// A Llama-shaped decoder: per layer RMSNorm, attention (grouped-query q/k/v/o projections, or
// MLA), RMSNorm, a gate/up/down MLP or a mixture of experts; embeddings, final norm and LM
// head. Fields have config.json's names; every optional one may be absent or null.
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
  bool qk_norm = false;  // Qwen3: an RMSNorm of head_dim on every query and key head
  std::optional<MoeSpec> moe;
  std::optional<MlaSpec> mla;  // then head_dim is qk_nope + qk_rope, num_key_value_heads unused
  std::optional<Fp8Weights> fp8;
  // DeepSeek-V3's multi-token-prediction layers (num_nextn_predict_layers): decoder layers after
  // the last that predict a further token, which speculative decoding uses as its drafter.
  int mtp_layers = 0;

  std::int64_t QWidth() const { return std::int64_t(num_attention_heads) * head_dim; }
  std::int64_t KvWidth() const { return std::int64_t(num_key_value_heads) * head_dim; }
  // The dtype of the weights: torch_dtype, bf16 when absent.
  Dtype WeightDtype() const { return torch_dtype.value_or(Dtype::kBF16); }
  Bytes BytesPerElement() const { return Bytes(DtypeBytes(WeightDtype())); }
  // Every weight the checkpoint holds: embeddings, LM head unless tied, per layer the
  // attention's projections (q/k/v/o, or MLA's), the MLP or the experts with their router,
  // their biases where the config has them, norms; the final norm. Not DeepSeek's
  // multi-token-prediction layer, which only speculative decoding loads.
  WeightBreakdown Weights() const;
  // One layer's attention projections (q/k/v/o, or MLA's), the matrices Weights() sizes and
  // the roofline prices a token's pass through.
  std::vector<MatrixShape> AttentionProjections() const;
  std::int64_t ParamCount() const { return Weights().Total().params; }
  // In the dtype each part is stored in (ParamCount * BytesPerElement unless fp8).
  Bytes WeightBytes() const { return Weights().Total().bytes; }
  // Parameters one token passes through: all but the routed experts it is not sent to.
  std::int64_t ActiveParamCount() const;
  int DenseLayers() const { return num_hidden_layers - (moe ? moe->moe_layers : 0); }
  // The drafter that the multi-token-prediction layers make (mtp_layers > 0): a model of those
  // layers (mixture-of-experts layers where the model has experts), sharing the embedding and
  // LM head, which it sizes as its own; for pricing its passes and sizing its KV.
  ModelSpec MtpDrafter() const;
  // The KV cache dtype "auto" means: the weights' dtype, as a GPU engine stores it.
  Dtype AutoKvCacheDtype() const { return WeightDtype(); }
  // K and V for every layer: 2 * layers * kv_heads * head_dim * bytes of `kv_cache_dtype`
  // (nullopt: AutoKvCacheDtype); with MLA, layers * (kv_lora_rank + qk_rope_head_dim) * bytes.
  // The one formula the simulator plans with and every backend allocates with.
  Bytes KvBytesPerToken(std::optional<Dtype> kv_cache_dtype = std::nullopt) const;
  // How many ways one token's KV cache splits across a TP group of `tp` GPUs: GQA's KV heads tp
  // ways, or with fewer heads than GPUs one head per GPU (each replicated tp / kv_heads times, as
  // engines do); MLA's latent not at all (1). 0 when tp and the KV heads do not divide one
  // another.
  int KvShards(int tp) const;

  // head_dim / 2 rotary inverse frequencies theta^(-2i/head_dim), then the rope_scaling
  // adjustment with transformers' formulas. Computed in double and rounded to float once;
  // transformers computes in float32, so values agree with it to a few float32 ulps (at most
  // 2 seen, in Llama 3's smoothed band) rather than bit for bit. Not for kUnsupported scaling.
  std::vector<float> RopeInvFrequencies() const;
};

// Parses a config.json (or bundled spec) document; `where` (the file name) starts every error,
// which also names the field. Accepts any model_type whose config describes a dense
// Llama-shaped decoder, and the mixture-of-experts families Mixtral, Qwen3-MoE and
// DeepSeek-V2/V3 (see docs/simulator.md); rejects malformed values, out-of-bounds sizes,
// experts of other families and quantization methods other than fp8.
Result<ModelSpec> ParseModelSpec(const nlohmann::json& doc, const std::string& where);
// `path`: a .json file, or a Hugging Face model directory (its config.json is read).
Result<ModelSpec> LoadModelSpec(const std::string& path);

// The config.json for `spec` (Hugging Face field names; "name" is not written), as the
// test-model generator writes it; ParseModelSpec(ModelSpecToJson(s)) gives back s.
nlohmann::json ModelSpecToJson(const ModelSpec& spec);

// Whether the real backend's Llama forward pass implements everything `spec` describes:
// model types llama, qwen2 and mistral (with their *ForCausalLM classes), SiLU, no MLP
// biases, full rotary embeddings with default, linear or llama3 scaling; no experts, MLA,
// q/k norms or fp8 weights. The error names
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

// Memory plan of one serving instance of `model` on tp * dp GPUs of `hw`: dp attention ranks
// (data parallel: each holds its own requests' KV cache), each over tp GPUs (tensor parallel:
// attention heads, the dense MLP, embeddings and LM head split tp ways). A mixture of experts
// spreads its routed experts over all tp * dp GPUs (expert parallel). GQA's KV heads split tp
// ways; MLA's latent cannot be split, so every GPU of a TP group caches all of it.
struct InstanceMemory {
  Bytes weight_bytes_per_gpu = 0;
  Bytes reserved_bytes_per_gpu = 0;  // activations, CUDA graphs, allocator slack
  Bytes kv_bytes_per_gpu = 0;
  Tokens kv_tokens = 0;        // whole-instance KV capacity in tokens (all dp ranks)
  std::int64_t kv_blocks = 0;  // kv_tokens / block_tokens
};

struct MemoryOptions {
  int tp = 1;
  int dp = 1;                           // attention data-parallel ranks
  double gpu_memory_utilization = 0.9;  // fraction of HBM the engine may use (vLLM's meaning)
  Bytes reserved_bytes_per_gpu = Bytes(2) * 1024 * 1024 * 1024;  // activation workspace
  Tokens block_tokens = 16;
  std::optional<Dtype> kv_cache_dtype;  // nullopt: "auto" (ModelSpec::AutoKvCacheDtype)
};

// Speculative decoding's drafter, held on the instance's GPUs beside the model and split as it
// is: a draft model, or the model's own multi-token-prediction layers (ModelSpec::MtpDrafter),
// which share its embedding table and LM head. It caches KV for every token too.
struct Drafter {
  ModelSpec model;
  bool shares_embeddings = false;
};

// Error (naming model, hardware and the numbers) when the weights and reserve do not fit, or
// the remainder holds less than one block, or tp does not divide the KV heads, or tp * dp does
// not divide the routed experts. With a drafter, its weights and KV per token count too.
Result<InstanceMemory> PlanInstanceMemory(const ModelSpec& model, const HardwareSpec& hw,
                                          const MemoryOptions& options,
                                          const Drafter* drafter = nullptr);

}  // namespace duet::models
