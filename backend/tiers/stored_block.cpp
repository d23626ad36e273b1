#include "backend/tiers/stored_block.h"

#include <xxhash.h>

#include <cstring>

namespace duet::backend {
namespace {

constexpr char kMagic[8] = {'D', 'U', 'E', 'T', 'K', 'V', 'B', '1'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHeaderChecked = 48;  // bytes the header's own checksum covers

// The host is little-endian (x86-64, aarch64): fields are copied as they are in memory.
template <typename T>
void Put(std::span<std::byte> out, std::size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof v);
}
template <typename T>
T Get(std::span<const std::byte> in, std::size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

std::uint64_t Xxh3(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace

void EncodeStoredBlockHeader(const StoredBlockLayout& layout, policies::BlockHash hash,
                             std::span<const std::byte> payload,
                             std::span<std::byte, kStoredBlockHeaderBytes> header) {
  std::memset(header.data(), 0, header.size());
  std::memcpy(header.data(), kMagic, sizeof kMagic);
  Put<std::uint32_t>(header, 8, kVersion);
  Put<std::uint32_t>(header, 12, static_cast<std::uint32_t>(kStoredBlockHeaderBytes));
  Put<std::uint64_t>(header, 16, layout.fingerprint);
  Put<std::uint64_t>(header, 24, hash);
  Put<std::uint64_t>(header, 32, static_cast<std::uint64_t>(payload.size()));
  Put<std::uint64_t>(header, 40, Xxh3(payload));
  Put<std::uint64_t>(header, 48, Xxh3(std::span<const std::byte>(header).first(kHeaderChecked)));
}

Status CheckStoredBlockHeader(std::span<const std::byte> stored, const StoredBlockLayout& layout,
                              policies::BlockHash hash) {
  if (stored.size() < kStoredBlockHeaderBytes)
    return Status::Error("truncated: " + std::to_string(stored.size()) +
                         " bytes, shorter than the " + std::to_string(kStoredBlockHeaderBytes) +
                         "-byte header");
  if (std::memcmp(stored.data(), kMagic, sizeof kMagic) != 0)
    return Status::Error("not a Duet KV block (bad magic)");
  if (Get<std::uint64_t>(stored, 48) != Xxh3(stored.first(kHeaderChecked)))
    return Status::Error("corrupt header (checksum mismatch)");
  if (Get<std::uint64_t>(stored, 56) != 0)
    return Status::Error("corrupt header (reserved bytes set)");
  if (const auto v = Get<std::uint32_t>(stored, 8); v != kVersion)
    return Status::Error("format version " + std::to_string(v) + ", expected " +
                         std::to_string(kVersion));
  if (Get<std::uint32_t>(stored, 12) != kStoredBlockHeaderBytes)
    return Status::Error("header size " + std::to_string(Get<std::uint32_t>(stored, 12)) +
                         ", expected " + std::to_string(kStoredBlockHeaderBytes));
  if (Get<std::uint64_t>(stored, 16) != layout.fingerprint)
    return Status::Error("written under another model layout (fingerprint " +
                         HashHex(Get<std::uint64_t>(stored, 16)) + ", expected " +
                         HashHex(layout.fingerprint) + ")");
  if (Get<std::uint64_t>(stored, 24) != hash)
    return Status::Error("holds block " + HashHex(Get<std::uint64_t>(stored, 24)) + ", expected " +
                         HashHex(hash));
  if (Get<std::uint64_t>(stored, 32) != static_cast<std::uint64_t>(layout.block_bytes))
    return Status::Error("payload of " + std::to_string(Get<std::uint64_t>(stored, 32)) +
                         " bytes, expected " + std::to_string(layout.block_bytes));
  return Status::Ok();
}

Result<std::span<const std::byte>> ParseStoredBlock(std::span<const std::byte> stored,
                                                    const StoredBlockLayout& layout,
                                                    policies::BlockHash hash) {
  if (Status s = CheckStoredBlockHeader(stored, layout, hash); !s.ok()) return s;
  const std::size_t want = kStoredBlockHeaderBytes + static_cast<std::size_t>(layout.block_bytes);
  if (stored.size() != want)
    return Status::Error((stored.size() < want ? "truncated: " : "trailing bytes: ") +
                         std::to_string(stored.size()) + " bytes, expected " +
                         std::to_string(want));
  const std::span<const std::byte> payload = stored.subspan(kStoredBlockHeaderBytes);
  if (Status s = CheckStoredPayload(stored.first<kStoredBlockHeaderBytes>(), payload); !s.ok())
    return s;
  return payload;
}

Status CheckStoredPayload(std::span<const std::byte, kStoredBlockHeaderBytes> header,
                          std::span<const std::byte> payload) {
  if (Get<std::uint64_t>(header, 32) != payload.size())
    return Status::Error("payload of " + std::to_string(payload.size()) +
                         " bytes, the header says " +
                         std::to_string(Get<std::uint64_t>(header, 32)));
  if (Xxh3(payload) != Get<std::uint64_t>(header, 40))
    return Status::Error("corrupt payload (checksum mismatch)");
  return Status::Ok();
}

policies::BlockHash StoredBlockHash(std::span<const std::byte> stored) {
  return stored.size() < kStoredBlockHeaderBytes ? 0 : Get<std::uint64_t>(stored, 24);
}

std::uint64_t LayoutFingerprint(const std::string& description) {
  return XXH3_64bits(description.data(), description.size());
}

std::string HashHex(std::uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[static_cast<std::size_t>(i)] = kDigits[value & 15];
  return out;
}

std::optional<std::uint64_t> ParseHashHex(std::string_view hex) {
  if (hex.size() != 16) return std::nullopt;
  std::uint64_t value = 0;
  for (const char c : hex) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    value = value << 4 | static_cast<std::uint64_t>(d);
  }
  return value;
}

}  // namespace duet::backend
