// The whole machine's CPU time since boot, summed over its cores (/proc/stat's first line), in
// seconds: what its processes used (user, nice, system, interrupts) and what the hypervisor took
// from a virtual machine's cores for others (steal). Two readings around a live run give the CPU
// that processes beside the server and the client used, and the steal: the machine's own noise,
// which calibration on an idle machine does not see (docs/validation.md).
#pragma once

#include <optional>
#include <string_view>

#include "common/units.h"

namespace duet::cli {

struct MachineCpu {
  Seconds busy_s = 0;
  Seconds steal_s = 0;
};

// The first line of a /proc/stat ("cpu  user nice system idle iowait irq softirq steal ...", in
// clock ticks); nullopt when it is not one.
std::optional<MachineCpu> ParseProcStat(std::string_view text);
// This machine's, now; nullopt where /proc/stat cannot be read or parsed.
std::optional<MachineCpu> ReadMachineCpu();

}  // namespace duet::cli
