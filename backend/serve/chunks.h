// The JSON of OpenAI replies, streamed and not: completion and chat-completion chunks (role
// first, then content deltas, finish_reason null until the last), the usage chunk, whole
// replies, and Duet's "duet" extension field (queue_ms, instance) in the final chunk and in
// whole replies; with vLLM's return_token_ids, each choice also carries the ids of the tokens
// its text came from ("token_ids"); plus the SSE framing. Pure formatting: no I/O, no state beyond
// the reply's identity. Not thread-safe (one request's replies, from one thread).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "backend/serve/openai_protocol.h"
#include "policies/request.h"

namespace duet::backend::serve {

struct Usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
};

// Duet's extension: where the request was served, how long it queued, when its prefill ended
// and (PD) how long its KV took to reach the decode instance. < 0: unknown (null).
struct DuetExtension {
  double queue_ms = -1;         // arrival to first scheduled
  int instance = -1;            // the instance that finished it
  double prefill_done_ms = -1;  // arrival to the end of its prefill step
  double kv_transfer_ms = -1;   // PD: end of its prefill to its KV usable on the decode instance
  std::int64_t kv_transfer_bytes = -1;  // PD: the KV bytes that moved
  // Prompt tokens served from each KV tier below GPU memory (dram, ssd, remote).
  std::array<std::int64_t, 3> tier_hit_tokens{};
  double frontend_ms = -1;  // arrival to the hand-over to the engines (parsing, hashing)
  // PD: the transfer's parts (policies::KvTransferBreakdown): the KvReady message's way to the
  // decode instance, its wait there for the pull to start, the pull.
  std::optional<policies::KvTransferParts> kv_transfer_parts;
};

class ReplyFormatter {
 public:
  // `id` is the reply's id ("cmpl-..." / "chatcmpl-..."), `created` Unix seconds.
  // `token_ids`: choices carry "token_ids" (the ids given to each call below; ignored else).
  ReplyFormatter(Endpoint endpoint, std::string id, std::int64_t created, std::string model,
                 bool include_usage, bool token_ids = false);

  // Streamed chunks, each one JSON object (serialized):
  // chat only, first: the assistant role with empty content.
  std::string RoleChunk() const;
  // A piece of text, finish_reason null. `usage` (continuous usage stats, with include_usage):
  // the usage so far; else the chunk's usage is null.
  std::string TextChunk(std::string_view text, const Usage* usage = nullptr,
                        std::span<const std::int32_t> ids = {}) const;
  // The last choice chunk: the rest of the text (may be empty) and the finish reason. Carries
  // `duet` unless include_usage (then the usage chunk, which follows, does). `usage` as above.
  std::string FinishChunk(std::string_view text, std::string_view finish_reason,
                          const DuetExtension& duet, const Usage* usage = nullptr,
                          std::span<const std::int32_t> ids = {}) const;
  // include_usage: empty choices, the usage, and `duet`.
  std::string UsageChunk(const Usage& usage, const DuetExtension& duet) const;
  // Not streamed: the whole reply with usage and `duet`.
  std::string FullReply(std::string_view text, std::string_view finish_reason, const Usage& usage,
                        const DuetExtension& duet, std::span<const std::int32_t> ids = {}) const;

 private:
  nlohmann::ordered_json Envelope(bool chunk) const;
  // The text chunk's JSON is the same for every piece of text but the text: built once, it is
  // text_head_ + the text as a JSON string + text_tail_ (without the closing brace), so the
  // chunk of each token costs one string escape, not a JSON document.
  void BuildTextTemplate();
  nlohmann::ordered_json Choice(std::string_view text, const nlohmann::ordered_json& finish_reason,
                                bool role, bool chunk,
                                std::span<const std::int32_t> ids = {}) const;

  Endpoint endpoint_;
  std::string id_;
  std::int64_t created_;
  std::string model_;
  bool include_usage_;
  bool token_ids_;
  std::string text_head_, text_tail_;
};

nlohmann::ordered_json UsageJson(const Usage& usage);
nlohmann::ordered_json DuetJson(const DuetExtension& duet);

// Server-sent events: "data: <payload>\n\n"; the stream ends with SseData("[DONE]").
std::string SseData(std::string_view payload);
inline constexpr std::string_view kDone = "[DONE]";

// A reply id: prefix + 24 hex digits, unique within the process and unlikely to repeat
// across restarts (random start). Thread-safe.
std::string NewReplyId(std::string_view prefix);

}  // namespace duet::backend::serve
