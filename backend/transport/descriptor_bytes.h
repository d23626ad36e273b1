// Fixed-size fields of the KV descriptors that transports publish (ucx_descriptor.h,
// cuda_ipc_descriptor.h): appended and read in the host's byte order, which is little-endian on
// every host Duet builds for (x86-64, aarch64).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

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

// A region a descriptor may describe: at least one block of at least one byte, at most 2^31
// blocks of at most 2^40 bytes, and block_bytes * num_blocks without overflow.
inline bool RegionInRange(std::int64_t block_bytes, std::int64_t num_blocks) {
  return block_bytes > 0 && num_blocks > 0 && block_bytes <= (std::int64_t{1} << 40) &&
         num_blocks <= (std::int64_t{1} << 31) && block_bytes <= INT64_MAX / num_blocks;
}

}  // namespace duet::backend::descriptor_bytes
