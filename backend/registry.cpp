// Registry of optional backends: with backend/transport/kv_transport_registry.cpp (the KV
// transports), the only file that reads DUET_HAVE_* build flags.
#include "backend/registry.h"

#include <dlfcn.h>

#include <filesystem>
#include <system_error>

#include "backend/cpu/cpu_model.h"

namespace duet::backend {

BuildFeatures CompiledFeatures() {
  BuildFeatures f;
  f.cuda = DUET_HAVE_CUDA;
  f.ucx = DUET_HAVE_UCX;
  f.nccl = DUET_HAVE_NCCL;
  return f;
}

std::string DescribeFeatures() {
  const BuildFeatures f = CompiledFeatures();
  auto yes_no = [](bool b) { return b ? std::string("yes") : std::string("no"); };
  return "cuda=" + yes_no(f.cuda) + " ucx=" + yes_no(f.ucx) + " nccl=" + yes_no(f.nccl);
}

namespace {

// The plugin is looked for beside the executable first (bin/../lib, as the build tree and an
// installed or copied tree lay it out), then where this build put it; empty in a build without.
std::string CudaPluginPath() {
#if DUET_HAVE_CUDA_MODEL
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path beside = exe.parent_path().parent_path() / "lib" / "libduet_cuda_plugin.so";
  return !ec && fs::exists(beside, ec) ? beside.string() : std::string(DUET_CUDA_PLUGIN);
#else
  return "";
#endif
}

}  // namespace

bool CudaPluginBuilt() {
  const std::string path = CudaPluginPath();
  std::error_code ec;
  return !path.empty() && std::filesystem::exists(path, ec);
}

Result<void*> LoadCudaPlugin() {
  const std::string path = CudaPluginPath();
  if (path.empty())
    return Status::Error("this build has no CUDA backend (configure with nvcc present)");
  // dlopen returns the same handle for every call once loaded, and the plugin is never closed.
  void* plugin = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!plugin) return Status::Error("cannot load the CUDA plugin " + path + ": " + dlerror());
  return plugin;
}

Result<std::unique_ptr<ForwardModel>> CreateForwardModel(LoadedModel model,
                                                         const ModelPlacement& placement) {
  if (placement.device == "cpu") {
    CpuModelOptions options;
    options.num_blocks = placement.num_blocks;
    options.block_tokens = placement.block_tokens;
    options.threads = placement.cpu_threads;
    options.kv_cache_dtype = placement.kv_cache_dtype;
    options.kv_allocator = placement.kv_allocator;
    auto m = CpuModel::Create(std::move(model), options);
    if (!m) return m.status();
    return std::unique_ptr<ForwardModel>(std::move(*m));
  }
  if (placement.device == "cuda") {
    if (placement.kv_cache_dtype && *placement.kv_cache_dtype != models::Dtype::kBF16)
      return Status::Error(std::string("the cuda backend keeps its KV cache in bfloat16, not ") +
                           models::TorchDtypeName(*placement.kv_cache_dtype) +
                           " (engine.kv_cache_dtype)");
    auto plugin = LoadCudaPlugin();
    if (!plugin) return plugin.status();
    using Create = ForwardModel* (*)(const LoadedModel*, std::int64_t, std::int32_t, std::string*);
    auto create = reinterpret_cast<Create>(dlsym(*plugin, "DuetCreateCudaModel"));
    if (!create) return Status::Error(std::string("CUDA plugin: ") + dlerror());
    std::string error;
    std::unique_ptr<ForwardModel> m(
        create(&model, placement.num_blocks, placement.block_tokens, &error));
    if (!m) return Status::Error(error);
    return m;
  }
  return Status::Error("unknown device '" + placement.device + "' (expected cpu or cuda)");
}

}  // namespace duet::backend
