// The descriptor a CUDA IPC KV transport publishes so that peers on the same machine can pull
// from its KV region in device memory: the owner's process id, its device's UUID, the CUDA IPC
// handle of the allocation holding the region, the region's offset in that allocation and
// address in the owner's space, and its block size and count. Kept apart from the transport
// (no CUDA headers) so that the parser builds, is tested and is fuzzed everywhere.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace duet::backend {

struct CudaIpcPeerDescriptor {
  std::uint32_t pid = 0;  // the owner's process (a peer in it copies directly)
  std::array<unsigned char, 16> device_uuid{};  // cudaDeviceProp::uuid of the region's device
  std::array<unsigned char, 64> handle{};       // cudaIpcMemHandle_t of its allocation
  std::uint64_t base = 0;                       // the region's address in the owner's space
  std::uint64_t offset = 0;                     // the region's offset in the allocation
  std::int64_t block_bytes = 0;
  std::int64_t num_blocks = 0;
};

// Format: "DKVC", version (u32, 1), pid (u32), device UUID (16 bytes), IPC handle (64 bytes),
// base (u64), offset (u64), block_bytes (i64), num_blocks (i64); little-endian; nothing after.
// Anything else is an error naming what is wrong.
std::string EncodeCudaIpcDescriptor(const CudaIpcPeerDescriptor& descriptor);
Result<CudaIpcPeerDescriptor> ParseCudaIpcDescriptor(std::string_view bytes);

}  // namespace duet::backend
