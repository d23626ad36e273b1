// OpenAI reply JSON, field for field as api.openai.com (and vLLM) write it, so that the
// official clients parse it: "text_completion" / "chat.completion(.chunk)" objects, "usage":
// null on every chunk when the usage chunk will follow.
#include "backend/serve/chunks.h"

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <random>

#include "common/status.h"

namespace duet::backend::serve {

// Ordered: fields in the order OpenAI writes them (id, object, created, model, choices, ...).
using json = nlohmann::ordered_json;

ReplyFormatter::ReplyFormatter(Endpoint endpoint, std::string id, std::int64_t created,
                               std::string model, bool include_usage, bool token_ids)
    : endpoint_(endpoint),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      include_usage_(include_usage),
      token_ids_(token_ids) {
  BuildTextTemplate();
}

void ReplyFormatter::BuildTextTemplate() {
  // A placeholder that JSON-escapes to a sequence no id or model name yields ("\u0001" is
  // searched from the end: the text comes after them).
  json out = Envelope(true);
  out["choices"] = json::array({Choice("\x01", nullptr, false, true)});
  const std::string whole = DumpJson(out);
  const std::string marker = "\"\\u0001\"";
  const auto at = whole.rfind(marker);
  DUET_CHECK(at != std::string::npos && whole.back() == '}');
  text_head_ = whole.substr(0, at);
  text_tail_ = whole.substr(at + marker.size());
  text_tail_.pop_back();  // the envelope's closing brace: the usage may come before it
}

json ReplyFormatter::Envelope(bool chunk) const {
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  const char* object =
      chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return json{{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json ReplyFormatter::Choice(std::string_view text, const json& finish_reason, bool role, bool chunk,
                            std::span<const std::int32_t> ids) const {
  json choice = {{"index", 0}};
  if (endpoint_ == Endpoint::kCompletions) {
    choice["text"] = text;
  } else if (chunk) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason;
  if (token_ids_) choice["token_ids"] = json(std::vector<std::int32_t>(ids.begin(), ids.end()));
  return choice;
}

std::string ReplyFormatter::RoleChunk() const {
  json out = Envelope(true);
  out["choices"] = json::array({Choice("", nullptr, true, true)});
  if (include_usage_) out["usage"] = nullptr;
  return DumpJson(out);
}

std::string ReplyFormatter::TextChunk(std::string_view text, const Usage* usage,
                                      std::span<const std::int32_t> ids) const {
  if (text.empty() || token_ids_) {
    // A chat delta without content has another shape, and token ids another tail: the general
    // path.
    json out = Envelope(true);
    out["choices"] = json::array({Choice(text, nullptr, false, true, ids)});
    if (include_usage_) out["usage"] = usage ? UsageJson(*usage) : json(nullptr);
    return DumpJson(out);
  }
  std::string out = text_head_;
  out += DumpJson(json(text));
  out += text_tail_;
  if (include_usage_) {
    if (usage) {
      // UsageJson's serialization, written directly: it is in every chunk when continuous.
      char buf[192];
      std::snprintf(buf, sizeof buf,
                    ",\"usage\":{\"prompt_tokens\":%" PRId64 ",\"completion_tokens\":%" PRId64
                    ",\"total_tokens\":%" PRId64
                    ",\"prompt_tokens_details\":{\"cached_tokens\":%" PRId64 "}}",
                    usage->prompt_tokens, usage->completion_tokens,
                    usage->prompt_tokens + usage->completion_tokens, usage->cached_tokens);
      out += buf;
    } else {
      out += ",\"usage\":null";
    }
  }
  out += '}';
  return out;
}

std::string ReplyFormatter::FinishChunk(std::string_view text, std::string_view finish_reason,
                                        const DuetExtension& duet, const Usage* usage,
                                        std::span<const std::int32_t> ids) const {
  json out = Envelope(true);
  out["choices"] = json::array({Choice(text, json(finish_reason), false, true, ids)});
  if (include_usage_) {
    out["usage"] = usage ? UsageJson(*usage) : json(nullptr);
  } else {
    out["duet"] = DuetJson(duet);
  }
  return DumpJson(out);
}

std::string ReplyFormatter::UsageChunk(const Usage& usage, const DuetExtension& duet) const {
  json out = Envelope(true);
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  out["duet"] = DuetJson(duet);
  return DumpJson(out);
}

std::string ReplyFormatter::FullReply(std::string_view text, std::string_view finish_reason,
                                      const Usage& usage, const DuetExtension& duet,
                                      std::span<const std::int32_t> ids) const {
  json out = Envelope(false);
  out["choices"] = json::array({Choice(text, json(finish_reason), false, false, ids)});
  out["usage"] = UsageJson(usage);
  out["duet"] = DuetJson(duet);
  return DumpJson(out);
}

json UsageJson(const Usage& usage) {
  return json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

namespace {

// {"message": ms, "wait": ms, "pull": ms}, or null.
json KvTransferPartsMs(const std::optional<policies::KvTransferParts>& parts) {
  if (!parts) return json();
  json out = json::object();
  const auto seconds = parts->InOrder();
  for (std::size_t k = 0; k < seconds.size(); ++k)
    out[policies::KvTransferParts::kNames[k]] = seconds[k] * 1000.0;
  return out;
}

}  // namespace

json DuetJson(const DuetExtension& duet) {
  auto known = [](double v) { return v >= 0 ? json(v) : json(); };
  return json{
      {"frontend_ms", known(duet.frontend_ms)},
      {"queue_ms", known(duet.queue_ms)},
      {"instance", duet.instance >= 0 ? json(duet.instance) : json()},
      {"prefill_done_ms", known(duet.prefill_done_ms)},
      {"kv_transfer_ms", known(duet.kv_transfer_ms)},
      {"kv_transfer_bytes", duet.kv_transfer_bytes >= 0 ? json(duet.kv_transfer_bytes) : json()},
      {"kv_transfer_parts_ms", KvTransferPartsMs(duet.kv_transfer_parts)},
      {"tier_hit_tokens",
       {{"dram", duet.tier_hit_tokens[0]},
        {"ssd", duet.tier_hit_tokens[1]},
        {"remote", duet.tier_hit_tokens[2]}}}};
}

std::string SseData(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  out.append("data: ").append(payload).append("\n\n");
  return out;
}

std::string NewReplyId(std::string_view prefix) {
  static std::atomic<std::uint64_t> next{std::random_device{}() |
                                         (std::uint64_t{std::random_device{}()} << 32)};
  static const std::uint32_t process_tag = std::random_device{}();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08" PRIx32 "%016" PRIx64, process_tag,
                next.fetch_add(1, std::memory_order_relaxed));
  return std::string(prefix) + buf;
}

}  // namespace duet::backend::serve
