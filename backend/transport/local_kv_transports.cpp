// The KV transports of one process's instances (see local_kv_transports.h).
#include "backend/transport/local_kv_transports.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>

#include "backend/engine/realtime_ports.h"
#include "backend/transport/kv_transport.h"
#if DUET_HAVE_UCX
#include "backend/transport/ucx_kv_transport.h"
#endif

namespace duet::backend {

using policies::InstanceRole;

Result<KvTransportKind> ParseKvTransportKind(const std::string& name) {
  if (name == "loopback") return KvTransportKind::kLoopback;
  if (name == "ucx") {
#if DUET_HAVE_UCX
    return KvTransportKind::kUcx;
#else
    return Status::Error("this build of Duet has no UCX (see docs/development.md)");
#endif
  }
  return Status::Error("unknown KV transport '" + name + "' (loopback or ucx)");
}

KvAllocator KvTransportAllocator(const KvTransportOptions& options) {
#if DUET_HAVE_UCX
  if (options.kind == KvTransportKind::kUcx) {
    return [tls = options.ucx_tls](std::int64_t bytes) -> Result<std::unique_ptr<KvMemory>> {
      auto memory = UcxKvMemory::Allocate(bytes, tls);
      if (!memory.ok()) {
        return Status::Error("KV transport (UCX_TLS '" + tls + "'): " + memory.error());
      }
      return std::unique_ptr<KvMemory>(std::move(*memory));
    };
  }
#else
  (void)options;
#endif
  return nullptr;
}

// What one instance pulls with (`own`, maybe wrapped).
struct LocalKvTransports::Side {
  std::unique_ptr<policies::KvTransport> own;
  std::unique_ptr<policies::KvTransport> wrapped;
  policies::KvTransport& transport() { return wrapped ? *wrapped : *own; }
};

// Progresses the UCX workers of prefill instances, asleep on their wake-up descriptors (or
// polling every millisecond where one has none) until work arrives or the destructor runs.
class UcxProgressThread {
 public:
  explicit UcxProgressThread(std::vector<UcxKvTransport*> pulled_from, int stop_fd)
      : stop_fd_(stop_fd), thread_([this, pulled_from] { Loop(pulled_from); }) {}
  static Result<std::unique_ptr<UcxProgressThread>> Start(std::vector<UcxKvTransport*> pulled) {
    const int stop_fd = ::eventfd(0, EFD_CLOEXEC);
    if (stop_fd < 0) return Status::Error("eventfd for the UCX progress thread failed");
    return std::make_unique<UcxProgressThread>(std::move(pulled), stop_fd);
  }
  ~UcxProgressThread() {
    const std::uint64_t one = 1;
    DUET_CHECK(::write(stop_fd_, &one, sizeof one) == sizeof one);
    thread_.join();
    ::close(stop_fd_);
  }

 private:
  void Loop(const std::vector<UcxKvTransport*>& pulled_from) {
#if DUET_HAVE_UCX
    std::vector<pollfd> fds;
    bool all_fds = true;
    for (UcxKvTransport* t : pulled_from) {
      fds.push_back({t->WakeupFd(), POLLIN, 0});
      all_fds &= fds.back().fd >= 0;
    }
    fds.push_back({stop_fd_, POLLIN, 0});
    while (true) {
      for (UcxKvTransport* t : pulled_from) t->Progress();
      bool armed = true;
      for (UcxKvTransport* t : pulled_from) armed = t->Arm() && armed;
      if (!armed) continue;  // work arrived meanwhile
      ::poll(fds.data(), fds.size(), all_fds ? -1 : 1);
      if (fds.back().revents & POLLIN) return;
    }
#else
    (void)pulled_from;
#endif
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

  if (options.kind == KvTransportKind::kLoopback) {
    set->path_ = "loopback";
    for (policies::InstanceId d = 0; d < n; ++d) {
      if (role(d) != InstanceRole::kDecode) continue;
      auto loopback = std::make_unique<LoopbackKvTransport>();
      loopback->Register(d, region(d));
      for (policies::InstanceId p = 0; p < n; ++p) {
        if (role(p) == InstanceRole::kPrefill) loopback->Register(p, region(p));
      }
      set->sides_[static_cast<std::size_t>(d)]->own = std::move(loopback);
    }
  } else {
#if DUET_HAVE_UCX
    set->path_ = "ucx:" + (options.ucx_tls.empty() ? std::string("auto") : options.ucx_tls);
    std::vector<UcxKvTransport*> ucx(regions.size(), nullptr);
    for (policies::InstanceId i = 0; i < n; ++i) {
      if (role(i) == InstanceRole::kColocated) continue;
      auto t = UcxKvTransport::Create(i, region(i), options.ucx_tls);
      if (!t.ok()) return Status::Error("instance " + std::to_string(i) + ": " + t.error());
      ucx[static_cast<std::size_t>(i)] = t->get();
      set->sides_[static_cast<std::size_t>(i)]->own = std::move(*t);
    }
    // Decode instances connect to every prefill instance with the descriptor it publishes.
    for (policies::InstanceId d = 0; d < n; ++d) {
      if (role(d) != InstanceRole::kDecode) continue;
      for (policies::InstanceId p = 0; p < n; ++p) {
        if (role(p) != InstanceRole::kPrefill) continue;
        const Status s = ucx[static_cast<std::size_t>(d)]->Connect(
            p, ucx[static_cast<std::size_t>(p)]->Descriptor());
        if (!s.ok()) {
          return Status::Error("instance " + std::to_string(d) + " connecting to instance " +
                               std::to_string(p) + ": " + s.message());
        }
      }
    }
    std::vector<UcxKvTransport*> pulled_from;
    for (policies::InstanceId p = 0; p < n; ++p) {
      if (role(p) == InstanceRole::kPrefill)
        pulled_from.push_back(ucx[static_cast<std::size_t>(p)]);
    }
    auto progress = UcxProgressThread::Start(std::move(pulled_from));
    if (!progress.ok()) return progress.status();
    set->progress_ = std::move(*progress);
#else
    return Status::Error("this build of Duet has no UCX");
#endif
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
  if (options.kind != KvTransportKind::kUcx)
    return Status::Error("KV moves between worker processes over UCX only (not loopback)");
#if DUET_HAVE_UCX
  auto ucx = UcxKvTransport::Create(policies::kNoInstance, *region, options.ucx_tls);
  if (!ucx.ok()) return ucx.status();
  t->ucx_ = ucx->get();
  t->own_ = std::move(*ucx);
  t->path_ = "ucx:" + (options.ucx_tls.empty() ? std::string("auto") : options.ucx_tls);
  if (role == InstanceRole::kPrefill) {
    t->descriptor_ = t->ucx_->Descriptor();
    auto progress = UcxProgressThread::Start({t->ucx_});
    if (!progress.ok()) return progress.status();
    t->progress_ = std::move(*progress);
  }
  return t;
#else
  return Status::Error("this build of Duet has no UCX");
#endif
}

WorkerKvTransport::~WorkerKvTransport() = default;  // progress_ stops before ucx_ goes

const KvTransferLog* WorkerKvTransport::log() const {
#if DUET_HAVE_UCX
  return ucx_;
#else
  return nullptr;
#endif
}

void WorkerKvTransport::SetSelf(policies::InstanceId self) {
#if DUET_HAVE_UCX
  if (ucx_) ucx_->SetSelf(self);
#else
  (void)self;
#endif
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
#if DUET_HAVE_UCX
  if (!ucx_) return;
  for (auto& [peer, descriptor] : peers) {
    ucx_->Disconnect(peer);
    if (descriptor.empty()) continue;
    // A peer that cannot be reached shows as failed pulls from it, with the reason logged.
    wired_.erase(peer);
    const Status s = ucx_->Connect(peer, descriptor);
    if (!s.ok())
      std::fprintf(stderr, "duet worker: connecting to instance %d: %s\n", peer,
                   s.message().c_str());
  }
#endif
}

policies::TransferId WorkerKvTransport::Post(const policies::KvTransferRequest& transfer) {
  ApplyPeers();
#if DUET_HAVE_UCX
  // The first pull from a peer waits (briefly) for its endpoint's wire-up: UCX 1.13 asserts
  // when a peer vanishes in the middle of one, and the pull needs it done anyway.
  if (ucx_ && wired_.insert(transfer.src).second) {
    if (Status s = ucx_->Flush(transfer.src, 1.0); !s.ok())
      std::fprintf(stderr, "duet worker: wiring up to instance %d: %s\n", transfer.src,
                   s.message().c_str());
  }
#endif
  return own_->Post(transfer);
}

policies::TransferStatus WorkerKvTransport::Poll(policies::TransferId id) {
  ApplyPeers();
  const policies::TransferStatus status = own_->Poll(id);
#if DUET_HAVE_UCX
  // The engine reports the failure to the request's client; why UCX failed goes to the log.
  if (status == policies::TransferStatus::kFailed && ucx_ && !ucx_->records().empty()) {
    const KvTransferRecord& r = ucx_->records().back();
    std::fprintf(stderr, "duet worker: the KV pull of request %llu from instance %d failed: %s\n",
                 static_cast<unsigned long long>(r.request), r.src, r.error.c_str());
  }
#endif
  return status;
}

}  // namespace duet::backend
