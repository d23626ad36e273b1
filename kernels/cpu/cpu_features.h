// Which instruction-set path the CPU kernels take. The library is built for baseline x86-64
// (SSE2) so it runs on every CI machine; hot loops also have an AVX2+FMA+F16C version picked at
// run time. DUET_KERNELS_ISA=baseline in the environment forces the portable path.
#pragma once

// Marks a function as compiled for AVX2+FMA+F16C. Only call such functions after checking
// ActiveIsa() == Isa::kAvx2. Per-function attributes (not #pragma GCC target) so that GCC and
// clang both accept it and nothing outside these functions gets AVX2 code.
#if defined(__x86_64__) || defined(__i386__)
#define DUET_KERNELS_X86 1
#define DUET_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define DUET_KERNELS_X86 0
#define DUET_TARGET_AVX2
#endif

namespace duet::kernels::cpu {

enum class Isa { kBaseline, kAvx2 };

const char* IsaName(Isa isa);  // "baseline", "avx2"
bool IsaSupported(Isa isa);    // by this CPU and OS
// The path in use: the best supported one unless overridden by DUET_KERNELS_ISA or
// SetIsaForTesting.
Isa ActiveIsa();
// Tests and benchmarks run both paths on one machine. Checks that the CPU supports `isa`.
void SetIsaForTesting(Isa isa);

}  // namespace duet::kernels::cpu
