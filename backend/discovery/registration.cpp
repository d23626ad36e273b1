// Workers registered in etcd and found there (see registration.h).
#include "backend/discovery/registration.h"

#include <arpa/inet.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace duet::backend::discovery {

using json = nlohmann::json;

std::string EncodeWorkerRecord(const WorkerRecord& r) {
  return json{{"role", r.role}, {"address", r.address}, {"pid", r.pid}, {"ttl_s", r.ttl_s}}.dump();
}

Result<WorkerRecord> ParseWorkerRecord(std::string_view text) {
  const std::string where = "worker record";
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(where + ": not a JSON object");
  auto field = [&](const char* key) -> const json* { return j.contains(key) ? &j[key] : nullptr; };
  WorkerRecord r;
  const json* role = field("role");
  if (!role || !role->is_string())
    return Status::Error(where + ": 'role' must be prefill, decode or colocated");
  r.role = role->get<std::string>();
  if (r.role != "prefill" && r.role != "decode" && r.role != "colocated")
    return Status::Error(where + ": 'role' must be prefill, decode or colocated");
  const json* address = field("address");
  if (!address || !address->is_string()) return Status::Error(where + ": 'address' is missing");
  r.address = address->get<std::string>();
  const std::size_t colon = r.address.rfind(':');
  in_addr parsed{};
  const std::string host = colon == std::string::npos ? "" : r.address.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : r.address.substr(colon + 1);
  int port_number = 0;
  for (const char c : port)
    port_number =
        c >= '0' && c <= '9' && port_number < 65536 ? port_number * 10 + (c - '0') : 1 << 20;
  if (::inet_pton(AF_INET, host.c_str(), &parsed) != 1 || port.empty() || port_number < 1 ||
      port_number > 65535)
    return Status::Error(where + ": 'address' must be an IPv4 host:port, not '" + r.address + "'");
  const json* pid = field("pid");
  if (!pid || !pid->is_number_integer() || pid->get<std::int64_t>() < 0 ||
      pid->get<std::int64_t>() > (std::int64_t{1} << 31))
    return Status::Error(where + ": 'pid' must be a process id");
  r.pid = pid->get<std::int64_t>();
  const json* ttl = field("ttl_s");
  if (!ttl || !ttl->is_number_integer() || ttl->get<std::int64_t>() < 1 ||
      ttl->get<std::int64_t>() > 3600)
    return Status::Error(where + ": 'ttl_s' must be 1..3600");
  r.ttl_s = ttl->get<std::int64_t>();
  return r;
}

WorkerRegistration::WorkerRegistration(EtcdClient client, WorkerRecord record)
    : client_(std::move(client)), record_(std::move(record)) {
  thread_ = std::thread([this] { Run(); });
}

WorkerRegistration::~WorkerRegistration() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Revoked, its lease takes the record and the slot claims frontends made under it at once
  // (else they lapse within the TTL); the record alone goes if the lease cannot be revoked.
  if (lease_ == 0 || !client_.RevokeLease(lease_).ok()) (void)client_.Delete(key());
}

bool WorkerRegistration::WaitRegistered(Seconds timeout_s) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
    return registered_ || stop_;
  }) && registered_;
}

void WorkerRegistration::Run() {
  const std::string value = EncodeWorkerRecord(record_);
  const auto renew = std::chrono::duration<double>(static_cast<double>(record_.ttl_s) / 3);
  const auto retry = std::chrono::milliseconds(500);
  std::string failing;  // the last failure logged, until a success
  auto failed = [&](const std::string& what) {
    if (what != failing)
      std::fprintf(stderr, "duet worker: registration in %s: %s (trying again)\n",
                   client_.endpoint().Text().c_str(), what.c_str());
    failing = what;
  };
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    bool ok = false;
    if (lease_ != 0) {
      auto ttl = client_.KeepAlive(lease_);
      if (!ttl.ok()) {
        failed(ttl.error());
      } else if (*ttl == 0) {
        lease_ = 0;  // expired: its record is gone; register again at once
        std::fprintf(stderr, "duet worker: the lease in %s had expired; registering again\n",
                     client_.endpoint().Text().c_str());
      } else {
        ok = true;
      }
    }
    if (lease_ == 0) {
      auto granted = client_.GrantLease(record_.ttl_s);
      if (!granted.ok()) {
        failed(granted.error());
      } else if (Status put = client_.Put(key(), value, *granted); !put.ok()) {
        failed(put.message());
      } else {
        lease_ = *granted;
        ok = true;
      }
    }
    if (ok && !failing.empty()) {
      std::fprintf(stderr, "duet worker: registered in %s again\n",
                   client_.endpoint().Text().c_str());
      failing.clear();
    }
    lock.lock();
    if (ok && !registered_) {
      registered_ = true;
      cv_.notify_all();
    }
    cv_.wait_for(lock, ok ? std::chrono::duration<double>(renew) : retry, [&] { return stop_; });
  }
}

std::string EncodeSlotClaim(const SlotClaim& claim) {
  return json{{"worker", claim.worker}, {"role", claim.role}}.dump();
}

Result<SlotClaim> ParseSlotClaim(std::string_view text) {
  const std::string where = "slot claim";
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(where + ": not a JSON object");
  SlotClaim claim;
  if (!j.contains("worker") || !j["worker"].is_string() ||
      !j["worker"].get_ref<const std::string&>().starts_with(kWorkersPrefix))
    return Status::Error(where + ": 'worker' must be a key under " + std::string(kWorkersPrefix));
  claim.worker = j["worker"].get<std::string>();
  if (!j.contains("role") || !j["role"].is_string())
    return Status::Error(where + ": 'role' must be prefill, decode or colocated");
  claim.role = j["role"].get<std::string>();
  if (claim.role != "prefill" && claim.role != "decode" && claim.role != "colocated")
    return Status::Error(where + ": 'role' must be prefill, decode or colocated");
  return claim;
}

namespace {

// A slot's index from the rest of its key: digits only, below 2^20.
std::optional<int> SlotIndex(std::string_view digits) {
  if (digits.empty() || digits.size() > 7) return std::nullopt;
  int index = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    index = index * 10 + (c - '0');
  }
  return index < (1 << 20) ? std::optional<int>(index) : std::nullopt;
}

std::string ClaimKey(const std::string& worker_key) {
  return std::string(kClaimsPrefix) + worker_key.substr(kWorkersPrefix.size());
}

}  // namespace

Result<DirectoryListing> EtcdWorkerDirectory::List() {
  // Both kinds of key in one read: the listing is one revision of the store.
  auto listing = client_.List("/duet/");
  if (!listing.ok()) return listing.status();
  DirectoryListing out;
  for (const KeyValue& kv : listing->kvs) {
    const std::string_view key = kv.key;
    if (key.starts_with(kWorkersPrefix)) {
      auto record = ParseWorkerRecord(kv.value);
      if (record.ok()) out.workers.emplace(kv.key, ListedWorker{std::move(*record), kv.lease});
    } else if (key.starts_with(kSlotsPrefix)) {
      auto index = SlotIndex(key.substr(kSlotsPrefix.size()));
      auto claim = ParseSlotClaim(kv.value);
      if (index && claim.ok()) out.slots.emplace(*index, std::move(*claim));
    }
  }
  return out;
}

Result<std::optional<int>> EtcdWorkerDirectory::ClaimedFor(const std::string& key) {
  auto found = client_.Get(ClaimKey(key));
  if (!found.ok()) return found.status();
  if (!*found) return std::optional<int>();
  return SlotIndex(**found);
}

Result<std::optional<int>> EtcdWorkerDirectory::Claim(const std::string& key, std::int64_t lease,
                                                      const std::string& role,
                                                      const std::vector<int>& candidates) {
  if (!key.starts_with(kWorkersPrefix))
    return Status::Error("slot claim: '" + key + "' is no worker's key");
  auto claimed = ClaimedFor(key);
  if (!claimed.ok()) return claimed.status();
  if (*claimed) return *claimed;
  for (const int slot : candidates) {
    auto put = client_.PutAllIfAbsent(
        {{std::string(kSlotsPrefix) + std::to_string(slot), EncodeSlotClaim({key, role})},
         {ClaimKey(key), std::to_string(slot)}},
        lease);
    if (!put.ok()) return put.status();
    if (*put) return std::optional<int>(slot);
    // Another frontend claimed this slot, or this worker, first.
    claimed = ClaimedFor(key);
    if (!claimed.ok()) return claimed.status();
    if (*claimed) return *claimed;
  }
  return std::optional<int>();
}

}  // namespace duet::backend::discovery
