// Workers registered in etcd and found there: a worker keeps a record of where frontends reach
// it under a key of its own, bound to a lease it renews, so that the record vanishes when the
// worker stops renewing (its process died or hangs, its host is cut off); a frontend lists the
// records (WorkerDirectory) and connects to each worker it does not hold yet.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backend/discovery/etcd.h"
#include "common/status.h"
#include "common/units.h"

namespace duet::backend::discovery {

// Where workers register: KEY = kWorkersPrefix + the worker's address.
inline constexpr std::string_view kWorkersPrefix = "/duet/workers/";

// A worker's record: its role, where it takes a frontend ("host:port"), its pid there, and the
// TTL of its lease.
struct WorkerRecord {
  std::string role;
  std::string address;
  std::int64_t pid = 0;
  std::int64_t ttl_s = 0;
};
std::string EncodeWorkerRecord(const WorkerRecord& record);
// A record as JSON, each field checked (the role one of prefill, decode, colocated; the address
// an IPv4 host:port; the TTL 1..3600 s); an error names the field.
Result<WorkerRecord> ParseWorkerRecord(std::string_view text);

// Keeps `record` under its key in etcd while it lives: a lease of record.ttl_s renewed every
// third of it, the record put again under a new lease when the old one expired (etcd was out of
// reach longer than the TTL), and tries again every half second while etcd cannot be reached,
// each failure logged once until it succeeds. Revokes the lease when destroyed (the record and
// the slot claims under it go at once).
class WorkerRegistration {
 public:
  WorkerRegistration(EtcdClient client, WorkerRecord record);
  ~WorkerRegistration();
  WorkerRegistration(const WorkerRegistration&) = delete;
  WorkerRegistration& operator=(const WorkerRegistration&) = delete;
  // Waits up to `timeout_s` for the record to be in etcd (the first put).
  bool WaitRegistered(Seconds timeout_s);
  std::string key() const { return std::string(kWorkersPrefix) + record_.address; }

 private:
  void Run();

  EtcdClient client_;
  const WorkerRecord record_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool registered_ = false;
  std::int64_t lease_ = 0;  // the record's; its thread's until joined
  std::thread thread_;
};

// Several frontends over one worker pool must give each worker the same instance id (its slot in
// the deployment's list of instances): the frontend that first connects to a worker claims a
// slot of its role for it in etcd, and every frontend puts it in that slot. A claim is two keys
// written in one transaction, each only if absent, under the worker's own lease (so they go with
// its record): kSlotsPrefix + the slot's index (a SlotClaim), and kClaimsPrefix + the worker's
// address (the index), so that neither a slot nor a worker is claimed twice.
inline constexpr std::string_view kSlotsPrefix = "/duet/slots/";
inline constexpr std::string_view kClaimsPrefix = "/duet/claims/";

struct SlotClaim {
  std::string worker;  // its key (kWorkersPrefix + address)
  std::string role;    // the slot's role in the deployment of the frontend that claimed it
};
std::string EncodeSlotClaim(const SlotClaim& claim);
// A claim as JSON: the worker a key under kWorkersPrefix, the role one of prefill, decode or
// colocated; an error names the field.
Result<SlotClaim> ParseSlotClaim(std::string_view text);

struct ListedWorker {
  WorkerRecord record;
  std::int64_t lease = 0;  // its record's
};
struct DirectoryListing {
  std::map<std::string, ListedWorker> workers;  // by key
  std::map<int, SlotClaim> slots;               // the claimed ones, by index
};

// The workers registered now and the slots claimed for them: what a frontend's fleet polls.
class WorkerDirectory {
 public:
  virtual ~WorkerDirectory() = default;
  virtual Result<DirectoryListing> List() = 0;
  // The slot of the worker under `key` (its record's lease `lease`, its role `role`): the one
  // claimed for it already (by any frontend), else the first of `candidates` that this call
  // could claim; none when every candidate is claimed for other workers.
  virtual Result<std::optional<int>> Claim(const std::string& key, std::int64_t lease,
                                           const std::string& role,
                                           const std::vector<int>& candidates) = 0;
  virtual std::string Name() const = 0;  // for logs
};

// The records and claims in etcd; one that does not parse is left out.
class EtcdWorkerDirectory final : public WorkerDirectory {
 public:
  explicit EtcdWorkerDirectory(EtcdClient client) : client_(std::move(client)) {}
  Result<DirectoryListing> List() override;
  Result<std::optional<int>> Claim(const std::string& key, std::int64_t lease,
                                   const std::string& role,
                                   const std::vector<int>& candidates) override;
  std::string Name() const override { return client_.endpoint().Text(); }

 private:
  // The slot claimed for the worker under `key`, if any.
  Result<std::optional<int>> ClaimedFor(const std::string& key);

  EtcdClient client_;
};

}  // namespace duet::backend::discovery
