// Run-time choice between the baseline and AVX2 kernel paths (see cpu_features.h): CPUID
// detection once per process, overridable by DUET_KERNELS_ISA=baseline and by tests.
#include "kernels/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/status.h"

#if DUET_KERNELS_X86
#include <cpuid.h>
#endif

namespace duet::kernels::cpu {
namespace {

bool DetectAvx2() {
#if DUET_KERNELS_X86
  // __builtin_cpu_supports("avx2") also checks that the OS saves the YMM state (XGETBV).
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
  // F16C (CPUID.1:ECX bit 29) is read directly: not every compiler knows it by name.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & (1u << 29)) != 0;
#else
  return false;
#endif
}

Isa InitialIsa() {
  const char* forced = std::getenv("DUET_KERNELS_ISA");
  if (forced != nullptr && std::strcmp(forced, "baseline") == 0) return Isa::kBaseline;
  return DetectAvx2() ? Isa::kAvx2 : Isa::kBaseline;
}

std::atomic<Isa>& ActiveIsaSlot() {
  static std::atomic<Isa> slot{InitialIsa()};
  return slot;
}

}  // namespace

const char* IsaName(Isa isa) { return isa == Isa::kAvx2 ? "avx2" : "baseline"; }

bool IsaSupported(Isa isa) {
  static const bool avx2 = DetectAvx2();
  return isa == Isa::kBaseline || avx2;
}

Isa ActiveIsa() { return ActiveIsaSlot().load(std::memory_order_relaxed); }

void SetIsaForTesting(Isa isa) {
  DUET_CHECK(IsaSupported(isa));
  ActiveIsaSlot().store(isa, std::memory_order_relaxed);
}

}  // namespace duet::kernels::cpu
