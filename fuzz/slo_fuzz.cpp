// Fuzz target for the --slo flag parser (policies/metrics.cpp).
#include <cmath>
#include <cstdint>
#include <string>

#include "policies/metrics.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto slo = duet::policies::ParseSlo(text);
  if (slo.ok()) {
    for (const auto& v : {slo->ttft_ms, slo->tpot_ms, slo->e2e_ms}) {
      if (v && !(std::isfinite(*v) && *v > 0)) __builtin_trap();
    }
  }
  return 0;
}
