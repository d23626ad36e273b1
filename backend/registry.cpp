// Registry of optional backends: the only file that reads DUET_HAVE_* build flags.
#include "backend/registry.h"

#include "backend/cpu/cpu_model.h"
#if DUET_HAVE_CUDA_MODEL
#include "backend/cuda/cuda_model.h"
#endif

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

Result<std::unique_ptr<ForwardModel>> CreateForwardModel(LoadedModel model,
                                                         const ModelPlacement& placement) {
  if (placement.device == "cpu") {
    auto m = CpuModel::Create(
        std::move(model), {placement.num_blocks, placement.block_tokens, placement.cpu_threads});
    if (!m) return m.status();
    return std::unique_ptr<ForwardModel>(std::move(*m));
  }
  if (placement.device == "cuda") {
#if DUET_HAVE_CUDA_MODEL
    auto m = CudaModel::Create(model, {placement.num_blocks, placement.block_tokens, 0});
    if (!m) return m.status();
    return std::unique_ptr<ForwardModel>(std::move(*m));
#else
    return Status::Error("this build has no CUDA backend (configure with nvcc present)");
#endif
  }
  return Status::Error("unknown device '" + placement.device + "' (expected cpu or cuda)");
}

}  // namespace duet::backend
