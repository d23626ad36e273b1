#include "common/progress.h"

#include <cstdio>

namespace duet {

void DrawProgress(std::size_t done, std::size_t total, const std::string& detail) {
  constexpr int kWidth = 30;
  const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::fprintf(stderr, "\r[%s%s] %3d%%  %s",
               std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(kWidth - filled), '.').c_str(),
               static_cast<int>(frac * 100), detail.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace duet
