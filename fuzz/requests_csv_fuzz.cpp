// Fuzz target for reading a requests.csv back (policies/metrics.cpp's ParseRequestsCsvColumns and
// ParseRequestsCsvColumn, which `duet validate` reads both worlds' requests with): any text gives
// values or an error, never a crash; every value read is finite, and every row has a value or
// none for each column asked for.
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
  auto rows = duet::policies::ParseRequestsCsvColumns(text, "fuzz.csv", {"ttft_ms", "e2e_ms"});
  if (rows.ok())
    for (const duet::policies::RequestsCsvRow& row : *rows) {
      if (row.size() != 2) __builtin_trap();
      for (const auto& v : row)
        if (v && !std::isfinite(*v)) __builtin_trap();
    }
  return 0;
}
