// Fuzz target for the GPU price tables of `duet plan` (plan/gpu_prices.cpp): any bytes must give
// prices or a clear error naming the file, never a crash; every price is a finite number in
// [0, 1e6].
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "plan/gpu_prices.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  auto prices = duet::plan::ParseGpuPrices(doc, "fuzz.json");
  if (!prices.ok()) {
    if (prices.error().rfind("fuzz.json", 0) != 0) __builtin_trap();
    return 0;
  }
  for (const auto& [gpu, price] : *prices)
    if (gpu == "notes" || !std::isfinite(price) || price < 0 || price > 1e6) __builtin_trap();
  return 0;
}
