// The CUDA IPC KV descriptor format (see cuda_ipc_descriptor.h).
#include "backend/transport/cuda_ipc_descriptor.h"

#include <cstring>

#include "backend/transport/descriptor_bytes.h"

namespace duet::backend {
namespace {

using descriptor_bytes::Put;
using descriptor_bytes::Take;

constexpr char kMagic[4] = {'D', 'K', 'V', 'C'};
constexpr std::uint32_t kVersion = 1;

}  // namespace

std::string EncodeCudaIpcDescriptor(const CudaIpcPeerDescriptor& d) {
  std::string out(kMagic, sizeof kMagic);
  Put(out, kVersion);
  Put(out, d.pid);
  Put(out, d.device_uuid);
  Put(out, d.handle);
  Put(out, d.base);
  Put(out, d.offset);
  Put(out, d.block_bytes);
  Put(out, d.num_blocks);
  return out;
}

Result<CudaIpcPeerDescriptor> ParseCudaIpcDescriptor(std::string_view in) {
  const std::string what = "CUDA IPC KV descriptor: ";
  if (in.size() < sizeof kMagic || std::memcmp(in.data(), kMagic, sizeof kMagic) != 0)
    return Status::Error(what + "does not start with DKVC");
  in.remove_prefix(sizeof kMagic);
  std::uint32_t version = 0;
  if (!Take(in, &version)) return Status::Error(what + "truncated before its version");
  if (version != kVersion) {
    return Status::Error(what + "version " + std::to_string(version) + ", this build reads " +
                         std::to_string(kVersion));
  }
  CudaIpcPeerDescriptor d;
  if (!Take(in, &d.pid) || !Take(in, &d.device_uuid) || !Take(in, &d.handle))
    return Status::Error(what + "truncated in its process, device or handle");
  if (!Take(in, &d.base) || !Take(in, &d.offset) || !Take(in, &d.block_bytes) ||
      !Take(in, &d.num_blocks))
    return Status::Error(what + "truncated in its region");
  if (!descriptor_bytes::RegionInRange(d.block_bytes, d.num_blocks)) {
    return Status::Error(what + "region of " + std::to_string(d.num_blocks) + " blocks of " +
                         std::to_string(d.block_bytes) + " bytes is out of range");
  }
  // The region lies inside its allocation, and inside an address space.
  const auto size = static_cast<std::uint64_t>(d.block_bytes * d.num_blocks);
  if (d.offset > (std::uint64_t{1} << 48) || d.base > UINT64_MAX - size)
    return Status::Error(what + "region offset or address out of range");
  if (d.pid == 0) return Status::Error(what + "process id 0");
  if (!in.empty()) return Status::Error(what + std::to_string(in.size()) + " bytes after its end");
  return d;
}

}  // namespace duet::backend
