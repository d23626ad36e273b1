// What the KV descriptors that transports publish (ucx_descriptor.h, cuda_ipc_descriptor.h)
// share: fixed-size fields appended and read in the host's byte order (little-endian on every
// host Duet builds for: x86-64, aarch64), the magic-and-version header, and the bounds of the
// region a descriptor describes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/status.h"

namespace duet::backend::descriptor_bytes {

template <typename T>
void Put(std::string& out, const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

// Reads from the front of `in`, failing (false) when too short.
template <typename T>
bool Take(std::string_view& in, T* value) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (in.size() < sizeof(T)) return false;
  std::memcpy(value, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

// Reads a descriptor's first fields, its 4-byte magic and its version (u32), from the front of
// `in`: an error that starts with `what` unless they are `magic` and `version`.
inline Status TakeHeader(std::string_view& in, std::string_view magic, std::uint32_t version,
                         const std::string& what) {
  if (in.size() < magic.size() || in.substr(0, magic.size()) != magic)
    return Status::Error(what + "does not start with " + std::string(magic));
  in.remove_prefix(magic.size());
  std::uint32_t got = 0;
  if (!Take(in, &got)) return Status::Error(what + "truncated before its version");
  if (got != version) {
    return Status::Error(what + "version " + std::to_string(got) + ", this build reads " +
                         std::to_string(version));
  }
  return Status::Ok();
}

// A region a descriptor may describe: at least one block of at least one byte, at most 2^31
// blocks of at most 2^40 bytes, and block_bytes * num_blocks without overflow.
inline Status CheckRegion(std::int64_t block_bytes, std::int64_t num_blocks,
                          const std::string& what) {
  if (block_bytes > 0 && num_blocks > 0 && block_bytes <= (std::int64_t{1} << 40) &&
      num_blocks <= (std::int64_t{1} << 31) && block_bytes <= INT64_MAX / num_blocks)
    return Status::Ok();
  return Status::Error(what + "region of " + std::to_string(num_blocks) + " blocks of " +
                       std::to_string(block_bytes) + " bytes is out of range");
}

}  // namespace duet::backend::descriptor_bytes
