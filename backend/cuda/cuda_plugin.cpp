// The entry points of the CUDA plugin (libduet_cuda_plugin.so), which backend/registry.cpp
// loads with dlopen when a model is asked for on "cuda" or the KV transport registry
// (backend/transport/kv_transport_registry.cpp) for "cuda-ipc". Keeping the CUDA runtime and
// cuBLAS out of the `duet` executable spares every other command their load time and memory.
#include <string>

#include "backend/cuda/cuda_ipc_kv_transport.h"
#include "backend/cuda/cuda_model.h"

// Returns a new model (owned by the caller), or null with *error set.
extern "C" __attribute__((visibility("default"))) duet::backend::ForwardModel* DuetCreateCudaModel(
    const duet::backend::LoadedModel* model, std::int64_t num_blocks, std::int32_t block_tokens,
    std::string* error) {
  auto m = duet::backend::CudaModel::Create(*model, {num_blocks, block_tokens, 0});
  if (!m) {
    *error = m.error();
    return nullptr;
  }
  return m->release();
}

// Returns `self`'s side of a CUDA IPC transport over `region` (device memory; owned by the
// caller), or null with *error set.
extern "C" __attribute__((visibility("default"))) duet::backend::PeerKvTransport*
DuetCreateCudaIpcKvTransport(int self, const duet::backend::KvRegion* region, std::string* error) {
  auto t = duet::backend::CudaIpcKvTransport::Create(self, *region);
  if (!t) {
    *error = t.error();
    return nullptr;
  }
  return t->release();
}
