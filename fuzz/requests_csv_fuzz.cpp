// Fuzz target for reading a requests.csv column back (policies/metrics.cpp's
// ParseRequestsCsvColumn, which `duet validate --report` plots): any text gives values or an
// error, never a crash, and every value read is finite.
#include <cmath>
#include <cstdint>
#include <string>

#include "policies/metrics.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const char* column : {"ttft_ms", "e2e_ms", "reason"}) {
    auto values = duet::policies::ParseRequestsCsvColumn(text, "fuzz.csv", column);
    if (!values.ok()) continue;
    for (double v : *values)
      if (!std::isfinite(v)) __builtin_trap();
  }
  return 0;
}
