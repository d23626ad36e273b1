// Fuzz target for the scenario file parser of `duet sweep` (plan/scenario.cpp): any bytes must
// give a scenario or a clear error, never a crash; a scenario has rate scales and setups whose
// directory names are unique and non-empty.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "plan/scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  auto scenario = duet::plan::ParseScenario(doc, "fuzz.json");
  if (!scenario.ok()) {
    if (scenario.error().empty()) __builtin_trap();
    return 0;
  }
  if (scenario->rate_scales.empty() || scenario->setups.empty() || scenario->trace.empty())
    __builtin_trap();
  for (double r : scenario->rate_scales)
    if (!(r > 0 && r <= 1000)) __builtin_trap();
  std::set<std::string> slugs;
  for (const auto& s : scenario->setups) {
    if (s.slug.empty() || s.slug.find('/') != std::string::npos || s.cluster.empty())
      __builtin_trap();
    if (!slugs.insert(s.slug).second) __builtin_trap();
  }
  return 0;
}
