// The UCX KV descriptor format (see ucx_descriptor.h).
#include "backend/transport/ucx_descriptor.h"

#include <string_view>

#include "backend/transport/descriptor_bytes.h"

namespace duet::backend {
namespace {

using descriptor_bytes::Put;
using descriptor_bytes::Take;

constexpr std::string_view kMagic = "DKVU";
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kMaxBlob = 64 * 1024;

bool TakeBlob(std::string_view& in, std::string* blob) {
  std::uint32_t size = 0;
  if (!Take(in, &size) || size > kMaxBlob || in.size() < size) return false;
  blob->assign(in.data(), size);
  in.remove_prefix(size);
  return true;
}

}  // namespace

std::string EncodeUcxDescriptor(const UcxPeerDescriptor& d) {
  std::string out(kMagic);
  Put(out, kVersion);
  Put(out, d.base);
  Put(out, static_cast<std::int64_t>(d.region.block_bytes));
  Put(out, static_cast<std::int64_t>(d.region.num_blocks));
  Put(out, static_cast<std::uint32_t>(d.worker_address.size()));
  out += d.worker_address;
  Put(out, static_cast<std::uint32_t>(d.remote_key.size()));
  out += d.remote_key;
  return out;
}

Result<UcxPeerDescriptor> ParseUcxDescriptor(std::string_view in) {
  const std::string what = "UCX KV descriptor: ";
  DUET_RETURN_IF_ERROR(descriptor_bytes::TakeHeader(in, kMagic, kVersion, what));
  UcxPeerDescriptor d;
  std::int64_t block_bytes = 0, num_blocks = 0;
  if (!Take(in, &d.base) || !Take(in, &block_bytes) || !Take(in, &num_blocks)) {
    return Status::Error(what + "truncated in its region");
  }
  DUET_RETURN_IF_ERROR(descriptor_bytes::CheckRegion(block_bytes, num_blocks, what));
  d.region.block_bytes = block_bytes;
  d.region.num_blocks = num_blocks;
  if (!TakeBlob(in, &d.worker_address) || d.worker_address.empty()) {
    return Status::Error(what + "worker address missing, truncated or over 64 KiB");
  }
  if (!TakeBlob(in, &d.remote_key) || d.remote_key.empty()) {
    return Status::Error(what + "remote key missing, truncated or over 64 KiB");
  }
  if (!in.empty()) {
    return Status::Error(what + std::to_string(in.size()) + " bytes after its end");
  }
  return d;
}

}  // namespace duet::backend
