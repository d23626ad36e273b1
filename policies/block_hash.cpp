// Chained engine-block hashes from trace prefix ids (see block_hash.h).
#include "policies/block_hash.h"

#include "common/mix.h"

#include <algorithm>

namespace duet::policies {
namespace {

constexpr BlockHash kRoot = 0x6475657400000000ULL;   // "duet": the root of every chain
constexpr std::uint64_t kContent = 0x7472616365ULL;  // "trace": trace-id content

}  // namespace

std::vector<BlockHash> EngineBlockHashes(std::span<const std::uint64_t> trace_ids,
                                         Tokens trace_block_tokens, Tokens input_tokens,
                                         Tokens engine_block_tokens) {
  std::vector<BlockHash> hashes;
  if (trace_ids.empty() || trace_block_tokens <= 0 || engine_block_tokens <= 0) return hashes;
  const Tokens covered =
      std::min<Tokens>(input_tokens, static_cast<Tokens>(trace_ids.size()) * trace_block_tokens);
  const Tokens full_blocks = covered / engine_block_tokens;
  hashes.reserve(static_cast<std::size_t>(full_blocks));
  BlockHash parent = kRoot;
  // Engine block j covers tokens [first, first + engine_block_tokens): trace blocks
  // first_trace .. last_trace, starting `offset` tokens into the first. Kept incrementally
  // (no division per block: this runs for every prompt block of every request).
  Tokens first_trace = 0, offset = 0;
  for (Tokens j = 0; j < full_blocks; ++j) {
    const Tokens last_trace =
        offset + engine_block_tokens <= trace_block_tokens
            ? first_trace
            : first_trace + (offset + engine_block_tokens - 1) / trace_block_tokens;
    // The block's content: the trace ids it overlaps and its offset inside the first (which
    // tells apart engine blocks of one trace block). It does not depend on the chain, so only
    // the last mix waits for the parent's hash: the blocks' contents are mixed in parallel.
    std::uint64_t content = SplitMix64(kContent ^ static_cast<std::uint64_t>(offset));
    for (Tokens t = first_trace; t <= last_trace; ++t) {
      content = SplitMix64(content ^ trace_ids[static_cast<std::size_t>(t)]);
    }
    const BlockHash h = SplitMix64(parent ^ content);
    hashes.push_back(h);
    parent = h;
    offset += engine_block_tokens;
    if (offset >= trace_block_tokens) {
      first_trace += offset / trace_block_tokens;
      offset %= trace_block_tokens;
    }
  }
  return hashes;
}

std::vector<BlockHash> TokenBlockHashes(std::span<const std::int32_t> token_ids,
                                        Tokens engine_block_tokens) {
  std::vector<BlockHash> hashes;
  if (engine_block_tokens <= 0) return hashes;
  const auto full_blocks = static_cast<Tokens>(token_ids.size()) / engine_block_tokens;
  hashes.reserve(static_cast<std::size_t>(full_blocks));
  BlockHash parent = kRoot;
  for (Tokens j = 0; j < full_blocks; ++j) {
    std::uint64_t h =
        SplitMix64(parent ^ 0x746f6b656e73ULL);  // "tokens": apart from trace-id chains
    for (Tokens t = j * engine_block_tokens; t < (j + 1) * engine_block_tokens; ++t) {
      h = SplitMix64(h ^ static_cast<std::uint32_t>(token_ids[static_cast<std::size_t>(t)]));
    }
    hashes.push_back(h);
    parent = h;
  }
  return hashes;
}

void ExtendUniqueBlockHashes(std::vector<BlockHash>& hashes, std::uint64_t salt,
                             std::int64_t blocks) {
  if (blocks <= static_cast<std::int64_t>(hashes.size())) return;
  BlockHash parent = hashes.empty() ? kRoot : hashes.back();
  const std::uint64_t key = SplitMix64(salt ^ 0x756e69717565ULL);  // "unique": its own domain
  for (auto j = static_cast<std::int64_t>(hashes.size()); j < blocks; ++j) {
    parent = SplitMix64(SplitMix64(parent ^ key) ^ static_cast<std::uint64_t>(j));
    hashes.push_back(parent);
  }
}

}  // namespace duet::policies
