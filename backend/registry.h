// The one place that knows which optional backends this build contains (CUDA, UCX, NCCL), and
// the loader of the CUDA plugin. Callers ask here instead of testing preprocessor flags of their
// own; the KV transports a command may choose are listed by backend/transport/
// kv_transport_registry.h, the registry of transports, which asks here for the plugin.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/engine/forward_model.h"
#include "backend/model/llama_weights.h"
#include "common/status.h"
#include "models/dtype.h"

namespace duet::backend {

struct BuildFeatures {
  bool cuda = false;
  bool ucx = false;
  bool nccl = false;
};

BuildFeatures CompiledFeatures();
// Human-readable, e.g. "cuda=no ucx=yes nccl=no".
std::string DescribeFeatures();

// Whether this build made the CUDA plugin (libduet_cuda_plugin.so: the CUDA model and the CUDA
// IPC KV transport) and it is where LoadCudaPlugin looks. Does not load it: that maps the CUDA
// runtime and cuBLAS.
bool CudaPluginBuilt();
// The plugin's handle (loaded once, for the life of the process: what it made may outlive any
// caller). Errors: a build without it, or a plugin that does not load.
Result<void*> LoadCudaPlugin();

// Where a model runs: "cpu" (the reference kernels, always there) or "cuda" (device 0).
struct ModelPlacement {
  std::string device = "cpu";
  std::int64_t num_blocks = 0;  // KV cache blocks
  std::int32_t block_tokens = 16;
  int cpu_threads = 0;  // cpu: 0 = one per hardware thread
  // The KV cache's dtype (engine.kv_cache_dtype); nullopt: the model's ("auto"). cuda keeps
  // bfloat16 only.
  std::optional<models::Dtype> kv_cache_dtype;
  // cpu: where the KV cache lives (KvTransportAllocator's, for the transport that moves it);
  // null: the heap. cuda keeps its cache in device memory.
  KvAllocator kv_allocator;
};
// The model on the device asked for. Errors: an unknown device, "cuda" in a build without
// CUDA or on a machine without a device, and the models' own errors.
Result<std::unique_ptr<ForwardModel>> CreateForwardModel(LoadedModel model,
                                                         const ModelPlacement& placement);

}  // namespace duet::backend
