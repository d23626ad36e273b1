// OpenAI endpoint semantics over LiveFrontend: request building (tokenization exactly as
// `duet generate` does it, so greedy output matches it), admission errors, and the per-request
// pump that turns engine tokens into reply parts on the connection's strand.
#include "backend/serve/api.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "backend/tokenizer/unicode_util.h"
#include "policies/block_hash.h"

namespace duet::backend::serve {

using nlohmann::json;

Result<std::shared_ptr<ServedModel>> MakeServedModel(const LoadedModel& loaded, std::string name) {
  if (loaded.tokenizer_json_path.empty()) return Status::Error(loaded.dir + ": no tokenizer.json");
  auto tokenizer = Tokenizer::Load(loaded.tokenizer_json_path);
  if (!tokenizer) return tokenizer.status();
  auto model = std::make_shared<ServedModel>(std::move(name), *tokenizer);
  if (auto format = DetectChatFormat(*tokenizer, loaded.tokenizer_config_path)) {
    model->chat_format = *format;
    model->chat_stop_token_ids = StopTokenIds(*format, *tokenizer);
  } else {
    model->chat_format_error = format.error();
  }
  for (std::int64_t id : loaded.config.eos_token_ids)
    model->eos_token_ids.push_back(static_cast<std::int32_t>(id));
  model->vocab_size = loaded.config.vocab_size;
  model->max_request_tokens = loaded.config.max_position_embeddings;
  return model;
}

Result<std::vector<Seconds>> TimeFrontendPath(const ServedModel& model, Tokens prompt_tokens,
                                              Tokens block_tokens, int repeats) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(std::max<Tokens>(prompt_tokens, 1)));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] =
        static_cast<std::int32_t>((i * 7919 + 13) % static_cast<std::size_t>(model.vocab_size));
  const std::string body = DumpJson(json{{"model", model.name},
                                         {"prompt", ids},
                                         {"max_tokens", 1},
                                         {"stream", true},
                                         {"stream_options", {{"include_usage", true}}}});
  std::vector<Seconds> seconds;
  for (int run = 0; run <= repeats; ++run) {
    const auto start = std::chrono::steady_clock::now();
    GenerationParams params;
    if (auto error = ParseGenerationBody(Endpoint::kCompletions, body, &params))
      return Status::Error(error->message);
    LiveRequest request;
    if (auto error = BuildLiveRequest(params, model, &request))
      return Status::Error(error->message);
    const auto hashes = policies::TokenBlockHashes(request.prompt, block_tokens);
    if (run > 0)
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

std::string ModelsJson(const ServedModel& model) {
  json entry = {{"id", model.name},
                {"object", "model"},
                {"created", model.created},
                {"owned_by", "duet"},
                {"root", model.name},
                {"parent", nullptr},
                {"max_model_len", model.max_request_tokens}};
  return DumpJson(json{{"object", "list"}, {"data", json::array({entry})}});
}

std::optional<ApiError> BuildLiveRequest(const GenerationParams& params, const ServedModel& model,
                                         LiveRequest* out) {
  if (!params.model.empty() && params.model != model.name) {
    return NotFound(
        "The model `" + params.model + "` does not exist (this server serves `" + model.name + "`)",
        "model", "model_not_found");
  }
  const bool chat = params.endpoint == Endpoint::kChatCompletions;
  const char* prompt_field = chat ? "messages" : "prompt";
  *out = LiveRequest();
  if (chat) {
    if (!model.chat_format) {
      return BadRequest("this model has no chat template Duet can apply (" +
                            model.chat_format_error + "); use /v1/completions",
                        "messages");
    }
    // As `duet generate --chat` and vLLM do: the rendered conversation is encoded with its
    // special tokens parsed (the template's own markers among them).
    const std::string text = ApplyChatTemplate(*model.chat_format, params.messages,
                                               /*add_generation_prompt=*/true);
    out->prompt = model.tokenizer.Encode(text, /*add_bos=*/false);
  } else if (params.prompt_text) {
    out->prompt = model.tokenizer.Encode(*params.prompt_text, /*add_bos=*/true);
  } else {
    out->prompt = params.prompt_ids;
    for (std::size_t i = 0; i < out->prompt.size(); ++i) {
      if (out->prompt[i] >= model.vocab_size) {
        return BadRequest("'prompt[" + std::to_string(i) + "]': token id " +
                              std::to_string(out->prompt[i]) + " is outside the vocabulary (0.." +
                              std::to_string(model.vocab_size - 1) + ")",
                          "prompt");
      }
    }
  }
  if (out->prompt.empty()) return BadRequest("the prompt encodes to no tokens", prompt_field);

  const auto prompt_tokens = static_cast<Tokens>(out->prompt.size());
  if (prompt_tokens >= model.max_request_tokens) {
    return BadRequest("This model's maximum context length is " +
                          std::to_string(model.max_request_tokens) +
                          " tokens, but the prompt has " + std::to_string(prompt_tokens) +
                          " tokens (at least one token must be left to generate)",
                      prompt_field, "context_length_exceeded");
  }
  if (params.max_tokens) {
    if (prompt_tokens + *params.max_tokens > model.max_request_tokens) {
      return BadRequest("This model's maximum context length is " +
                            std::to_string(model.max_request_tokens) + " tokens; you requested " +
                            std::to_string(prompt_tokens + *params.max_tokens) + " tokens (" +
                            std::to_string(prompt_tokens) + " in the prompt, " +
                            std::to_string(*params.max_tokens) +
                            " for the completion). Reduce the prompt or max_tokens",
                        "max_tokens", "context_length_exceeded");
    }
    out->max_tokens = *params.max_tokens;
  } else {
    out->max_tokens = model.max_request_tokens - prompt_tokens;
  }

  policies::SamplingParams& s = out->sampling;
  s.temperature = params.temperature;
  s.top_p = params.top_p;
  s.top_k = params.top_k;
  s.seed = params.seed;
  s.stop_strings = params.stop;
  // In the engine's types now: a value the parser took as a double may not survive the
  // conversion (top_p 1e-300 is 0 as a float).
  if (auto problem = policies::CheckSampling(s))
    return BadRequest("'" + problem->field + "' " + problem->message, problem->field);
  if (!params.ignore_eos) {
    s.stop_token_ids = model.eos_token_ids;
    if (chat)
      s.stop_token_ids.insert(s.stop_token_ids.end(), model.chat_stop_token_ids.begin(),
                              model.chat_stop_token_ids.end());
  }
  for (std::size_t i = 0; i < params.stop_token_ids.size(); ++i) {
    const std::int32_t id = params.stop_token_ids[i];
    if (id >= model.vocab_size) {
      return BadRequest("'stop_token_ids[" + std::to_string(i) + "]': token id " +
                            std::to_string(id) + " is outside the vocabulary (0.." +
                            std::to_string(model.vocab_size - 1) + ")",
                        "stop_token_ids");
    }
    s.stop_token_ids.push_back(id);
  }
  std::sort(s.stop_token_ids.begin(), s.stop_token_ids.end());
  s.stop_token_ids.erase(std::unique(s.stop_token_ids.begin(), s.stop_token_ids.end()),
                         s.stop_token_ids.end());
  return std::nullopt;
}

ApiError AdmissionError(const Admission& admission) {
  switch (admission.status) {
    case AdmitStatus::kInvalid:
      return BadRequest(admission.message);
    case AdmitStatus::kTooLong:
      return BadRequest(admission.message, "max_tokens", "context_length_exceeded");
    case AdmitStatus::kQueueFull: {
      ApiError e{
          429, "the server has too many requests in flight: " + admission.message + "; retry later",
          "rate_limit_error", "", "rate_limit_exceeded"};
      e.retry_after_s = 1;
      return e;
    }
    case AdmitStatus::kDraining:
      return ApiError{503, "the server is shutting down", "service_unavailable", "",
                      "server_draining"};
    case AdmitStatus::kAccepted:
      break;
  }
  return ApiError{500, "internal error: admission accepted", "internal_error", "", ""};
}

// The engine thread's side of a call: tokens and the finish wait here for the strand.
struct GenerationCall::Mailbox {
  std::mutex mutex;
  std::vector<std::int32_t> tokens;
  std::optional<FinishInfo> finish;
  bool pump_posted = false;
  bool closed = false;  // the call is gone or cancelled: drop everything
};

class GenerationCall::Listener final : public RequestListener {
 public:
  Listener(std::shared_ptr<Mailbox> mailbox, std::weak_ptr<GenerationCall> call, Post post)
      : mailbox_(std::move(mailbox)), call_(std::move(call)), post_(std::move(post)) {}

  void OnToken(std::int32_t token) override {
    bool post = false;
    {
      std::lock_guard<std::mutex> lock(mailbox_->mutex);
      if (mailbox_->closed) return;
      mailbox_->tokens.push_back(token);
      post = !std::exchange(mailbox_->pump_posted, true);
    }
    if (post) SchedulePump();
  }
  void OnFinished(const FinishInfo& info) override {
    bool post = false;
    {
      std::lock_guard<std::mutex> lock(mailbox_->mutex);
      if (mailbox_->closed) return;
      mailbox_->finish = info;
      post = !std::exchange(mailbox_->pump_posted, true);
    }
    if (post) SchedulePump();
  }

 private:
  // One pump in flight at a time: tokens that arrive meanwhile ride along with it, so a slow
  // connection costs one queued task, not one per token.
  void SchedulePump() {
    post_([call = call_] {
      if (auto c = call.lock()) c->Pump();
    });
  }
  std::shared_ptr<Mailbox> mailbox_;
  std::weak_ptr<GenerationCall> call_;
  Post post_;
};

GenerationCall::GenerationCall(const GenerationParams& params,
                               std::shared_ptr<const ServedModel> model, Deliver deliver)
    : model_(std::move(model)),
      deliver_(std::move(deliver)),
      mailbox_(std::make_shared<Mailbox>()),
      formatter_(params.endpoint,
                 NewReplyId(params.endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-"),
                 static_cast<std::int64_t>(std::time(nullptr)), model_->name,
                 params.stream && params.include_usage, params.return_token_ids),
      text_(model_->tokenizer, params.stop, params.skip_special_tokens),
      stream_(params.stream),
      include_usage_(params.stream && params.include_usage),
      continuous_usage_(include_usage_ && params.continuous_usage_stats),
      return_token_ids_(params.return_token_ids) {}

std::variant<std::shared_ptr<GenerationCall>, ApiError> GenerationCall::Start(
    const GenerationParams& params, std::shared_ptr<const ServedModel> model, Post post,
    Deliver deliver, std::chrono::steady_clock::time_point received) {
  if (params.stream_options_given && !params.stream)
    return BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options");
  LiveRequest request;
  if (auto error = BuildLiveRequest(params, *model, &request)) return *error;
  request.received = received;
  LiveFrontend* frontend = model->frontend;
  const std::size_t request_prompt_tokens = request.prompt.size();
  std::shared_ptr<GenerationCall> call(
      new GenerationCall(params, std::move(model), std::move(deliver)));
  auto listener = std::make_shared<Listener>(call->mailbox_, call, std::move(post));
  const Admission admission = frontend->Submit(std::move(request), std::move(listener));
  if (admission.status != AdmitStatus::kAccepted) {
    call->finished_ = true;  // nothing in flight to cancel
    return AdmissionError(admission);
  }
  call->id_ = admission.id;
  call->prompt_tokens_ = static_cast<Tokens>(request_prompt_tokens);
  if (call->stream_ && params.endpoint == Endpoint::kChatCompletions)
    call->deliver_({call->formatter_.RoleChunk(), false, 200, false});
  return call;
}

GenerationCall::~GenerationCall() {
  // No Abort here: a call is destroyed without Cancel only when the server is torn down,
  // after which the frontend aborts what is left itself.
  std::lock_guard<std::mutex> lock(mailbox_->mutex);
  mailbox_->closed = true;
}

void GenerationCall::Cancel() {
  if (finished_ || cancelled_) return;
  cancelled_ = true;
  {
    std::lock_guard<std::mutex> lock(mailbox_->mutex);
    mailbox_->closed = true;
    mailbox_->tokens.clear();
  }
  model_->frontend->Abort(id_);
}

void GenerationCall::Pump() {
  std::vector<std::int32_t> tokens;
  std::optional<FinishInfo> finish;
  {
    std::lock_guard<std::mutex> lock(mailbox_->mutex);
    tokens.swap(mailbox_->tokens);
    finish.swap(mailbox_->finish);
    mailbox_->pump_posted = false;
  }
  if (finished_ || cancelled_) return;
  std::string text;
  for (std::int32_t token : tokens) {
    // A token after a stop string's match is not counted, nor returned.
    if (return_token_ids_ && !text_.stopped()) ids_.push_back(token);
    text += text_.Push(token);
    if (text_.stopped() && !aborted_for_stop_) {
      // The stop string ends the request here; the engine frees its blocks at the next step
      // boundary and reports kAbort, which this call turns into finish_reason "stop".
      aborted_for_stop_ = true;
      model_->frontend->Abort(id_);
    }
  }
  if (stream_) {
    if (!text.empty()) {
      const Usage so_far = UsageSoFar();
      deliver_({formatter_.TextChunk(text, continuous_usage_ ? &so_far : nullptr, ids_), false, 200,
                false});
      ids_.clear();
    }
  } else {
    whole_text_ += text;
  }
  if (finish) Finish(*finish);
}

Usage GenerationCall::UsageSoFar() const {
  Usage usage;
  usage.prompt_tokens = prompt_tokens_;
  usage.completion_tokens = text_.counted_tokens();
  return usage;
}

namespace {

// What a client gets for a request the engine ended with an error (a failed forward pass, a
// lost KV pull): a 500-class internal error.
ApiError EngineError(const FinishInfo& info) {
  return ApiError{500, "the request failed in the engine: " + info.message, "internal_error", "",
                  ""};
}

}  // namespace

void GenerationCall::Finish(const FinishInfo& info) {
  finished_ = true;
  const bool failed = info.reason == policies::FinishReason::kError && !aborted_for_stop_;
  if (failed && !stream_) {
    deliver_({ErrorBody(EngineError(info)), true, 500, false});
    return;
  }
  std::string reason = "stop";
  if (!aborted_for_stop_) {
    if (info.reason == policies::FinishReason::kLength) reason = "length";
    if (info.reason == policies::FinishReason::kAbort) reason = "abort";
  }
  const std::string tail = text_.Finish();
  DuetExtension duet;
  duet.frontend_ms = info.frontend_s * 1000.0;
  duet.queue_ms = info.queue_s >= 0 ? info.queue_s * 1000.0 : -1;
  duet.instance = info.instance;
  duet.prefill_done_ms = info.prefill_done_s >= 0 ? info.prefill_done_s * 1000.0 : -1;
  for (std::size_t k = 0; k < duet.tier_hit_tokens.size(); ++k)
    duet.tier_hit_tokens[k] = info.tier_hit_tokens[k];
  if (info.kv_transfer_s >= 0) {
    duet.kv_transfer_ms = info.kv_transfer_s * 1000.0;
    duet.kv_transfer_bytes = info.kv_transfer_bytes;
  }
  duet.kv_transfer_parts = info.kv_transfer_parts;
  if (failed) {
    // The stream began with a 200: its last choice chunk says "error" (vLLM's finish reason for
    // a request that failed in the engine), then the error itself follows as a chunk.
    deliver_({formatter_.FinishChunk(tail, "error", duet, nullptr, ids_), false, 200, false});
    deliver_({DumpJson(ErrorJson(EngineError(info))), false, 200, false});
    deliver_({std::string(kDone), true, 200, true});
    return;
  }
  Usage usage;
  usage.prompt_tokens = info.prompt_tokens;
  usage.completion_tokens = aborted_for_stop_ ? text_.counted_tokens() : info.completion_tokens;
  usage.cached_tokens = info.cached_tokens;
  if (!stream_) {
    deliver_(
        {formatter_.FullReply(whole_text_ + tail, reason, usage, duet, ids_), true, 200, false});
    return;
  }
  deliver_({formatter_.FinishChunk(tail, reason, duet, continuous_usage_ ? &usage : nullptr, ids_),
            false, 200, false});
  if (include_usage_) deliver_({formatter_.UsageChunk(usage, duet), false, 200, false});
  deliver_({std::string(kDone), true, 200, true});
}

std::string EscapeForLog(std::string_view text, std::size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 16);
  std::size_t i = 0;
  while (i < text.size() && i < max_bytes) {
    char32_t cp = 0;
    const std::size_t n = unicode::DecodeUtf8(text, i, &cp);
    if (n == 0) {  // not UTF-8: the byte, escaped
      const auto b = static_cast<unsigned char>(text[i]);
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
      i += 1;
      continue;
    }
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += "\\x";
      out += kHex[cp >> 4];
      out += kHex[cp & 15];
    } else if (cp >= 0x80 && cp <= 0x9F) {  // C1 controls: some terminals act on them
      out += "\\u00";
      out += kHex[cp >> 4];
      out += kHex[cp & 15];
    } else {
      out.append(text.substr(i, n));
    }
    i += n;
  }
  if (i < text.size()) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

void LogRequestError(int status, const std::string& method, const std::string& target,
                     const std::string& message) {
  // Method and target come from the request line, the message may quote the body's values.
  const std::string line = "duet serve: " + std::to_string(status) + " " +
                           EscapeForLog(method, 32) + " " + EscapeForLog(target, 200) + ": " +
                           EscapeForLog(message, 1024) + "\n";
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::fputs(line.c_str(), stderr);
}

}  // namespace duet::backend::serve
