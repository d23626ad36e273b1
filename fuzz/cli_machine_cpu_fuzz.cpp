// Fuzz target for /proc/stat's first line as `duet validate` reads it (cli/machine_cpu.h): any
// text is parsed or refused; what parses is a finite, non-negative CPU time.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "cli/machine_cpu.h"
#include "common/status.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (const auto cpu = duet::cli::ParseProcStat(text)) {
    DUET_CHECK(std::isfinite(cpu->busy_s) && cpu->busy_s >= 0);
    DUET_CHECK(std::isfinite(cpu->steal_s) && cpu->steal_s >= 0);
  }
  return 0;
}
