// Fuzz target: a KV block as the SSD and remote tiers store it (backend/tiers/stored_block.h),
// read back under a fixed layout of 64-byte blocks. Any input is served or refused with an
// error, never a crash; what is served re-encodes to the same header.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "backend/tiers/stored_block.h"
#include "common/status.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace duet::backend;
  constexpr StoredBlockLayout kLayout{.fingerprint = 0x5eed, .block_bytes = 64};
  const std::span<const std::byte> stored(reinterpret_cast<const std::byte*>(data), size);
  const auto hash = StoredBlockHash(stored);
  (void)CheckStoredBlockHeader(stored, kLayout, hash);
  const auto payload = ParseStoredBlock(stored, kLayout, hash);
  if (payload.ok()) {
    std::array<std::byte, kStoredBlockHeaderBytes> header{};
    EncodeStoredBlockHeader(kLayout, hash, *payload, header);
    DUET_CHECK(std::memcmp(header.data(), data, header.size()) == 0);
  }
  return 0;
}
