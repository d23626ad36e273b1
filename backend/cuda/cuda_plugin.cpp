// The entry point of the CUDA plugin (libduet_cuda_plugin.so), which backend/registry.cpp
// loads with dlopen when a model is asked for on "cuda". Keeping the CUDA runtime and cuBLAS
// out of the `duet` executable spares every other command their load time and memory.
#include <string>

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
