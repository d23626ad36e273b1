// The completions protocol pieces of openai.h: URL parsing, the request body, and tolerant but
// type-checked reading of stream chunks, error bodies and the model list (nlohmann_json, in its
// no-exception mode: a malformed payload is a Status, never a throw).
#include "backend/replay/openai.h"

#include <array>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/text.h"
#include "policies/kv_tiers.h"

namespace duet::backend::replay {
namespace {

using nlohmann::json;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// A non-negative integer field at `name` of `obj`, when present and not null.
Status ReadCount(const json& obj, const char* name, const std::string& where,
                 std::optional<Tokens>& out) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (it->is_number_unsigned()) {
    out = static_cast<Tokens>(it->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)
                                  ? INT64_MAX
                                  : it->get<std::uint64_t>());
    return Status::Ok();
  }
  if (it->is_number_integer() && it->get<std::int64_t>() >= 0) {
    out = it->get<std::int64_t>();
    return Status::Ok();
  }
  return Status::Error(where + name + " must be a non-negative integer, got " + it->dump());
}

// A finite number of milliseconds >= 0 at `name` of `obj`, when present and not null.
Status ReadMs(const json& obj, const char* name, const std::string& where,
              std::optional<double>& out) {
  const auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0)
    return Status::Error(where + name + " must be a number >= 0, got " + it->dump());
  out = it->get<double>();
  return Status::Ok();
}

std::string MessageOf(const json& error) {
  if (error.is_string()) return error.get<std::string>();
  if (error.is_object()) {
    const auto it = error.find("message");
    if (it != error.end() && it->is_string()) return it->get<std::string>();
  }
  return error.dump();
}

// One printable line of a server's text: line breaks and other control characters become
// spaces, then duet::Excerpt cuts it and escapes what is not valid UTF-8.
std::string OneLineExcerpt(std::string_view text, std::size_t max_bytes) {
  std::string spaced(text.substr(0, max_bytes + 4));  // the excerpt never needs more
  for (char& c : spaced) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = ' ';
  }
  return duet::Excerpt(spaced, max_bytes);
}

}  // namespace

std::string Endpoint::HostHeader() const {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + port;
}

Result<Endpoint> ParseEndpoint(const std::string& url) {
  const std::string quoted = "'" + url + "'";
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= ' ' || c == '\x7f')
      return Status::Error(quoted + ": contains a space or a control character");
  }
  const std::string scheme_end = "://";
  const auto sep = url.find(scheme_end);
  if (sep == std::string::npos)
    return Status::Error(quoted + " is not a URL (expected http://HOST[:PORT][/PATH])");
  const std::string scheme = Lower(url.substr(0, sep));
  if (scheme == "https")
    return Status::Error(quoted +
                         ": https is not supported; use plain http:// (a TLS proxy "
                         "in front of the server can forward it)");
  if (scheme != "http")
    return Status::Error(quoted + ": unsupported scheme '" + scheme + "' (expected http://)");
  std::string rest = url.substr(sep + scheme_end.size());
  if (rest.find_first_of("?#") != std::string::npos)
    return Status::Error(quoted + ": a query or fragment has no meaning in an endpoint URL");
  const auto slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  if (authority.find('@') != std::string::npos)
    return Status::Error(quoted + ": credentials in the URL are not supported (use --api-key)");
  Endpoint e;
  std::string port;
  bool port_given = false;
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string::npos)
      return Status::Error(quoted + ": unterminated IPv6 address (missing ']')");
    e.host = authority.substr(1, close - 1);
    // An IPv6 address (hex groups, colons, an IPv4 tail's dots), which the URL writes back in
    // brackets: anything else there would not parse again.
    if (e.host.find(':') == std::string::npos ||
        e.host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos)
      return Status::Error(quoted + ": not an IPv6 address between '[' and ']'");
    const std::string tail = authority.substr(close + 1);
    if (!tail.empty()) {
      if (tail.front() != ':') return Status::Error(quoted + ": junk after the IPv6 address");
      port = tail.substr(1);
      port_given = true;
    }
  } else {
    const auto colon = authority.find(':');
    e.host = authority.substr(0, colon);
    if (colon != std::string::npos) {
      port = authority.substr(colon + 1);
      port_given = true;
    }
  }
  if (e.host.empty()) return Status::Error(quoted + ": no host");
  if (port_given && port.empty()) return Status::Error(quoted + ": empty port");
  if (port.empty()) port = "80";
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) < 1 || std::stoi(port) > 65535)
    return Status::Error(quoted + ": port '" + port + "' is not a number in 1..65535");
  e.port = std::to_string(std::stoi(port));
  // Trailing slashes and "/v1" go, until neither is left: the normalized URL parses to itself.
  for (bool changed = true; changed;) {
    changed = false;
    while (!path.empty() && path.back() == '/') {
      path.pop_back();
      changed = true;
    }
    if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0) {
      path.resize(path.size() - 3);
      changed = true;
    }
  }
  e.base_path = path;
  e.url = "http://" + e.HostHeader() + e.base_path;
  return e;
}

std::string CompletionRequestBody(const std::string& model, const std::vector<std::int32_t>& prompt,
                                  Tokens max_tokens, bool return_token_ids) {
  json body = {{"model", model},
               {"prompt", prompt},
               {"max_tokens", max_tokens},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", true},
               {"temperature", 0}};
  if (return_token_ids) body["return_token_ids"] = true;
  return body.dump();
}

void CompletionChunk::KeepReports(const CompletionChunk& newer) {
  auto keep = [](auto& field, const auto& reported) {
    if (reported) field = reported;
  };
  keep(prompt_tokens, newer.prompt_tokens);
  keep(completion_tokens, newer.completion_tokens);
  keep(cached_tokens, newer.cached_tokens);
  keep(duet_frontend_ms, newer.duet_frontend_ms);
  keep(duet_queue_ms, newer.duet_queue_ms);
  keep(duet_instance, newer.duet_instance);
  keep(duet_prefill_done_ms, newer.duet_prefill_done_ms);
  keep(duet_kv_transfer_ms, newer.duet_kv_transfer_ms);
  keep(duet_kv_transfer_bytes, newer.duet_kv_transfer_bytes);
  keep(duet_kv_transfer_parts, newer.duet_kv_transfer_parts);
  keep(duet_tier_hit_tokens, newer.duet_tier_hit_tokens);
}

Result<CompletionChunk> ParseCompletionChunk(std::string_view data) {
  CompletionChunk c;
  std::string_view trimmed = data;
  while (!trimmed.empty() && (trimmed.front() == ' ' || trimmed.front() == '\t'))
    trimmed.remove_prefix(1);
  while (!trimmed.empty() && (trimmed.back() == ' ' || trimmed.back() == '\t'))
    trimmed.remove_suffix(1);
  if (trimmed == "[DONE]") {
    c.done = true;
    return c;
  }
  const json j = json::parse(data.begin(), data.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error("chunk is not JSON: " + OneLineExcerpt(data, 60));
  if (!j.is_object())
    return Status::Error("chunk is not a JSON object: " + OneLineExcerpt(data, 60));
  if (const auto it = j.find("error"); it != j.end() && !it->is_null()) {
    c.error = MessageOf(*it);
    return c;
  }
  if (const auto it = j.find("object"); it != j.end() && *it == "error") {
    c.error = MessageOf(j);
    return c;
  }
  if (const auto it = j.find("choices"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Status::Error("choices must be an array, got " + it->dump());
    for (const json& choice : *it) {
      if (!choice.is_object()) return Status::Error("a choice is not an object: " + choice.dump());
      bool content = false, role_only = false, finishes = false;
      if (const auto t = choice.find("text"); t != choice.end() && t->is_string())
        content |= !t->get_ref<const std::string&>().empty();
      if (const auto t = choice.find("token_ids"); t != choice.end() && !t->is_null()) {
        if (!t->is_array()) return Status::Error("token_ids must be an array, got " + t->dump());
        for (const json& id : *t) {
          if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
              id.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max())
            return Status::Error("token_ids holds " + id.dump() + ", not a token id");
          c.token_ids.push_back(id.get<std::int32_t>());
        }
        content |= !t->empty();
      }
      if (const auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
        const auto t = d->find("content");
        const bool has_content =
            t != d->end() && t->is_string() && !t->get_ref<const std::string&>().empty();
        content |= has_content;
        role_only = d->contains("role") && !has_content;
      }
      if (const auto f = choice.find("finish_reason"); f != choice.end() && !f->is_null()) {
        if (!f->is_string())
          return Status::Error("finish_reason must be a string, got " + f->dump());
        if (!f->get_ref<const std::string&>().empty()) {
          c.finish_reason = f->get<std::string>();
          finishes = true;
        }
      }
      c.token_event |= content || (!finishes && !role_only);
    }
  }
  if (const auto u = j.find("usage"); u != j.end() && !u->is_null()) {
    if (!u->is_object()) return Status::Error("usage must be an object, got " + u->dump());
    DUET_RETURN_IF_ERROR(ReadCount(*u, "prompt_tokens", "usage.", c.prompt_tokens));
    DUET_RETURN_IF_ERROR(ReadCount(*u, "completion_tokens", "usage.", c.completion_tokens));
    if (const auto d = u->find("prompt_tokens_details"); d != u->end() && !d->is_null()) {
      if (!d->is_object())
        return Status::Error("usage.prompt_tokens_details must be an object, got " + d->dump());
      DUET_RETURN_IF_ERROR(
          ReadCount(*d, "cached_tokens", "usage.prompt_tokens_details.", c.cached_tokens));
    }
  }
  if (const auto d = j.find("duet"); d != j.end() && !d->is_null()) {
    if (!d->is_object()) return Status::Error("duet must be an object, got " + d->dump());
    for (auto [key, out] :
         {std::pair{"frontend_ms", &c.duet_frontend_ms}, std::pair{"queue_ms", &c.duet_queue_ms},
          std::pair{"prefill_done_ms", &c.duet_prefill_done_ms},
          std::pair{"kv_transfer_ms", &c.duet_kv_transfer_ms}})
      DUET_RETURN_IF_ERROR(ReadMs(*d, key, "duet.", *out));
    DUET_RETURN_IF_ERROR(ReadCount(*d, "kv_transfer_bytes", "duet.", c.duet_kv_transfer_bytes));
    if (const auto p = d->find("kv_transfer_parts_ms"); p != d->end() && !p->is_null()) {
      const std::string where = "duet.kv_transfer_parts_ms.";
      if (!p->is_object())
        return Status::Error("duet.kv_transfer_parts_ms must be an object, got " + p->dump());
      std::array<std::optional<double>, policies::KvTransferParts::kNames.size()> ms;
      for (std::size_t k = 0; k < ms.size(); ++k) {
        DUET_RETURN_IF_ERROR(ReadMs(*p, policies::KvTransferParts::kNames[k], where, ms[k]));
        if (!ms[k])
          return Status::Error("duet.kv_transfer_parts_ms must give message, wait and pull, got " +
                               p->dump());
      }
      c.duet_kv_transfer_parts =
          policies::KvTransferParts{*ms[0] / 1000.0, *ms[1] / 1000.0, *ms[2] / 1000.0};
    }
    if (const auto t = d->find("tier_hit_tokens"); t != d->end() && !t->is_null()) {
      if (!t->is_object())
        return Status::Error("duet.tier_hit_tokens must be an object, got " + t->dump());
      std::array<Tokens, policies::kNumLowerTiers> hits{};
      for (int k = 0; k < policies::kNumLowerTiers; ++k) {
        std::optional<Tokens> count;
        DUET_RETURN_IF_ERROR(ReadCount(*t, policies::ToString(static_cast<policies::TierKind>(k)),
                                       "duet.tier_hit_tokens.", count));
        hits[static_cast<std::size_t>(k)] = count.value_or(0);
      }
      c.duet_tier_hit_tokens = hits;
    }
    if (const auto i = d->find("instance"); i != d->end() && !i->is_null()) {
      // Bounded so that instance names stay a small table.
      if (!i->is_number_integer() || i->get<std::int64_t>() < 0 || i->get<std::int64_t>() > 65535)
        return Status::Error("duet.instance must be an integer in 0..65535, got " + i->dump());
      c.duet_instance = static_cast<int>(i->get<std::int64_t>());
    }
  }
  return c;
}

std::string DescribeErrorBody(std::string_view body, std::size_t max_chars) {
  const json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded() && j.is_object()) {
    for (const char* key : {"error", "message", "detail"}) {
      const auto it = j.find(key);
      if (it != j.end() && !it->is_null()) return OneLineExcerpt(MessageOf(*it), max_chars);
    }
  }
  std::string_view text = body;
  while (!text.empty() && (text.front() == ' ' || text.front() == '\n' || text.front() == '\r'))
    text.remove_prefix(1);
  if (text.empty()) return "(empty body)";
  return OneLineExcerpt(text, max_chars);
}

Result<std::string> ParseFirstModelId(std::string_view body) {
  const json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::Error("the model list is not a JSON object: " + OneLineExcerpt(body, 60));
  const auto data = j.find("data");
  if (data == j.end() || !data->is_array())
    return Status::Error("the model list has no \"data\" array");
  if (data->empty()) return Status::Error("the server lists no models");
  const json& first = data->front();
  if (!first.is_object() || !first.contains("id") || !first["id"].is_string() ||
      first["id"].get_ref<const std::string&>().empty())
    return Status::Error("the first model has no \"id\" string: " +
                         OneLineExcerpt(first.dump(), 60));
  return first["id"].get<std::string>();
}

}  // namespace duet::backend::replay
