// What the step executor needs of a model: one forward pass of a mixed batch (prefill chunks
// and decode tokens) over the paged KV cache the model owns, into the blocks the shared block
// manager allocated. Implemented on the CPU reference kernels (CpuModel) and on CUDA
// (CudaModel), so one executor and one engine loop drive either.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "models/model_spec.h"

namespace duet::backend {

// One sequence's part of a forward pass.
struct SequenceChunk {
  std::span<const std::int32_t> tokens;       // token ids computed in this pass (>= 1)
  std::int64_t context_before = 0;            // tokens already in its KV cache
  std::span<const std::int32_t> block_table;  // physical blocks, covering all its tokens
  enum class Logits { kNone, kLast, kAll } logits = Logits::kLast;
};

// Memory a model keeps its KV cache in. A model allocates its own unless it is given a
// KvAllocator: a transport's, whose memory its peers reach faster than memory it only registers
// (UCX allocates shared memory that a peer process on this machine maps and copies from,
// instead of a system call per pull).
class KvMemory {
 public:
  virtual ~KvMemory() = default;
  virtual void* data() = 0;
};
// `bytes` of KvMemory, or why not. The contents are unspecified: the model clears them.
using KvAllocator = std::function<Result<std::unique_ptr<KvMemory>>(std::int64_t bytes)>;
// What a model keeps its KV cache in without an allocator: heap memory aligned to a page, as
// UCX's and CUDA's allocations are (new[] aligns to 16 bytes), so that a block starts on a
// cache line and a copy of whole blocks (a decode instance's pull) splits none.
std::unique_ptr<KvMemory> AllocateHeapKvMemory(std::int64_t bytes);

// The KV cache as memory that a transport or a tier can register once: block b is the
// block_bytes bytes at base + b * block_bytes and holds every layer's K and V of that block's
// tokens (block-major). Copying those bytes into another model's block (same config, block
// size and cache dtype) moves the block's KV.
struct KvRegion {
  void* base = nullptr;
  std::int64_t block_bytes = 0;
  std::int64_t num_blocks = 0;
  // What a KvAllocator gave the model for it; null when the model allocated it itself.
  KvMemory* memory = nullptr;
};

class ForwardModel {
 public:
  virtual ~ForwardModel() = default;
  // Runs the batch. Logits rows (vocab fp32 each) are appended to `logits` in batch order: one
  // row for kLast, one per token for kAll. Blocking; one pass at a time. An error (a CUDA error,
  // an allocation that failed) is the pass's failure, not the process's: what it appended and
  // what it wrote into the batch's KV blocks are then unspecified, and the model serves later
  // passes as far as the device lets it. A batch that breaks the contract above (an empty
  // chunk, a block table too short) is a broken invariant, not an error.
  virtual Status Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits) = 0;
  // The same pass with greedy sampling: appends, per logits row, the largest logit's id (the
  // lowest id among equal ones; NaN never chosen), exactly as kernels::cpu::Sample does at
  // temperature 0. This default samples on the host from Forward's logits. Errors as Forward.
  virtual Status ForwardGreedy(std::span<const SequenceChunk> batch,
                               std::vector<std::int32_t>* tokens);
  virtual const models::ModelSpec& config() const = 0;
  virtual std::int64_t num_blocks() const = 0;  // KV blocks the model holds
  virtual std::int32_t block_tokens() const = 0;
  // The dtype the model stores its KV cache in (CpuModel: the model's, CudaModel: bf16).
  virtual models::Dtype kv_cache_dtype() const = 0;
  // Bytes of KV cache one token occupies: config().KvBytesPerToken(kv_cache_dtype()), the
  // formula the simulator plans with (engine.kv_cache_dtype in cluster files). Every model
  // sizes its cache with it.
  std::int64_t kv_bytes_per_token() const { return config().KvBytesPerToken(kv_cache_dtype()); }
  // Bytes of KV cache memory the model actually allocated (num_blocks * block_tokens tokens).
  virtual std::int64_t kv_cache_bytes() const = 0;
  // The cache as one block-major region; nullopt where the cache is laid out otherwise
  // (CudaModel keeps one K and one V array per layer).
  virtual std::optional<KvRegion> kv_region() { return std::nullopt; }
};

// Runs a prefill of `prompt`, a decode step after it and a decode step of 16 one-token
// sequences straight through the model, over KV blocks 0.. (nothing enters an engine's cache;
// later use overwrites what it wrote), so that the passes after it do not meet cold memory, caches
// and kernels: a server's first prefills ran 17-23% slower than the same shapes later
// (docs/validation.md). Best called on the thread that will run the model, before it serves:
// oneDNN keeps its primitives, and kernels their scratch, per thread (a worker process calls it
// on its main thread, before it registers; its engine thread's first steps then cost a few
// milliseconds more). `prompt` must fit the model's positions and blocks (WarmUpPrompt's does).
// Stops at the first pass that fails and returns its error: the model is then cold, not
// unusable (each later pass reports its own failure).
Status WarmUp(ForwardModel& model, std::span<const std::int32_t> prompt);
// Up to 512 token ids spread over the vocabulary, as many as the model's positions and KV
// blocks leave room for beside the decode token (none when they leave none).
std::vector<std::int32_t> WarmUpPrompt(const ForwardModel& model);

}  // namespace duet::backend
