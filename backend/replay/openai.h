// The OpenAI-compatible completions protocol as `duet replay` speaks it, without I/O: the
// endpoint URL, the request body, one streamed chunk (or a whole non-streamed reply), error
// bodies and the model list. Works with any OpenAI-compatible server (Duet, vLLM, SGLang);
// reads Duet's own additions ("duet": queue time, serving instance) when a server sends them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "policies/request.h"

namespace duet::backend::replay {

// "http://HOST[:PORT][/BASE]": plain HTTP (no TLS). Trailing "/v1" and "/" are dropped, since
// OpenAI clients' base URLs end with it and requests go to BASE + "/v1/...".
struct Endpoint {
  std::string url;        // normalized: "http://HOST:PORT" + base_path
  std::string host;       // name or address; an IPv6 address without brackets
  std::string port;       // "80" when the URL gives none
  std::string base_path;  // "" or "/prefix", no trailing slash
  std::string HostHeader() const;
  std::string Target(std::string_view path) const { return base_path + std::string(path); }
};
Result<Endpoint> ParseEndpoint(const std::string& url);

// The body of POST /v1/completions: the prompt as token ids, exactly max_tokens generated
// (ignore_eos), greedy, streamed with a final usage chunk. `return_token_ids`: asks for the
// generated tokens' ids (vLLM's and Duet's extension), which a later turn's prompt carries.
std::string CompletionRequestBody(const std::string& model, const std::vector<std::int32_t>& prompt,
                                  Tokens max_tokens, bool return_token_ids = false);

// What one "data:" payload of a completion stream (or a whole non-streamed reply) says.
struct CompletionChunk {
  bool done = false;  // the "[DONE]" sentinel; nothing else is set
  // A token event: a choice carries generated text or token ids, or is a chunk of a generating
  // stream with an empty piece (no finish_reason, not a chat's role-only delta: llama.cpp's
  // server streams a chunk per token and leaves the text of an incomplete UTF-8 piece empty).
  // A choice that only finishes (an empty piece with its finish_reason) is the stream's end, not
  // a token; a chunk without choices (usage) is neither.
  bool token_event = false;
  std::string finish_reason;            // "stop", "length", ...; empty while generating
  std::vector<std::int32_t> token_ids;  // the choices' "token_ids" (return_token_ids)
  std::optional<std::string> error;     // an error object in place of a chunk: its message
  // Usage (OpenAI "usage"; the last chunk with stream_options.include_usage).
  std::optional<Tokens> prompt_tokens, completion_tokens;
  std::optional<Tokens> cached_tokens;  // usage.prompt_tokens_details.cached_tokens
  // Duet's extension, a top-level "duet" object in the final chunk: arrival at the server to
  // the hand-over to the engines (the server's frontend time), arrival to the first prefill
  // step, the instance that served the request, arrival to the end of its prefill, and (PD)
  // the end of its prefill to its KV usable on the decode instance, and that time's parts.
  std::optional<double> duet_frontend_ms;
  std::optional<double> duet_queue_ms;
  std::optional<int> duet_instance;
  std::optional<double> duet_prefill_done_ms;
  std::optional<double> duet_kv_transfer_ms;
  std::optional<Tokens> duet_kv_transfer_bytes;
  std::optional<policies::KvTransferParts> duet_kv_transfer_parts;
  // Of the cached tokens, those the server loaded from each lower KV tier (dram, ssd, remote:
  // policies::TierKind's order), where it says.
  std::optional<std::array<Tokens, policies::kNumLowerTiers>> duet_tier_hit_tokens;

  // Takes each usage and "duet" field that `newer` reports (a stream spreads them over chunks:
  // the last report of each counts).
  void KeepReports(const CompletionChunk& newer);
};
// Errors say what is malformed (not JSON, a field of the wrong type) for the request's reason.
Result<CompletionChunk> ParseCompletionChunk(std::string_view data);

// One line describing an HTTP error reply's body: the JSON error message ({"error":
// {"message"}}, {"message"}, {"detail"}) or the start of the text: at most `max_chars` bytes
// of it, control characters replaced by spaces, bytes that are not valid UTF-8 written as
// \xNN escapes (common/text.h's Excerpt).
std::string DescribeErrorBody(std::string_view body, std::size_t max_chars = 160);

// The first model id of a GET /v1/models reply ({"data": [{"id": ...}, ...]}).
Result<std::string> ParseFirstModelId(std::string_view body);

}  // namespace duet::backend::replay
