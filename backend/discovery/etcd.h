// Discovery through etcd (Debian's etcd-server): a client of etcd v3's HTTP/JSON gateway
// (POST /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke, /v3/kv/put, /v3/kv/range,
// /v3/kv/deleterange, /v3/kv/txn; keys and values base64 in the JSON, as the gateway wants
// them), one blocking request at a time, each within a deadline. No Go and no gRPC: the gateway is
// part of every etcd 3.4+. The response parsers are functions of their own, bounded and fuzzed
// (fuzz/discovery_etcd_fuzz.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace duet::backend::discovery {

// "etcd://HOST:PORT" (an IPv4 address or a host name; the port in 1..65535).
struct EtcdEndpoint {
  std::string host;
  int port = 0;
  std::string Text() const { return "etcd://" + host + ":" + std::to_string(port); }
};
Result<EtcdEndpoint> ParseEtcdUrl(std::string_view url);

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t lease = 0;  // 0: none
};

struct Listing {
  std::int64_t revision = 0;  // the store's revision when it was read
  std::vector<KeyValue> kvs;
};

// Bounds on what a response may hold: the store's answers are read into memory.
inline constexpr std::size_t kMaxResponseBytes = std::size_t{16} << 20;
inline constexpr std::size_t kMaxListedKeys = 4096;

// The parsers of the gateway's answers; an error names what is wrong (an etcd "error" object
// is reported with its message).
Result<std::int64_t> ParseGrantResponse(std::string_view body);      // the lease's id
Result<std::int64_t> ParseKeepAliveResponse(std::string_view body);  // TTL left; 0: expired
Result<Listing> ParseRangeResponse(std::string_view body);
Status ParseWriteResponse(std::string_view body);      // put, deleterange
Result<bool> ParseTxnResponse(std::string_view body);  // whether the transaction's test held

class EtcdClient {
 public:
  explicit EtcdClient(EtcdEndpoint endpoint, Seconds timeout_s = 2.0)
      : endpoint_(std::move(endpoint)), timeout_s_(timeout_s) {}

  Result<std::int64_t> GrantLease(std::int64_t ttl_s);
  // The lease's TTL left after the renewal: 0 when it had expired (its keys are gone).
  Result<std::int64_t> KeepAlive(std::int64_t lease);
  // Ends the lease now, and with it every key put under it.
  Status RevokeLease(std::int64_t lease);
  Status Put(const std::string& key, const std::string& value, std::int64_t lease = 0);
  Status Delete(const std::string& key);
  // The value of `key`, if it exists.
  Result<std::optional<std::string>> Get(const std::string& key);
  // Every key under `prefix`, with its value and lease.
  Result<Listing> List(const std::string& prefix);
  // Puts every pair under `lease` if none of their keys exists, all or none (one transaction);
  // whether it did.
  Result<bool> PutAllIfAbsent(const std::vector<std::pair<std::string, std::string>>& pairs,
                              std::int64_t lease);

  const EtcdEndpoint& endpoint() const { return endpoint_; }

 private:
  // POSTs `body` (JSON) to `path`; the response's body when its status is 200.
  Result<std::string> Post(const std::string& path, const std::string& body);

  EtcdEndpoint endpoint_;
  Seconds timeout_s_;
};

std::string Base64(std::string_view bytes);
Result<std::string> FromBase64(std::string_view text);

}  // namespace duet::backend::discovery
