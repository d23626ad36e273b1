// Registry of optional backends: the only file that reads DUET_HAVE_* build flags.
#include "backend/registry.h"

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

}  // namespace duet::backend
