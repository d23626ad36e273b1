// Everything of the CPU reference kernels in one include: weights and dtype conversion, the
// thread pool, embedding / RMSNorm / RoPE / SwiGLU, MatMul, the paged KV cache with attention,
// and sampling. Namespace duet::kernels::cpu.
#pragma once

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight.h"
