// Fuzz target for the Azure CSV reader: any bytes must give a trace or an error Status, never
// a crash or sanitizer report. Accepted traces are checked for the reader's promises (sorted,
// first arrival 0, positive lengths).
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "traces/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  auto trace = duet::traces::ParseAzure(in, "fuzz.csv");
  if (!trace.ok()) {
    if (trace.error().rfind("fuzz.csv", 0) != 0) std::abort();
    return 0;
  }
  if (trace->requests.empty() || trace->requests.front().arrival_s != 0) std::abort();
  for (std::size_t i = 0; i < trace->requests.size(); ++i) {
    const auto& r = trace->requests[i];
    if (r.input_tokens < 1 || r.output_tokens < 1 || !r.block_ids.empty()) std::abort();
    if (i > 0 && trace->requests[i - 1].arrival_s > r.arrival_s) std::abort();
  }
  return 0;
}
