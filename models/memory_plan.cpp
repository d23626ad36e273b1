// Instance memory planning: how much of each GPU's HBM is left for the KV cache after the
// weight shard and the activation reserve, and how many tokens and blocks that holds.
// Follows vLLM's accounting: gpu_memory_utilization caps what the engine may use at all.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "models/model_spec.h"

namespace duet::models {
namespace {

std::string Gb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GB", bytes / kGB);
  return text;
}

}  // namespace

Result<InstanceMemory> PlanInstanceMemory(const ModelSpec& model, const HardwareSpec& hw,
                                          const MemoryOptions& options, const Drafter* drafter) {
  const std::string what = model.name + " on " + hw.name;
  if (options.tp < 1) {
    return Status::Error(what + ": tp must be >= 1 (got " + std::to_string(options.tp) + ")");
  }
  // Far above any deployment (a few hundred ranks); keeps the token count below int64's range.
  constexpr int kMaxDp = 4096;
  if (options.dp < 1 || options.dp > kMaxDp) {
    return Status::Error(what + ": dp must be in [1, " + std::to_string(kMaxDp) + "] (got " +
                         std::to_string(options.dp) + ")");
  }
  const std::int64_t gpus = std::int64_t(options.tp) * options.dp;
  const std::string layout = "tp=" + std::to_string(options.tp) +
                             (options.dp > 1 ? " dp=" + std::to_string(options.dp) : "");
  if (!(options.gpu_memory_utilization > 0 && options.gpu_memory_utilization <= 1)) {
    return Status::Error(what + ": gpu_memory_utilization must be in (0, 1] (got " +
                         std::to_string(options.gpu_memory_utilization) + ")");
  }
  if (options.block_tokens < 1) {
    return Status::Error(what + ": block_tokens must be >= 1 (got " +
                         std::to_string(options.block_tokens) + ")");
  }
  if (options.reserved_bytes_per_gpu < 0) {
    return Status::Error(what + ": reserved bytes per GPU must be >= 0 (got " +
                         std::to_string(options.reserved_bytes_per_gpu) + ")");
  }
  // Each GPU holds whole KV heads: kv_heads / tp of them, or one replicated tp / kv_heads
  // times. Other splits would change per-GPU KV bytes in ways engines differ on; refused.
  const int kv_shards = model.KvShards(options.tp);
  if (kv_shards == 0) {
    return Status::Error(what + ": tp=" + std::to_string(options.tp) +
                         " and num_key_value_heads=" + std::to_string(model.num_key_value_heads) +
                         " do not divide one another (KV heads must split evenly across the "
                         "GPUs, or each be replicated evenly)");
  }
  // Expert parallelism places whole experts, as many on every GPU.
  if (model.moe && model.moe->experts % gpus != 0) {
    return Status::Error(what + ": " + layout + " makes " + std::to_string(gpus) +
                         " GPUs, which do not divide the " + std::to_string(model.moe->experts) +
                         " routed experts evenly");
  }

  const Bytes usable_per_gpu = static_cast<Bytes>(
      std::floor(static_cast<double>(hw.hbm_bytes) * options.gpu_memory_utilization));
  // A TP group holds one copy of everything but the routed experts; those are spread over all
  // the instance's GPUs.
  auto per_gpu = [&](const WeightBreakdown& w, Bytes shared) {
    return (w.NonExpert().bytes - shared + options.tp - 1) / options.tp +
           (w.routed_experts.bytes + gpus - 1) / gpus;
  };
  const WeightBreakdown weights = model.Weights();
  Bytes weight_bytes = weights.Total().bytes;
  Bytes weights_per_gpu = per_gpu(weights, 0);
  Bytes kv_bytes_per_token = model.KvBytesPerToken(options.kv_cache_dtype);
  if (drafter) {
    const WeightBreakdown w = drafter->model.Weights();
    const Bytes shared = drafter->shares_embeddings ? w.embedding.bytes + w.lm_head.bytes : 0;
    weight_bytes += w.Total().bytes - shared;
    weights_per_gpu += per_gpu(w, shared);
    kv_bytes_per_token += drafter->model.KvBytesPerToken(options.kv_cache_dtype);
  }
  // Compared before subtracting so an absurd reserve cannot overflow the difference.
  const Bytes after_weights_per_gpu = usable_per_gpu - weights_per_gpu;
  if (after_weights_per_gpu <= options.reserved_bytes_per_gpu) {
    char numbers[160];
    std::snprintf(numbers, sizeof(numbers), "%.2f", options.gpu_memory_utilization);
    return Status::Error(model.name + " (" + Gb(double(weight_bytes)) + " of weights over " +
                         layout + ", " + Gb(double(weights_per_gpu)) +
                         " per GPU) does not fit on " + hw.name + ": " +
                         Gb(double(usable_per_gpu)) + " usable per GPU (" + numbers + " of " +
                         Gb(double(hw.hbm_bytes)) + ") minus " +
                         Gb(double(options.reserved_bytes_per_gpu)) + " reserved");
  }

  const Bytes kv_bytes_per_gpu = after_weights_per_gpu - options.reserved_bytes_per_gpu;
  // The shards divide KvBytesPerToken exactly: each GPU stores its share of every token of its
  // DP rank's requests (MLA: all of the latent).
  const Bytes kv_bytes_per_token_per_gpu = kv_bytes_per_token / kv_shards;
  const Tokens kv_tokens = kv_bytes_per_gpu / kv_bytes_per_token_per_gpu * options.dp;
  const std::int64_t kv_blocks = kv_tokens / options.block_tokens;
  if (kv_blocks < 1) {
    return Status::Error(model.name + " on " + hw.name + " (" + layout + "): the " +
                         Gb(double(kv_bytes_per_gpu)) + " left per GPU for the KV cache holds " +
                         std::to_string(kv_tokens) + " tokens, less than one block of " +
                         std::to_string(options.block_tokens));
  }

  // Block ids are 32-bit in the block managers (and a real engine's block tables).
  constexpr std::int64_t kMaxKvBlocks = std::numeric_limits<std::int32_t>::max();
  if (kv_blocks > kMaxKvBlocks) {
    return Status::Error(
        what + " (" + layout + "): the KV cache would hold " + std::to_string(kv_blocks) +
        " blocks of " + std::to_string(options.block_tokens) + " tokens, more than the " +
        std::to_string(kMaxKvBlocks) + " an instance can index: raise block_tokens");
  }

  InstanceMemory plan;
  plan.weight_bytes_per_gpu = weights_per_gpu;
  plan.reserved_bytes_per_gpu = options.reserved_bytes_per_gpu;
  plan.kv_bytes_per_gpu = kv_bytes_per_gpu;
  plan.kv_tokens = kv_tokens;
  plan.kv_blocks = kv_blocks;
  return plan;
}

}  // namespace duet::models
