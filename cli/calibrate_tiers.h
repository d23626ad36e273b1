// `duet calibrate --tiers FILE`: the KV tiers a cluster file configures, timed on this host
// through the live server's own tier storage (backend/tiers/), and each tier's reads and writes
// fitted as a link (latency plus bytes over bandwidth), as KV transports are. A cluster file's
// tier that says "fitted": true takes these fits (deploy/tiers.h).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "deploy/tiers.h"
#include "models/step_profile.h"

namespace duet::cli {

// Times reads and writes of 1 to `max_blocks` blocks of `block_bytes` (TransferBlockCounts; at
// least 4 MiB at the largest),
// `repeats` passes over every size, for each tier `tiers` enables, and fits each direction: the
// links deploy::TierLinkName names. The tiers hold blocks of a layout of their own (never a
// server's), at most 256 MiB of them (or the tier's capacity if smaller), and drop them at the
// end; the SSD tier writes under a directory of its own inside the file's `directory` (the same
// disk), removed at the end.
Result<std::vector<models::LinkFit>> TimeTiers(const deploy::TiersSpec& tiers,
                                               std::int64_t block_bytes, std::int64_t max_blocks,
                                               int repeats, bool progress);

}  // namespace duet::cli
