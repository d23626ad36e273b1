#include "cli/machine_cpu.h"

#include <unistd.h>

#include <array>
#include <fstream>
#include <sstream>
#include <string>

namespace duet::cli {

std::optional<MachineCpu> ParseProcStat(std::string_view text) {
  std::istringstream line(std::string(text.substr(0, text.find('\n'))));
  std::string name;
  std::array<long long, 8> ticks{};
  line >> name;
  for (long long& t : ticks) line >> t;
  if (name != "cpu" || !line) return std::nullopt;
  for (long long t : ticks)
    if (t < 0) return std::nullopt;
  const long per_second = sysconf(_SC_CLK_TCK);
  if (per_second <= 0) return std::nullopt;
  const auto seconds = [&](long double t) { return static_cast<Seconds>(t / per_second); };
  // Guest time is counted in user time already; idle and iowait are no process's.
  enum { kUser, kNice, kSystem, kIdle, kIowait, kIrq, kSoftirq, kSteal };
  const long double busy = static_cast<long double>(ticks[kUser]) + ticks[kNice] + ticks[kSystem] +
                           ticks[kIrq] + ticks[kSoftirq];
  return MachineCpu{seconds(busy), seconds(static_cast<long double>(ticks[kSteal]))};
}

std::optional<MachineCpu> ReadMachineCpu() {
  std::ifstream in("/proc/stat");
  std::string first;
  if (!std::getline(in, first)) return std::nullopt;
  return ParseProcStat(first);
}

}  // namespace duet::cli
