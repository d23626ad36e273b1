// Units used across Duet. Times are seconds (double) inside the code and milliseconds only
// in output files (METRICS.md); sizes are bytes (int64); rates carry their unit in the name.
#pragma once

#include <cstdint>

namespace duet {

using Seconds = double;
using Bytes = std::int64_t;
using Tokens = std::int64_t;
using FlopsPerSecond = double;
using BytesPerSecond = double;

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kGB = 1e9;

}  // namespace duet
