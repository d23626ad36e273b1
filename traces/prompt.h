// Prompt token ids for replaying a trace against a real server (`duet replay`). Traces carry
// lengths and prefix identity (block ids) but no text, so every trace block maps to a
// deterministic pseudo-random token sequence seeded by its block id and the run's seed: equal
// block-id prefixes give equal token prefixes, and a server's prefix cache sees the sharing the
// simulator models. Pure C++ (STL only).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "traces/trace.h"

namespace duet::traces {

// Token ids below this are never used: tokenizers keep their lowest ids for special tokens
// (<unk>, <s>, </s>, padding), which a prompt should not contain by accident.
inline constexpr std::int32_t kFirstPromptTokenId = 16;

struct PromptOptions {
  std::int32_t vocab_size = 32000;  // ids are drawn from [kFirstPromptTokenId, vocab_size)
  std::uint64_t seed = 1;           // another seed gives every prompt other tokens
};

// Error unless vocab_size > kFirstPromptTokenId.
Status CheckPromptOptions(const PromptOptions& options);

// The prompt of `request`: exactly request.input_tokens ids. Token i of block b
// (b = i / block_tokens) depends only on (block_ids[b], i % block_tokens, seed), so two
// requests whose block ids agree on a prefix agree on those blocks' tokens (a partial last
// block is a prefix of the full block). Tokens past the blocks the ids cover (all of them for
// a trace without block ids, e.g. Azure) depend on (request.id, position, seed): unique to the
// request, so they never share a prefix with another request by accident.
// Needs CheckPromptOptions(options).ok() and block_tokens > 0.
std::vector<std::int32_t> BuildPrompt(const TraceRequest& request, Tokens block_tokens,
                                      const PromptOptions& options);

}  // namespace duet::traces
