// Parsing and validation of OpenAI request bodies: one table of the fields each endpoint
// takes, each with its type check; anything outside the table is refused naming the field, so
// a client never has a setting silently ignored that would have changed its output.
#include "backend/serve/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>

namespace duet::backend::serve {
namespace {

using nlohmann::json;

const char* TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

ApiError WrongType(const std::string& field, const char* expected, const json& v) {
  return BadRequest("'" + field + "' must be " + expected + ", not " + TypeName(v), field);
}

ApiError Unsupported(const std::string& field, const std::string& what) {
  return BadRequest("'" + field + "' is not supported by this server: " + what, field,
                    "unsupported_parameter");
}

using Error = std::optional<ApiError>;

std::string FormatNumber(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

Error ReadBool(const json& v, const std::string& field, bool* out) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_boolean()) return WrongType(field, "a boolean", v);
  *out = v.get<bool>();
  return std::nullopt;
}

Error ReadNumber(const json& v, const std::string& field, double lo, double hi, bool lo_open,
                 double* out) {
  if (!v.is_number()) return WrongType(field, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    return BadRequest("'" + field + "' must be in " + (lo_open ? "(" : "[") + FormatNumber(lo) +
                          ", " + FormatNumber(hi) + "], got " + DumpJson(v),
                      field);
  }
  *out = x;
  return std::nullopt;
}

Error ReadInt(const json& v, const std::string& field, std::int64_t lo, std::int64_t hi,
              std::int64_t* out) {
  if (!v.is_number_integer()) return WrongType(field, "an integer", v);
  // Integers beyond int64 arrive as unsigned; beyond uint64 nlohmann makes them floats.
  if (v.is_number_unsigned() &&
      v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return BadRequest("'" + field + "' is out of range: " + DumpJson(v), field);
  const std::int64_t x = v.get<std::int64_t>();
  if (x < lo || x > hi) {
    return BadRequest("'" + field + "' must be in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "], got " + std::to_string(x),
                      field);
  }
  *out = x;
  return std::nullopt;
}

Error ReadTokenIds(const json& v, const std::string& field, std::vector<std::int32_t>* out) {
  if (!v.is_array()) return WrongType(field, "an array of token ids", v);
  out->clear();
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::int64_t id = 0;
    if (Error e = ReadInt(v[i], field + "[" + std::to_string(i) + "]", 0,
                          std::numeric_limits<std::int32_t>::max(), &id))
      return e;
    out->push_back(static_cast<std::int32_t>(id));
  }
  return std::nullopt;
}

Error ReadStop(const json& v, std::vector<std::string>* out) {
  out->clear();
  if (v.is_null()) return std::nullopt;
  auto add = [&](const json& s, const std::string& field) -> Error {
    if (!s.is_string()) return WrongType(field, "a string", s);
    std::string text = s.get<std::string>();
    if (text.empty()) return BadRequest("'" + field + "' is an empty stop string", "stop");
    if (text.size() > kMaxStopStringBytes)
      return BadRequest(
          "'" + field + "' is longer than " + std::to_string(kMaxStopStringBytes) + " bytes",
          "stop");
    out->push_back(std::move(text));
    return std::nullopt;
  };
  if (v.is_string()) return add(v, "stop");
  if (!v.is_array()) return WrongType("stop", "a string or an array of strings", v);
  if (v.size() > kMaxStopStrings)
    return BadRequest("'stop' has " + std::to_string(v.size()) + " strings; at most " +
                          std::to_string(kMaxStopStrings) + " are allowed",
                      "stop");
  for (std::size_t i = 0; i < v.size(); ++i)
    if (Error e = add(v[i], "stop[" + std::to_string(i) + "]")) return e;
  return std::nullopt;
}

// completions "prompt": a string, a list of token ids, or a list holding one of those; a list
// of several prompts is refused (one completion per request here).
Error ReadPrompt(const json& v, GenerationParams* out) {
  if (v.is_string()) {
    out->prompt_text = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array())
    return WrongType("prompt", "a string, an array of token ids or an array of one of those", v);
  if (v.empty()) return BadRequest("'prompt' is empty", "prompt");
  if (v[0].is_number()) {
    if (Error e = ReadTokenIds(v, "prompt", &out->prompt_ids)) return e;
    return std::nullopt;
  }
  if (v.size() > 1) {
    return BadRequest("'prompt' holds " + std::to_string(v.size()) +
                          " prompts; this server takes one prompt per request",
                      "prompt");
  }
  if (v[0].is_string()) {
    out->prompt_text = v[0].get<std::string>();
    return std::nullopt;
  }
  if (v[0].is_array()) {
    if (v[0].empty()) return BadRequest("'prompt[0]' is empty", "prompt");
    return ReadTokenIds(v[0], "prompt[0]", &out->prompt_ids);
  }
  return WrongType("prompt[0]", "a string or an array of token ids", v[0]);
}

Error ReadMessages(const json& v, GenerationParams* out) {
  if (!v.is_array()) return WrongType("messages", "an array of message objects", v);
  if (v.empty()) return BadRequest("'messages' is empty", "messages");
  out->messages.clear();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) return WrongType(where, "an object", m);
    ChatMessage message;
    bool has_content = false;
    for (const auto& [key, value] : m.items()) {
      const std::string field = where + "." + key;
      if (key == "role") {
        if (!value.is_string()) return WrongType(field, "a string", value);
        message.role = value.get<std::string>();
        if (message.role == "developer") message.role = "system";
        if (message.role != "system" && message.role != "user" && message.role != "assistant") {
          return BadRequest("'" + field + "' must be system, developer, user or assistant, got " +
                                DumpJson(value),
                            "messages");
        }
      } else if (key == "content") {
        has_content = true;
        if (value.is_string()) {
          message.content = value.get<std::string>();
        } else if (value.is_array()) {
          // Text parts, joined with newlines as vLLM does.
          for (std::size_t p = 0; p < value.size(); ++p) {
            const std::string part = field + "[" + std::to_string(p) + "]";
            const json& item = value[p];
            if (!item.is_object()) return WrongType(part, "an object", item);
            if (!item.contains("type") || item["type"] != "text")
              return Unsupported(part + ".type", "only text content parts are supported");
            if (!item.contains("text") || !item["text"].is_string())
              return WrongType(part + ".text", "a string",
                               item.contains("text") ? item["text"] : json());
            if (p > 0) message.content += "\n";
            message.content += item["text"].get<std::string>();
          }
        } else {
          return WrongType(field, "a string or an array of text parts", value);
        }
      } else if (key == "name") {
        if (!value.is_string()) return WrongType(field, "a string", value);  // accepted, unused
      } else if (key == "tool_calls" || key == "tool_call_id" || key == "function_call" ||
                 key == "audio" || key == "refusal") {
        if (!value.is_null()) return Unsupported(field, "tools, audio and refusals are not");
      } else {
        return BadRequest("Unrecognized field '" + field + "'", "messages");
      }
    }
    if (message.role.empty()) return BadRequest("'" + where + ".role' is missing", "messages");
    if (!has_content) return BadRequest("'" + where + ".content' is missing", "messages");
    out->messages.push_back(std::move(message));
  }
  return std::nullopt;
}

Error ReadStreamOptions(const json& v, GenerationParams* out) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_object()) return WrongType("stream_options", "an object", v);
  for (const auto& [key, value] : v.items()) {
    const std::string field = "stream_options." + key;
    if (key == "include_usage") {
      if (Error e = ReadBool(value, field, &out->include_usage)) return e;
    } else if (key == "continuous_usage_stats") {
      if (Error e = ReadBool(value, field, &out->continuous_usage_stats)) return e;
    } else if (key == "include_obfuscation") {
      bool unused = false;  // OpenAI pads chunks against side channels; nothing to pad here
      if (Error e = ReadBool(value, field, &unused)) return e;
    } else {
      return BadRequest("Unrecognized field '" + field + "'", field);
    }
  }
  return std::nullopt;
}

// Must be null or a value that changes nothing (`neutral` says what that is).
Error RequireNeutral(const json& v, const std::string& field, const std::string& what,
                     const std::function<bool(const json&)>& neutral) {
  if (v.is_null() || neutral(v)) return std::nullopt;
  return Unsupported(field, what);
}

bool IsZero(const json& v) { return v.is_number() && v.get<double>() == 0; }
bool IsFalse(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsEmpty(const json& v) { return (v.is_array() || v.is_object()) && v.empty(); }
bool IsOne(const json& v) { return v.is_number_integer() && v.get<std::int64_t>() == 1; }

using FieldReader = std::function<Error(const json& value, GenerationParams* out)>;

// The fields both endpoints take.
std::map<std::string, FieldReader> CommonFields() {
  std::map<std::string, FieldReader> f;
  f["model"] = [](const json& v, GenerationParams* out) -> Error {
    if (v.is_null()) return std::nullopt;
    if (!v.is_string()) return WrongType("model", "a string", v);
    out->model = v.get<std::string>();
    return std::nullopt;
  };
  f["max_tokens"] = [](const json& v, GenerationParams* out) -> Error {
    if (v.is_null()) return std::nullopt;
    std::int64_t n = 0;
    if (Error e = ReadInt(v, "max_tokens", 1, std::numeric_limits<std::int32_t>::max(), &n))
      return e;
    if (!out->max_tokens) out->max_tokens = n;  // max_completion_tokens wins when both are given
    return std::nullopt;
  };
  f["temperature"] = [](const json& v, GenerationParams* out) -> Error {
    if (v.is_null()) return std::nullopt;
    double x = 0;
    if (Error e = ReadNumber(v, "temperature", 0, 2, false, &x)) return e;
    out->temperature = static_cast<float>(x);
    return std::nullopt;
  };
  f["top_p"] = [](const json& v, GenerationParams* out) -> Error {
    if (v.is_null()) return std::nullopt;
    double x = 0;
    if (Error e = ReadNumber(v, "top_p", 0, 1, true, &x)) return e;
    out->top_p = static_cast<float>(x);
    return std::nullopt;
  };
  f["top_k"] = [](const json& v, GenerationParams* out) -> Error {
    if (v.is_null()) return std::nullopt;
    std::int64_t k = 0;
    if (Error e = ReadInt(v, "top_k", -1, std::numeric_limits<std::int32_t>::max(), &k)) return e;
    out->top_k = k < 0 ? 0 : static_cast<std::int32_t>(k);
    return std::nullopt;
  };
  f["seed"] = [](const json& v, GenerationParams* out) -> Error {
    if (v.is_null()) return std::nullopt;
    std::int64_t seed = 0;
    if (Error e = ReadInt(v, "seed", std::numeric_limits<std::int64_t>::min(),
                          std::numeric_limits<std::int64_t>::max(), &seed))
      return e;
    out->seed = static_cast<std::uint64_t>(seed);
    return std::nullopt;
  };
  f["stop"] = [](const json& v, GenerationParams* out) { return ReadStop(v, &out->stop); };
  f["stop_token_ids"] = [](const json& v, GenerationParams* out) -> Error {
    if (v.is_null()) return std::nullopt;
    if (Error e = ReadTokenIds(v, "stop_token_ids", &out->stop_token_ids)) return e;
    if (out->stop_token_ids.size() > kMaxStopTokenIds)
      return BadRequest(
          "'stop_token_ids' has more than " + std::to_string(kMaxStopTokenIds) + " ids",
          "stop_token_ids");
    return std::nullopt;
  };
  f["ignore_eos"] = [](const json& v, GenerationParams* out) {
    return ReadBool(v, "ignore_eos", &out->ignore_eos);
  };
  f["return_token_ids"] = [](const json& v, GenerationParams* out) {
    return ReadBool(v, "return_token_ids", &out->return_token_ids);
  };
  f["skip_special_tokens"] = [](const json& v, GenerationParams* out) {
    return ReadBool(v, "skip_special_tokens", &out->skip_special_tokens);
  };
  f["stream"] = [](const json& v, GenerationParams* out) -> Error {
    if (v.is_null()) return std::nullopt;
    out->stream_given = true;
    return ReadBool(v, "stream", &out->stream);
  };
  f["stream_options"] = [](const json& v, GenerationParams* out) {
    return ReadStreamOptions(v, out);
  };
  f["n"] = [](const json& v, GenerationParams*) -> Error {
    if (!v.is_null() && !v.is_number_integer()) return WrongType("n", "an integer", v);
    return RequireNeutral(v, "n", "only n = 1 (one choice per request)", IsOne);
  };
  for (const char* penalty : {"frequency_penalty", "presence_penalty"}) {
    f[penalty] = [penalty](const json& v, GenerationParams*) -> Error {
      if (!v.is_null() && !v.is_number()) return WrongType(penalty, "a number", v);
      return RequireNeutral(v, penalty, "penalties are not implemented (only 0)", IsZero);
    };
  }
  f["logit_bias"] = [](const json& v, GenerationParams*) -> Error {
    if (!v.is_null() && !v.is_object()) return WrongType("logit_bias", "an object", v);
    return RequireNeutral(v, "logit_bias", "logit biases are not implemented", IsEmpty);
  };
  // Accepted and ignored: they change nothing in the output.
  for (const char* ignored :
       {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
        "prompt_cache_retention", "prompt_cache_options"}) {
    f[ignored] = [](const json&, GenerationParams*) -> Error { return std::nullopt; };
  }
  return f;
}

std::map<std::string, FieldReader> CompletionFields() {
  std::map<std::string, FieldReader> f = CommonFields();
  f["prompt"] = [](const json& v, GenerationParams* out) { return ReadPrompt(v, out); };
  f["best_of"] = [](const json& v, GenerationParams*) -> Error {
    if (!v.is_null() && !v.is_number_integer()) return WrongType("best_of", "an integer", v);
    return RequireNeutral(v, "best_of", "only best_of = 1", IsOne);
  };
  f["echo"] = [](const json& v, GenerationParams*) -> Error {
    if (!v.is_null() && !v.is_boolean()) return WrongType("echo", "a boolean", v);
    return RequireNeutral(v, "echo", "the prompt is not echoed", IsFalse);
  };
  f["logprobs"] = [](const json& v, GenerationParams*) -> Error {
    if (!v.is_null() && !v.is_number_integer()) return WrongType("logprobs", "an integer", v);
    return RequireNeutral(v, "logprobs", "log probabilities are not returned",
                          [](const json&) { return false; });
  };
  f["suffix"] = [](const json& v, GenerationParams*) -> Error {
    if (!v.is_null() && !v.is_string()) return WrongType("suffix", "a string", v);
    return RequireNeutral(v, "suffix", "insertion (suffix) is not implemented",
                          [](const json& s) { return s.get<std::string>().empty(); });
  };
  return f;
}

std::map<std::string, FieldReader> ChatFields() {
  std::map<std::string, FieldReader> f = CommonFields();
  f["messages"] = [](const json& v, GenerationParams* out) { return ReadMessages(v, out); };
  f["max_completion_tokens"] = [](const json& v, GenerationParams* out) -> Error {
    if (v.is_null()) return std::nullopt;
    std::int64_t n = 0;
    if (Error e =
            ReadInt(v, "max_completion_tokens", 1, std::numeric_limits<std::int32_t>::max(), &n))
      return e;
    out->max_tokens = n;
    return std::nullopt;
  };
  f["logprobs"] = [](const json& v, GenerationParams*) -> Error {
    if (!v.is_null() && !v.is_boolean()) return WrongType("logprobs", "a boolean", v);
    return RequireNeutral(v, "logprobs", "log probabilities are not returned", IsFalse);
  };
  f["top_logprobs"] = [](const json& v, GenerationParams*) -> Error {
    if (!v.is_null() && !v.is_number_integer()) return WrongType("top_logprobs", "an integer", v);
    return RequireNeutral(v, "top_logprobs", "log probabilities are not returned", IsZero);
  };
  for (const char* tools : {"tools", "functions"}) {
    f[tools] = [tools](const json& v, GenerationParams*) -> Error {
      if (!v.is_null() && !v.is_array()) return WrongType(tools, "an array", v);
      return RequireNeutral(v, tools, "tool calling is not implemented", IsEmpty);
    };
  }
  for (const char* choice : {"tool_choice", "function_call"}) {
    f[choice] = [choice](const json& v, GenerationParams*) -> Error {
      return RequireNeutral(v, choice, "tool calling is not implemented",
                            [](const json& c) { return c == "none"; });
    };
  }
  f["parallel_tool_calls"] = [](const json&, GenerationParams*) -> Error { return std::nullopt; };
  f["response_format"] = [](const json& v, GenerationParams*) -> Error {
    if (!v.is_null() && !v.is_object()) return WrongType("response_format", "an object", v);
    return RequireNeutral(v, "response_format", "only {\"type\": \"text\"}", [](const json& r) {
      return r.size() == 1 && r.value("type", "") == "text";
    });
  };
  f["modalities"] = [](const json& v, GenerationParams*) -> Error {
    return RequireNeutral(v, "modalities", "only [\"text\"]",
                          [](const json& m) { return m == json::array({"text"}); });
  };
  for (const char* unsupported : {"audio", "prediction", "web_search_options", "moderation"}) {
    f[unsupported] = [unsupported](const json& v, GenerationParams*) -> Error {
      return RequireNeutral(v, unsupported, "not implemented", [](const json&) { return false; });
    };
  }
  // Reasoning settings have no effect on a model that does not reason: accepted, ignored.
  for (const char* ignored : {"reasoning_effort", "verbosity"}) {
    f[ignored] = [](const json&, GenerationParams*) -> Error { return std::nullopt; };
  }
  return f;
}

}  // namespace

nlohmann::json ErrorJson(const ApiError& error) {
  json e = {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json() : json(error.param)},
            {"code", error.code.empty() ? json() : json(error.code)}};
  return json{{"error", std::move(e)}};
}

std::string ErrorBody(const ApiError& error) { return DumpJson(ErrorJson(error)); }

ApiError BadRequest(std::string message, std::string param, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param),
                  std::move(code)};
}

ApiError NotFound(std::string message, std::string param, std::string code) {
  return ApiError{404, std::move(message), "invalid_request_error", std::move(param),
                  std::move(code)};
}

std::optional<ApiError> ParseGenerationBody(Endpoint endpoint, std::string_view body,
                                            GenerationParams* out,
                                            const std::vector<std::string>& ignore_keys) {
  json parsed;
  try {
    parsed = json::parse(body);
  } catch (const json::exception& e) {
    // A parse error names the position and what was expected there; out_of_range, a number
    // beyond a double (1e400).
    return BadRequest(std::string("the request body is not valid JSON: ") + e.what());
  }
  return ParseGenerationRequest(endpoint, parsed, out, ignore_keys);
}

std::optional<ApiError> ParseGenerationRequest(Endpoint endpoint, const nlohmann::json& body,
                                               GenerationParams* out,
                                               const std::vector<std::string>& ignore_keys) {
  static const std::map<std::string, FieldReader> kCompletion = CompletionFields();
  static const std::map<std::string, FieldReader> kChat = ChatFields();
  if (!body.is_object()) return BadRequest("the request body must be a JSON object");
  *out = GenerationParams();
  out->endpoint = endpoint;
  const auto& fields = endpoint == Endpoint::kCompletions ? kCompletion : kChat;
  // max_completion_tokens before max_tokens, so that it wins whatever the key order.
  if (body.contains("max_completion_tokens") && endpoint == Endpoint::kChatCompletions) {
    if (Error e = fields.at("max_completion_tokens")(body["max_completion_tokens"], out)) return e;
  }
  for (const auto& [key, value] : body.items()) {
    if (key == "max_completion_tokens" && endpoint == Endpoint::kChatCompletions) continue;
    if (std::find(ignore_keys.begin(), ignore_keys.end(), key) != ignore_keys.end()) continue;
    auto it = fields.find(key);
    if (it == fields.end())
      return BadRequest("Unrecognized request argument supplied: " + key, key,
                        "unrecognized_argument");
    if (Error e = it->second(value, out)) return e;
  }
  const char* required = endpoint == Endpoint::kCompletions ? "prompt" : "messages";
  if (!body.contains(required) || body[required].is_null())
    return BadRequest(std::string("'") + required + "' is required", required);
  out->stream_options_given = body.contains("stream_options") && !body["stream_options"].is_null();
  return std::nullopt;
}

}  // namespace duet::backend::serve
