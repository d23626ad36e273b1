// The progress bar every long-running command draws on stderr (duet simulate, replay,
// calibrate): "\r[#####.........]  42%  <what>", a newline once done.
#pragma once

#include <cstddef>
#include <string>

namespace duet {

// Draws the bar for `done` of `total` followed by `detail` and flushes stderr.
void DrawProgress(std::size_t done, std::size_t total, const std::string& detail);

}  // namespace duet
