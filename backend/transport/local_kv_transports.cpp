// The KV transports of one process's instances (see local_kv_transports.h).
#include "backend/transport/local_kv_transports.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "backend/engine/realtime_ports.h"
#include "backend/transport/kv_transport.h"

namespace duet::backend {

using policies::InstanceRole;

// What one instance pulls with (`own`, maybe wrapped).
struct LocalKvTransports::Side {
  std::unique_ptr<policies::KvTransport> own;
  std::unique_ptr<policies::KvTransport> wrapped;
  policies::KvTransport& transport() { return wrapped ? *wrapped : *own; }
};

// Progresses the sides of prefill instances, asleep on their wake-up descriptors (or polling
// every millisecond where one has none) until work arrives or the destructor runs.
class ProgressThread {
 public:
  explicit ProgressThread(std::vector<PeerKvTransport*> pulled_from, int stop_fd)
      : stop_fd_(stop_fd), thread_([this, pulled_from] { Loop(pulled_from); }) {}
  // Null where no side needs progress.
  static Result<std::unique_ptr<ProgressThread>> Start(std::vector<PeerKvTransport*> pulled) {
    std::erase_if(pulled, [](PeerKvTransport* t) { return !t->NeedsProgress(); });
    if (pulled.empty()) return std::unique_ptr<ProgressThread>();
    const int stop_fd = ::eventfd(0, EFD_CLOEXEC);
    if (stop_fd < 0) return Status::Error("eventfd for the KV transport's progress thread failed");
    return std::make_unique<ProgressThread>(std::move(pulled), stop_fd);
  }
  ~ProgressThread() {
    const std::uint64_t one = 1;
    DUET_CHECK(::write(stop_fd_, &one, sizeof one) == sizeof one);
    thread_.join();
    ::close(stop_fd_);
  }

 private:
  void Loop(const std::vector<PeerKvTransport*>& pulled_from) {
    std::vector<pollfd> fds;
    bool all_fds = true;
    for (PeerKvTransport* t : pulled_from) {
      fds.push_back({t->WakeupFd(), POLLIN, 0});
      all_fds &= fds.back().fd >= 0;
    }
    fds.push_back({stop_fd_, POLLIN, 0});
    while (true) {
      for (PeerKvTransport* t : pulled_from) t->Progress();
      bool armed = true;
      for (PeerKvTransport* t : pulled_from) armed = t->Arm() && armed;
      if (!armed) continue;  // work arrived meanwhile
      ::poll(fds.data(), fds.size(), all_fds ? -1 : 1);
      if (fds.back().revents & POLLIN) return;
    }
  }

  int stop_fd_;
  std::thread thread_;
};

LocalKvTransports::~LocalKvTransports() = default;

Result<std::unique_ptr<LocalKvTransports>> LocalKvTransports::Create(
    const std::vector<KvRegion>& regions, const std::vector<InstanceRole>& roles,
    const KvTransportOptions& options) {
  DUET_CHECK(regions.size() == roles.size());
  std::unique_ptr<LocalKvTransports> set(new LocalKvTransports());
  const auto n = static_cast<policies::InstanceId>(regions.size());
  set->sides_.resize(regions.size());
  for (auto& side : set->sides_) side = std::make_unique<Side>();
  auto role = [&](policies::InstanceId i) { return roles[static_cast<std::size_t>(i)]; };
  auto region = [&](policies::InstanceId i) { return regions[static_cast<std::size_t>(i)]; };

  // Colocated instances move no KV: no transport is made for them, known or not.
  set->path_ = options.transport;
  const bool pd = std::any_of(roles.begin(), roles.end(),
                              [](InstanceRole r) { return r != InstanceRole::kColocated; });
  if (pd) {
    auto transport = FindKvTransport(options.transport);
    if (!transport.ok()) return transport.status();
    set->path_ = KvTransportPath(**transport, options);
    std::vector<PeerKvTransport*> peers(regions.size(), nullptr);
    for (policies::InstanceId i = 0; i < n; ++i) {
      if (role(i) == InstanceRole::kColocated) continue;
      auto t = (*transport)->create(i, region(i), options);
      if (!t.ok()) return Status::Error("instance " + std::to_string(i) + ": " + t.error());
      peers[static_cast<std::size_t>(i)] = t->get();
      set->sides_[static_cast<std::size_t>(i)]->own = std::move(*t);
    }
    // Decode instances connect to every prefill instance with the descriptor it publishes.
    std::vector<PeerKvTransport*> pulled_from;
    for (policies::InstanceId p = 0; p < n; ++p) {
      if (role(p) == InstanceRole::kPrefill)
        pulled_from.push_back(peers[static_cast<std::size_t>(p)]);
    }
    for (policies::InstanceId d = 0; d < n; ++d) {
      if (role(d) != InstanceRole::kDecode) continue;
      for (policies::InstanceId p = 0; p < n; ++p) {
        if (role(p) != InstanceRole::kPrefill) continue;
        const Status s = peers[static_cast<std::size_t>(d)]->Connect(
            p, peers[static_cast<std::size_t>(p)]->Descriptor());
        if (!s.ok()) {
          return Status::Error("instance " + std::to_string(d) + " connecting to instance " +
                               std::to_string(p) + ": " + s.message());
        }
      }
    }
    auto progress = ProgressThread::Start(std::move(pulled_from));
    if (!progress.ok()) return progress.status();
    set->progress_ = std::move(*progress);
  }
  for (policies::InstanceId i = 0; i < n; ++i) {
    Side& side = *set->sides_[static_cast<std::size_t>(i)];
    if (!side.own) side.own = std::make_unique<NoKvTransport>();
    if (role(i) == InstanceRole::kDecode && options.wrap) side.wrapped = options.wrap(*side.own, i);
  }
  return set;
}

policies::KvTransport& LocalKvTransports::transport(policies::InstanceId instance) {
  return sides_.at(static_cast<std::size_t>(instance))->transport();
}

}  // namespace duet::backend

namespace duet::backend {

Result<std::unique_ptr<WorkerKvTransport>> WorkerKvTransport::Create(
    InstanceRole role, std::optional<KvRegion> region, const KvTransportOptions& options) {
  std::unique_ptr<WorkerKvTransport> t(new WorkerKvTransport());
  if (role == InstanceRole::kColocated) {
    t->own_ = std::make_unique<NoKvTransport>();
    t->path_ = "none";
    return t;
  }
  if (!region) return Status::Error("this backend exposes no KV region, so its KV cannot move");
  auto transport = FindKvTransport(options.transport);
  if (!transport.ok()) return transport.status();
  if (!(*transport)->processes)
    return Status::Error((*transport)->name + " moves KV within one process, not between worker " +
                         "processes");
  auto peer = (*transport)->create(policies::kNoInstance, *region, options);
  if (!peer.ok()) return peer.status();
  t->peer_ = peer->get();
  t->own_ = std::move(*peer);
  t->path_ = KvTransportPath(**transport, options);
  if (role == InstanceRole::kPrefill) {
    t->descriptor_ = t->peer_->Descriptor();
    auto progress = ProgressThread::Start({t->peer_});
    if (!progress.ok()) return progress.status();
    t->progress_ = std::move(*progress);
  }
  return t;
}

WorkerKvTransport::~WorkerKvTransport() = default;  // progress_ stops before peer_ goes

const KvTransferLog* WorkerKvTransport::log() const { return peer_; }

void WorkerKvTransport::SetSelf(policies::InstanceId self) {
  if (peer_) peer_->SetSelf(self);
}

void WorkerKvTransport::SetPeer(policies::InstanceId peer, std::string descriptor) {
  std::lock_guard lock(mu_);
  pending_peers_.emplace_back(peer, std::move(descriptor));
  peers_pending_.store(true, std::memory_order_release);
}

void WorkerKvTransport::ApplyPeers() {
  // Every Post and Poll asks: no lock unless a peer changed.
  if (!peers_pending_.load(std::memory_order_acquire)) return;
  std::vector<std::pair<policies::InstanceId, std::string>> peers;
  {
    std::lock_guard lock(mu_);
    peers.swap(pending_peers_);
    peers_pending_.store(false, std::memory_order_relaxed);
  }
  if (!peer_) return;
  for (auto& [peer, descriptor] : peers) {
    peer_->Disconnect(peer);
    if (descriptor.empty()) continue;
    // A peer that cannot be reached shows as failed pulls from it, with the reason logged.
    wired_.erase(peer);
    const Status s = peer_->Connect(peer, descriptor);
    if (!s.ok())
      std::fprintf(stderr, "duet worker: connecting to instance %d: %s\n", peer,
                   s.message().c_str());
  }
}

policies::TransferId WorkerKvTransport::Post(const policies::KvTransferRequest& transfer) {
  ApplyPeers();
  // The first pull from a peer waits (briefly) for its connection's wire-up where the transport
  // sets it up lazily: UCX 1.13 asserts when a peer vanishes in the middle of one, and the pull
  // needs it done anyway.
  if (peer_ && wired_.insert(transfer.src).second) {
    if (Status s = peer_->Flush(transfer.src, 1.0); !s.ok())
      std::fprintf(stderr, "duet worker: wiring up to instance %d: %s\n", transfer.src,
                   s.message().c_str());
  }
  return own_->Post(transfer);
}

policies::TransferStatus WorkerKvTransport::Poll(policies::TransferId id) {
  ApplyPeers();
  const policies::TransferStatus status = own_->Poll(id);
  // The engine reports the failure to the request's client; why the transport failed goes to
  // the log.
  if (status == policies::TransferStatus::kFailed && peer_ && !peer_->records().empty()) {
    const KvTransferRecord& r = peer_->records().back();
    std::fprintf(stderr, "duet worker: the KV pull of request %llu from instance %d failed: %s\n",
                 static_cast<unsigned long long>(r.request), r.src, r.error.c_str());
  }
  return status;
}

}  // namespace duet::backend
