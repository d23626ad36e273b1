// Prompt token ids from trace block ids (prompt.h): SplitMix64 streams keyed by block id or by
// request id, domain-separated so that a block stream never coincides with a request stream.
#include "traces/prompt.h"

#include "common/mix.h"

#include <algorithm>

namespace duet::traces {
namespace {

// Tags keep the two kinds of stream apart even when a block id equals a request id.
constexpr std::uint64_t kBlockStream = 0x626c6f636b000000ull;    // "block"
constexpr std::uint64_t kRequestStream = 0x7265717565737400ull;  // "request"

// Appends `count` tokens of the stream keyed by (kind, key, seed).
void AppendStream(std::uint64_t kind, std::uint64_t key, std::uint64_t seed, Tokens count,
                  std::int32_t vocab_size, std::vector<std::int32_t>& out) {
  std::uint64_t state = SplitMix64(SplitMix64(seed) ^ SplitMix64(kind ^ SplitMix64(key)));
  const auto range = static_cast<std::uint64_t>(vocab_size - kFirstPromptTokenId);
  for (Tokens i = 0; i < count; ++i) {
    state += 0x9E3779B97F4A7C15ull;
    // The modulo bias is below range / 2^64: irrelevant for prompts.
    out.push_back(kFirstPromptTokenId + static_cast<std::int32_t>(SplitMix64(state) % range));
  }
}

}  // namespace

Status CheckPromptOptions(const PromptOptions& options) {
  if (options.vocab_size <= kFirstPromptTokenId)
    return Status::Error(
        "vocabulary size must be greater than " + std::to_string(kFirstPromptTokenId) +
        " (ids below " + std::to_string(kFirstPromptTokenId) +
        " are kept for special tokens), got " + std::to_string(options.vocab_size));
  return Status::Ok();
}

std::vector<std::int32_t> BuildPrompt(const TraceRequest& request, Tokens block_tokens,
                                      const PromptOptions& options) {
  DUET_CHECK(block_tokens > 0);
  DUET_CHECK(CheckPromptOptions(options).ok());
  std::vector<std::int32_t> tokens;
  tokens.reserve(static_cast<std::size_t>(std::max<Tokens>(request.input_tokens, 0)));
  Tokens left = request.input_tokens;
  for (std::uint64_t id : request.block_ids) {
    if (left <= 0) break;
    const Tokens n = std::min(left, block_tokens);
    AppendStream(kBlockStream, id, options.seed, n, options.vocab_size, tokens);
    left -= n;
  }
  if (left > 0)
    AppendStream(kRequestStream, request.id, options.seed, left, options.vocab_size, tokens);
  return tokens;
}

}  // namespace duet::traces
