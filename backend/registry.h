// The one place that knows which optional backends this build contains (CUDA, UCX, NCCL).
// Callers ask here instead of testing preprocessor flags of their own.
#pragma once

#include <string>
#include <vector>

namespace duet::backend {

struct BuildFeatures {
  bool cuda = false;
  bool ucx = false;
  bool nccl = false;
};

BuildFeatures CompiledFeatures();
// Human-readable, e.g. "cuda=no ucx=yes nccl=no".
std::string DescribeFeatures();

}  // namespace duet::backend
