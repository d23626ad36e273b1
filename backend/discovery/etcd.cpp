// etcd v3's HTTP/JSON gateway, as much of it as discovery needs (see etcd.h).
#include "backend/discovery/etcd.h"

#include <openssl/evp.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>

namespace duet::backend::discovery {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using json = nlohmann::json;

Result<EtcdEndpoint> ParseEtcdUrl(std::string_view url) {
  constexpr std::string_view kScheme = "etcd://";
  const std::string text(url);
  if (url.substr(0, kScheme.size()) != kScheme)
    return Status::Error("'" + text + "': an etcd endpoint is etcd://HOST:PORT");
  const std::string_view rest = url.substr(kScheme.size());
  const std::size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    return Status::Error("'" + text + "': an etcd endpoint is etcd://HOST:PORT");
  EtcdEndpoint e;
  e.host = std::string(rest.substr(0, colon));
  for (const char c : e.host) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-')
      return Status::Error("'" + text + "': the host may hold letters, digits, '.' and '-'");
  }
  const std::string_view port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5)
    return Status::Error("'" + text + "': the port must be in 1..65535");
  for (const char c : port) {
    if (c < '0' || c > '9') return Status::Error("'" + text + "': the port must be in 1..65535");
    e.port = e.port * 10 + (c - '0');
  }
  if (e.port < 1 || e.port > 65535)
    return Status::Error("'" + text + "': the port must be in 1..65535");
  return e;
}

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

Result<std::string> FromBase64(std::string_view text) {
  if (text.size() % 4 != 0) return Status::Error("base64 of a length not a multiple of 4");
  std::string out(3 * (text.size() / 4), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) return Status::Error("not base64");
  // EVP_DecodeBlock keeps the padding's bytes.
  std::size_t pad = 0;
  if (!text.empty() && text.back() == '=') ++pad;
  if (text.size() >= 2 && text[text.size() - 2] == '=') ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

namespace {

// A gateway answer: a JSON object; an etcd error object is an error with its message.
Result<json> Answer(std::string_view body, const char* what) {
  if (body.size() > kMaxResponseBytes) return Status::Error(std::string(what) + ": too large");
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::Error(std::string(what) + ": not a JSON object");
  if (j.contains("error")) {
    const json& e = j["error"];
    std::string message = e.is_object() && e.contains("message") && e["message"].is_string()
                              ? e["message"].get<std::string>()
                              : e.dump();
    return Status::Error(std::string(what) + ": etcd says: " + message);
  }
  return j;
}

// The gateway writes int64 fields as strings ("ID": "7587..."), and leaves zeros out.
Result<std::int64_t> Int64(const json& j, const char* key, const char* what) {
  if (!j.contains(key)) return std::int64_t{0};
  const json& v = j[key];
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (!v.is_string()) return Status::Error(std::string(what) + ": '" + key + "' is no integer");
  const std::string& s = v.get_ref<const std::string&>();
  std::size_t used = 0;
  long long parsed = 0;
  try {
    parsed = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size())
    return Status::Error(std::string(what) + ": '" + key + "' is no integer");
  return static_cast<std::int64_t>(parsed);
}

Result<std::string> Bytes(const json& j, const char* key, const char* what) {
  if (!j.contains(key)) return std::string();
  if (!j[key].is_string()) return Status::Error(std::string(what) + ": '" + key + "' is no string");
  auto bytes = FromBase64(j[key].get_ref<const std::string&>());
  if (!bytes.ok()) return Status::Error(std::string(what) + ": '" + key + "': " + bytes.error());
  return bytes;
}

// The end of the range of keys that start with `prefix` (etcd's convention: the prefix with its
// last byte that is not 0xff incremented, the rest dropped; "\0" for every key).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace

Result<std::int64_t> ParseGrantResponse(std::string_view body) {
  auto j = Answer(body, "lease grant");
  if (!j.ok()) return j.status();
  auto id = Int64(*j, "ID", "lease grant");
  if (!id.ok()) return id.status();
  if (*id <= 0) return Status::Error("lease grant: no lease ID in the answer");
  return *id;
}

Result<std::int64_t> ParseKeepAliveResponse(std::string_view body) {
  auto j = Answer(body, "lease keep-alive");
  if (!j.ok()) return j.status();
  // The gateway streams the keep-alive's answers: {"result": {...}}.
  const json& r = j->contains("result") ? (*j)["result"] : *j;
  if (!r.is_object()) return Status::Error("lease keep-alive: 'result' is no object");
  auto ttl = Int64(r, "TTL", "lease keep-alive");
  if (!ttl.ok()) return ttl.status();
  return std::max<std::int64_t>(0, *ttl);
}

Result<Listing> ParseRangeResponse(std::string_view body) {
  const char* what = "range";
  auto j = Answer(body, what);
  if (!j.ok()) return j.status();
  Listing out;
  if (j->contains("header") && (*j)["header"].is_object()) {
    auto revision = Int64((*j)["header"], "revision", what);
    if (!revision.ok()) return revision.status();
    out.revision = *revision;
  }
  if (!j->contains("kvs")) return out;
  const json& kvs = (*j)["kvs"];
  if (!kvs.is_array()) return Status::Error("range: 'kvs' is no array");
  if (kvs.size() > kMaxListedKeys)
    return Status::Error("range: more than " + std::to_string(kMaxListedKeys) + " keys");
  for (const json& kv : kvs) {
    if (!kv.is_object()) return Status::Error("range: a key-value that is no object");
    KeyValue e;
    auto key = Bytes(kv, "key", what);
    if (!key.ok()) return key.status();
    auto value = Bytes(kv, "value", what);
    if (!value.ok()) return value.status();
    auto lease = Int64(kv, "lease", what);
    if (!lease.ok()) return lease.status();
    e.key = std::move(*key);
    e.value = std::move(*value);
    e.lease = *lease;
    out.kvs.push_back(std::move(e));
  }
  return out;
}

Status ParseWriteResponse(std::string_view body) {
  auto j = Answer(body, "write");
  return j.ok() ? Status::Ok() : j.status();
}

Result<bool> ParseTxnResponse(std::string_view body) {
  auto j = Answer(body, "transaction");
  if (!j.ok()) return j.status();
  if (!j->contains("succeeded")) return false;  // the gateway leaves false out
  const json& v = (*j)["succeeded"];
  if (!v.is_boolean()) return Status::Error("transaction: 'succeeded' is no boolean");
  return v.get<bool>();
}

Result<std::string> EtcdClient::Post(const std::string& path, const std::string& body) {
  const std::string where = "POST " + endpoint_.Text() + path;
  net::io_context io;
  net::ip::tcp::resolver resolver(io);
  boost::system::error_code ec;
  const auto addresses = resolver.resolve(endpoint_.host, std::to_string(endpoint_.port), ec);
  if (ec) return Status::Error(where + ": " + ec.message());
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(timeout_s_)));
  http::request<http::string_body> request(http::verb::post, path, 11);
  request.set(http::field::host, endpoint_.host);
  request.set(http::field::content_type, "application/json");
  request.set(http::field::connection, "close");
  request.body() = body;
  request.prepare_payload();
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxResponseBytes);
  boost::system::error_code failure;
  std::string step = "connect";
  stream.async_connect(
      addresses, [&](const boost::system::error_code& e, const net::ip::tcp::endpoint&) {
        if (e) {
          failure = e;
          return;
        }
        step = "send";
        http::async_write(stream, request, [&](const boost::system::error_code& e, std::size_t) {
          if (e) {
            failure = e;
            return;
          }
          step = "read";
          http::async_read(stream, buffer, parser,
                           [&](const boost::system::error_code& e, std::size_t) { failure = e; });
        });
      });
  io.run();
  if (failure) {
    return Status::Error(
        where + ": " + step + ": " +
        (failure == beast::error::timeout ? std::string("no answer in time") : failure.message()));
  }
  auto& response = parser.get();
  if (response.result() != http::status::ok) {
    auto j = Answer(response.body(), "answer");
    return Status::Error(where + ": HTTP " + std::to_string(response.result_int()) +
                         (j.ok() ? std::string() : ": " + j.error()));
  }
  return std::move(response.body());
}

Result<std::int64_t> EtcdClient::GrantLease(std::int64_t ttl_s) {
  auto body = Post("/v3/lease/grant", json{{"TTL", ttl_s}}.dump());
  if (!body.ok()) return body.status();
  return ParseGrantResponse(*body);
}

Result<std::int64_t> EtcdClient::KeepAlive(std::int64_t lease) {
  auto body = Post("/v3/lease/keepalive", json{{"ID", lease}}.dump());
  if (!body.ok()) return body.status();
  return ParseKeepAliveResponse(*body);
}

Status EtcdClient::RevokeLease(std::int64_t lease) {
  auto body = Post("/v3/lease/revoke", json{{"ID", lease}}.dump());
  if (!body.ok()) return body.status();
  return ParseWriteResponse(*body);
}

Status EtcdClient::Put(const std::string& key, const std::string& value, std::int64_t lease) {
  json request = {{"key", Base64(key)}, {"value", Base64(value)}};
  if (lease != 0) request["lease"] = lease;
  auto body = Post("/v3/kv/put", request.dump());
  if (!body.ok()) return body.status();
  return ParseWriteResponse(*body);
}

Status EtcdClient::Delete(const std::string& key) {
  auto body = Post("/v3/kv/deleterange", json{{"key", Base64(key)}}.dump());
  if (!body.ok()) return body.status();
  return ParseWriteResponse(*body);
}

Result<std::optional<std::string>> EtcdClient::Get(const std::string& key) {
  auto body = Post("/v3/kv/range", json{{"key", Base64(key)}}.dump());
  if (!body.ok()) return body.status();
  auto listing = ParseRangeResponse(*body);
  if (!listing.ok()) return listing.status();
  for (KeyValue& kv : listing->kvs)
    if (kv.key == key) return std::optional<std::string>(std::move(kv.value));
  return std::optional<std::string>();
}

Result<Listing> EtcdClient::List(const std::string& prefix) {
  auto body = Post("/v3/kv/range", json{{"key", Base64(prefix)},
                                        {"range_end", Base64(PrefixEnd(prefix))},
                                        {"limit", kMaxListedKeys}}
                                       .dump());
  if (!body.ok()) return body.status();
  return ParseRangeResponse(*body);
}

Result<bool> EtcdClient::PutAllIfAbsent(
    const std::vector<std::pair<std::string, std::string>>& pairs, std::int64_t lease) {
  json compare = json::array();
  json success = json::array();
  for (const auto& [key, value] : pairs) {
    // A key that does not exist has create revision 0.
    compare.push_back(
        {{"key", Base64(key)}, {"result", "EQUAL"}, {"target", "CREATE"}, {"create_revision", 0}});
    json put = {{"key", Base64(key)}, {"value", Base64(value)}};
    if (lease != 0) put["lease"] = lease;
    success.push_back({{"request_put", put}});
  }
  auto body = Post("/v3/kv/txn", json{{"compare", compare}, {"success", success}}.dump());
  if (!body.ok()) return body.status();
  return ParseTxnResponse(*body);
}

}  // namespace duet::backend::discovery
