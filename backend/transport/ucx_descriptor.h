// The descriptor a UCX KV transport publishes so that peers can pull from it: its worker
// address, its KV region (address, block size, block count) and the region's packed remote
// key. Kept apart from the transport (no UCX headers) so that the parser builds, is tested
// and is fuzzed everywhere.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "backend/engine/forward_model.h"
#include "common/status.h"

namespace duet::backend {

// A peer's descriptor, parsed: what Connect needs.
struct UcxPeerDescriptor {
  std::string worker_address;  // opaque UCX bytes
  std::uint64_t base = 0;      // the region's address in the peer's memory
  KvRegion region;             // block_bytes and num_blocks (base unused)
  std::string remote_key;      // opaque UCX bytes
};

// Format: "DKVU", version (u32, 1), base (u64), block_bytes (i64), num_blocks (i64), then the
// worker address and the remote key, each a u32 length and its bytes (at most 64 KiB each);
// little-endian; nothing after. Anything else is an error naming what is wrong.
std::string EncodeUcxDescriptor(const UcxPeerDescriptor& descriptor);
Result<UcxPeerDescriptor> ParseUcxDescriptor(std::string_view bytes);

}  // namespace duet::backend
