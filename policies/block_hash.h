// Maps a trace's prefix ids (one per trace block, e.g. 512 tokens in Mooncake) onto chained
// engine-block hashes (e.g. 16 tokens): block j's key covers its parent's key and its own
// content, so equal keys mean equal prefixes up to and including that block.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/units.h"
#include "policies/request.h"

namespace duet::policies {

// Hashes of the full engine blocks of a prompt of `input_tokens` tokens. Engine block j covers
// tokens [j*engine_block_tokens, (j+1)*engine_block_tokens); its content is named by the trace
// ids of the trace blocks it overlaps and its offset inside them. Blocks not fully covered by
// `trace_ids` (or past the prompt) are not hashed: the result may be shorter than the prompt.
std::vector<BlockHash> EngineBlockHashes(std::span<const std::uint64_t> trace_ids,
                                         Tokens trace_block_tokens, Tokens input_tokens,
                                         Tokens engine_block_tokens);

// Hashes of the full engine blocks of a tokenized prompt (the real backend's prefix identity):
// block j's key covers its parent's key and its tokens' ids.
std::vector<BlockHash> TokenBlockHashes(std::span<const std::int32_t> token_ids,
                                        Tokens engine_block_tokens);

// Appends to `hashes` until it names `blocks` blocks, each chained on the one before and salted
// with `salt`: content no other request shares (a session turn's new tokens, its output),
// though a later turn that continues it inherits the hashes.
void ExtendUniqueBlockHashes(std::vector<BlockHash>& hashes, std::uint64_t salt,
                             std::int64_t blocks);

}  // namespace duet::policies
