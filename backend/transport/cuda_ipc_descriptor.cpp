// The CUDA IPC KV descriptor format (see cuda_ipc_descriptor.h).
#include "backend/transport/cuda_ipc_descriptor.h"

#include <string_view>

#include "backend/transport/descriptor_bytes.h"

namespace duet::backend {
namespace {

using descriptor_bytes::Put;
using descriptor_bytes::Take;

constexpr std::string_view kMagic = "DKVC";
constexpr std::uint32_t kVersion = 1;

}  // namespace

std::string EncodeCudaIpcDescriptor(const CudaIpcPeerDescriptor& d) {
  std::string out(kMagic);
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
  DUET_RETURN_IF_ERROR(descriptor_bytes::TakeHeader(in, kMagic, kVersion, what));
  CudaIpcPeerDescriptor d;
  if (!Take(in, &d.pid) || !Take(in, &d.device_uuid) || !Take(in, &d.handle))
    return Status::Error(what + "truncated in its process, device or handle");
  if (!Take(in, &d.base) || !Take(in, &d.offset) || !Take(in, &d.block_bytes) ||
      !Take(in, &d.num_blocks))
    return Status::Error(what + "truncated in its region");
  DUET_RETURN_IF_ERROR(descriptor_bytes::CheckRegion(d.block_bytes, d.num_blocks, what));
  // The region lies inside its allocation, and inside an address space.
  const auto size = static_cast<std::uint64_t>(d.block_bytes * d.num_blocks);
  if (d.offset > (std::uint64_t{1} << 48) || d.base > UINT64_MAX - size)
    return Status::Error(what + "region offset or address out of range");
  if (d.pid == 0) return Status::Error(what + "process id 0");
  if (!in.empty()) return Status::Error(what + std::to_string(in.size()) + " bytes after its end");
  return d;
}

}  // namespace duet::backend
