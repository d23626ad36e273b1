// The OpenAI endpoints' semantics, independent of the transport (HTTP+SSE or WebSocket): the
// served model, turning validated GenerationParams into a LiveRequest (tokenization, chat
// template, context and vocabulary checks, stop settings), and GenerationCall, one accepted
// request's life from Submit to its last reply part. The transports (http_server.cpp) only
// frame the parts and move bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "backend/frontend/frontend.h"
#include "backend/model/llama_weights.h"
#include "backend/serve/chunks.h"
#include "backend/serve/live_metrics.h"
#include "backend/serve/openai_protocol.h"
#include "backend/serve/output_text.h"
#include "backend/tokenizer/chat_template.h"
#include "backend/tokenizer/tokenizer.h"

namespace duet::backend::serve {

// The model being served. Built once the model is loaded and immutable after that; shared
// (read-only, any thread) by every connection. Does not own the frontend or the metrics.
struct ServedModel {
  ServedModel(std::string served_name, Tokenizer model_tokenizer)
      : name(std::move(served_name)), tokenizer(std::move(model_tokenizer)) {}

  std::string name;  // what clients pass as "model"
  Tokenizer tokenizer;
  std::optional<ChatFormat> chat_format;          // absent: /v1/chat/completions answers 400
  std::string chat_format_error;                  // why it is absent
  std::vector<std::int32_t> eos_token_ids;        // config.json's eos_token_id(s)
  std::vector<std::int32_t> chat_stop_token_ids;  // the chat template's end-of-turn tokens
  std::int32_t vocab_size = 0;                    // token ids must be below this
  Tokens max_request_tokens = 0;                  // prompt + max_tokens, at most
  std::int64_t created = 0;                       // Unix seconds the server started
  LiveFrontend* frontend = nullptr;
  LiveMetrics* metrics = nullptr;
};

// The served model of a loaded model directory, named `name`: its tokenizer, chat format (or why
// it has none), end-of-sequence ids, vocabulary size and context (max_request_tokens; the
// server lowers it to what its instances admit). Errors: no tokenizer.json, or a bad one.
Result<std::shared_ptr<ServedModel>> MakeServedModel(const LoadedModel& loaded, std::string name);

// GET /v1/models.
std::string ModelsJson(const ServedModel& model);

// The LiveRequest for `params` (the prompt tokenized, sampling and stop ids set, max_tokens
// defaulted to what fits), or the 4xx that refuses it: an unknown model (404), a prompt
// that is empty, has ids outside the vocabulary or does not fit the context, a max_tokens that
// does not fit, a chat request to a model without a chat format.
std::optional<ApiError> BuildLiveRequest(const GenerationParams& params, const ServedModel& model,
                                         LiveRequest* out);

// The frontend's time for one request of `prompt_tokens` token ids, `repeats` times (each
// in seconds; `duet calibrate` fits models::FrontendFit to them): the server's own path from
// a /v1/completions body as `duet replay` sends it (token ids, streamed) to the request the
// engines get: parsing the body, BuildLiveRequest and hashing the prompt's blocks of
// `block_tokens`. The first run is untimed. Errors: a prompt `model` refuses.
Result<std::vector<Seconds>> TimeFrontendPath(const ServedModel& model, Tokens prompt_tokens,
                                              Tokens block_tokens, int repeats);

// The API error for a refused Submit.
ApiError AdmissionError(const Admission& admission);

// One part of a reply, in order: streamed chunks' JSON then "[DONE]" (last), or a whole
// reply's JSON (last; http_status 200, or 500 when the engine failed the request).
struct ReplyPart {
  std::string payload;
  bool last = false;
  int http_status = 200;
  bool done_marker = false;  // payload is "[DONE]"
};

// One accepted request, from Submit to its last reply part. Lives on one serial executor (a
// connection's strand): Start, Cancel and every delivery run there. Engine-thread callbacks
// only queue tokens and post a pump onto that executor, so they never block and never touch
// the connection.
class GenerationCall {
 public:
  // Runs `task` later on the connection's serial executor (asio::post onto its strand).
  using Post = std::function<void(std::function<void()> task)>;
  using Deliver = std::function<void(ReplyPart part)>;

  // Validates and submits. On success the call delivers its parts through `deliver` (the chat
  // role chunk at once when streaming) until one is `last`. On refusal nothing was submitted.
  // `received`: when the transport got the request, its arrival (its frontend time runs from
  // there to the hand-over to the engines).
  static std::variant<std::shared_ptr<GenerationCall>, ApiError> Start(
      const GenerationParams& params, std::shared_ptr<const ServedModel> model, Post post,
      Deliver deliver, std::chrono::steady_clock::time_point received);
  ~GenerationCall();

  // The client went away: aborts the request in the engine (its KV blocks are freed) and
  // delivers nothing more. No effect once the last part was delivered.
  void Cancel();

 private:
  struct Mailbox;  // tokens and the finish, handed from the engine thread to the strand
  class Listener;

  GenerationCall(const GenerationParams& params, std::shared_ptr<const ServedModel> model,
                 Deliver deliver);
  void Pump();  // on the strand: turns queued tokens into reply parts
  void Finish(const FinishInfo& info);
  Usage UsageSoFar() const;  // continuous usage stats: tokens generated so far

  std::shared_ptr<const ServedModel> model_;
  Deliver deliver_;
  std::shared_ptr<Mailbox> mailbox_;
  ReplyFormatter formatter_;
  OutputText text_;
  bool stream_;
  bool include_usage_;
  bool continuous_usage_;  // every chunk carries the usage so far
  Tokens prompt_tokens_ = 0;
  std::string whole_text_;  // not streamed: the text so far
  bool return_token_ids_;
  // return_token_ids: ids of the tokens counted into the reply and not yet in a chunk (all of
  // them, not streamed); a chunk whose text is held back leaves its ids to the next one.
  std::vector<std::int32_t> ids_;
  policies::RequestId id_ = 0;
  bool aborted_for_stop_ = false;
  bool finished_ = false;
  bool cancelled_ = false;
};

// `text` made safe for one line of a log: control characters (C0, DEL, C1), backslashes and
// bytes that are not UTF-8 escaped (\n, \r, \t, \\, \xNN, \u0085), so that a client cannot
// forge a line or send escape codes to a terminal; cut after `max_bytes` bytes of the input
// with "...(N bytes)" naming the whole length, so that a long value costs a bounded line.
std::string EscapeForLog(std::string_view text, std::size_t max_bytes = 200);

// One line on stderr for a request that failed ("duet serve: 400 POST /v1/completions: ...").
// Every part goes through EscapeForLog (the message, which may quote client text, up to 1 KiB).
// Thread-safe.
void LogRequestError(int status, const std::string& method, const std::string& target,
                     const std::string& message);

}  // namespace duet::backend::serve
