// The OpenAI API as `duet serve` speaks it: request bodies of /v1/completions and
// /v1/chat/completions parsed and validated into GenerationParams (every field OpenAI's client
// sends, plus vLLM's extensions top_k, ignore_eos, stop_token_ids, skip_special_tokens), and the
// OpenAI error body. Pure functions of their input (JSON in, values or an ApiError out): no
// tokenizer and no model here; backend/serve/api.h turns GenerationParams into a LiveRequest.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/tokenizer/chat_template.h"
#include "common/units.h"

namespace duet::backend::serve {

// A request the server refuses, as OpenAI reports it: HTTP status and
// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;
  int retry_after_s = 0;  // > 0: a Retry-After header (429)
};
nlohmann::json ErrorJson(const ApiError& error);

// Serialized JSON that never throws: bytes that are not UTF-8 (a parse error quoting the
// client's input, say) become U+FFFD instead of an exception.
template <typename Json>
std::string DumpJson(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}
std::string ErrorBody(const ApiError& error);  // ErrorJson, serialized

// Shorthands for the common errors.
ApiError BadRequest(std::string message, std::string param = "", std::string code = "");
ApiError NotFound(std::string message, std::string param = "", std::string code = "");

enum class Endpoint { kCompletions, kChatCompletions };

// One validated generation request. Exactly one of prompt_text, prompt_ids (completions) or
// messages (chat) is set.
struct GenerationParams {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // "" when the client named none (the served model is meant)
  std::optional<std::string> prompt_text;
  std::vector<std::int32_t> prompt_ids;  // a prompt given as token ids
  std::vector<ChatMessage> messages;     // chat; "developer" is given as "system"
  std::optional<Tokens> max_tokens;      // absent: as many as fit in the context
  float temperature = 1.0f;              // OpenAI's default
  float top_p = 1.0f;
  std::int32_t top_k = 0;  // 0: off (-1, vLLM's "off", is read as 0)
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;             // stop strings, none empty
  std::vector<std::int32_t> stop_token_ids;  // the client's, besides the model's EOS ids
  bool ignore_eos = false;                   // drop the model's (and chat template's) stop ids
  bool skip_special_tokens = true;           // leave special tokens out of the text
  bool stream = false;
  bool stream_given = false;  // "stream" was in the body (WebSocket requests default to true)
  bool include_usage = false;
  // vLLM's extension: with include_usage, every streamed chunk carries the usage so far.
  bool continuous_usage_stats = false;
  bool stream_options_given = false;  // refused unless the request streams (api.h decides)
  // vLLM's extension: each choice carries the ids of its tokens ("token_ids"), so a client can
  // continue the conversation with exactly the tokens generated (duet replay's sessions).
  bool return_token_ids = false;
};

// Limits on what a request may ask for (beyond the model's own, checked later).
inline constexpr std::size_t kMaxStopStrings = 16;
inline constexpr std::size_t kMaxStopStringBytes = 512;
inline constexpr std::size_t kMaxStopTokenIds = 256;

// Parses a request body. Errors (400, naming the field): malformed JSON, a body that is not an
// object, missing required fields, wrong types, out-of-range values, unknown fields, and
// fields Duet does not support (n other than 1, logprobs, best_of, tools, response_format
// other than text, ...). Harmless fields (user, metadata, store, ...) are accepted and ignored.
// `ignore_keys` are accepted and skipped (the WebSocket envelope's "endpoint").
std::optional<ApiError> ParseGenerationBody(Endpoint endpoint, std::string_view body,
                                            GenerationParams* out,
                                            const std::vector<std::string>& ignore_keys = {});
std::optional<ApiError> ParseGenerationRequest(Endpoint endpoint, const nlohmann::json& body,
                                               GenerationParams* out,
                                               const std::vector<std::string>& ignore_keys = {});

}  // namespace duet::backend::serve
