// One KV block as a tier below host memory stores it (an SSD block file, a Redis value): a
// 64-byte header, then the block's bytes as they are in the model's KV region.
//
//   offset  size  field (little-endian)
//        0     8  magic "DUETKVB1"
//        8     4  format version (1)
//       12     4  header bytes (64)
//       16     8  layout fingerprint: the model, cache dtype and block shape that wrote it
//       24     8  the block's chained prefix hash (its name in every tier)
//       32     8  payload bytes
//       40     8  XXH3-64 of the payload
//       48     8  XXH3-64 of bytes 0..47
//       56     8  reserved: zero
//
// A stored block is served only if every field matches what the reader expects and both
// checksums hold: a truncated, corrupt or foreign block is an error, never KV.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "policies/request.h"

namespace duet::backend {

inline constexpr std::size_t kStoredBlockHeaderBytes = 64;

// What every block of one tier shares: the fingerprint of the layout that wrote it and the
// payload size.
struct StoredBlockLayout {
  std::uint64_t fingerprint = 0;
  std::int64_t block_bytes = 0;
};

// The header of `payload` stored as block `hash` (payload.size() == layout.block_bytes).
void EncodeStoredBlockHeader(const StoredBlockLayout& layout, policies::BlockHash hash,
                             std::span<const std::byte> payload,
                             std::span<std::byte, kStoredBlockHeaderBytes> header);

// Checks the header alone: magic, version, layout, hash and its own checksum. `stored` is at
// least the header; the payload is not read (a scan at start reads headers only).
Status CheckStoredBlockHeader(std::span<const std::byte> stored, const StoredBlockLayout& layout,
                              policies::BlockHash hash);

// Checks a payload against the header it was stored with (one CheckStoredBlockHeader passed):
// its size and its checksum. For a block read in two parts.
Status CheckStoredPayload(std::span<const std::byte, kStoredBlockHeaderBytes> header,
                          std::span<const std::byte> payload);

// The payload of a whole stored block (header then payload, nothing after), checked: the header
// as above, the size, the payload's checksum. The span points into `stored`.
Result<std::span<const std::byte>> ParseStoredBlock(std::span<const std::byte> stored,
                                                    const StoredBlockLayout& layout,
                                                    policies::BlockHash hash);

// The hash a stored block's header names (0 if `stored` is shorter than a header): lets a scan
// at start learn what a file holds before checking it.
policies::BlockHash StoredBlockHash(std::span<const std::byte> stored);

// The fingerprint of a model layout, from its description (a model and cache dtype name, the
// block's token count and bytes): blocks written under another layout are never served.
std::uint64_t LayoutFingerprint(const std::string& description);

// 16 lowercase hex digits (file names, Redis keys).
std::string HashHex(std::uint64_t value);
// The value HashHex wrote: exactly 16 lowercase hex digits, else nullopt.
std::optional<std::uint64_t> ParseHashHex(std::string_view hex);

}  // namespace duet::backend
