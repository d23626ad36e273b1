// Fuzz target for `duet validate`'s --tolerance and --rate-scales lists (cli/validate_flags.h):
// the first byte picks the parser, the rest is the flag's value. Any value is parsed or rejected
// with a message; what parses is within the bounds the run relies on.
#include <cmath>
#include <cstdint>
#include <string>

#include "cli/validate_flags.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto tolerances = duet::cli::ParseTolerances(text);
    if (tolerances.ok()) {
      for (const auto& [key, pct] : *tolerances) DUET_CHECK(pct >= 0 && std::isfinite(pct));
    } else {
      DUET_CHECK(!tolerances.error().empty());
    }
  } else {
    auto scales = duet::cli::ParseRateScales(text);
    if (scales.ok()) {
      DUET_CHECK(!scales->empty() && scales->size() <= 8);
      for (double r : *scales) DUET_CHECK(r > 0 && r <= 1e6);
    } else {
      DUET_CHECK(!scales.error().empty());
    }
  }
  return 0;
}
