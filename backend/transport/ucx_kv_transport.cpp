// UcxKvTransport (see ucx_kv_transport.h) on UCP: one context and worker per transport, the
// local KV region mapped once, one endpoint and unpacked remote key per connected peer.
#include "backend/transport/ucx_kv_transport.h"

#include <sys/mman.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

namespace duet::backend {

using policies::TransferId;
using policies::TransferStatus;

namespace {

Status UcsError(const char* what, ucs_status_t status) {
  return Status::Error(std::string("UCX ") + what + ": " + ucs_status_string(status));
}

// A UCP context for RMA with wake-up, over `tls` (empty: UCX's choice).
Result<ucp_context_h> InitContext(const std::string& tls) {
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcsError("config", s);
  }
  if (!tls.empty()) {
    if (ucs_status_t s = ucp_config_modify(config, "TLS", tls.c_str()); s != UCS_OK) {
      ucp_config_release(config);
      return UcsError(("TLS " + tls).c_str(), s);
    }
  }
  // The instances of one `duet serve` share a machine: network transports (tcp) use the
  // loopback device only, so their listening sockets take no connection from another host.
  // A user's own UCX_NET_DEVICES (ucp_config_read took it) is kept.
  if (std::getenv("UCX_NET_DEVICES") == nullptr) {
    if (ucs_status_t s = ucp_config_modify(config, "NET_DEVICES", "lo"); s != UCS_OK) {
      ucp_config_release(config);
      return UcsError("NET_DEVICES lo", s);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  const ucs_status_t init = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (init != UCS_OK) return UcsError("init", init);
  return context;
}

}  // namespace

// A context and the memory registered (or allocated) in it, released when the last of the
// UcxKvMemory and the transports over it goes.
struct UcxKvMemory::Mapping {
  std::string tls;
  ucp_context_h context = nullptr;
  ucp_mem_h memh = nullptr;
  void* base = nullptr;
  std::size_t length = 0;
  ~Mapping() {
    if (memh) ucp_mem_unmap(context, memh);
    if (context) ucp_cleanup(context);
  }
  // Maps `length` bytes at `address` in a new context: registers them, or allocates them
  // when address is null.
  static Result<std::shared_ptr<Mapping>> Create(void* address, std::size_t length,
                                                 const std::string& tls) {
    auto m = std::make_shared<Mapping>();
    m->tls = tls;
    auto context = InitContext(tls);
    if (!context.ok()) return context.status();
    m->context = *context;
    ucp_mem_map_params_t map{};
    map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                     UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    map.address = address;
    map.length = length;
    map.flags = address == nullptr ? UCP_MEM_MAP_ALLOCATE : 0;
    if (ucs_status_t s = ucp_mem_map(m->context, &map, &m->memh); s != UCS_OK) {
      m->memh = nullptr;
      return UcsError(address ? "registering the KV region" : "allocating the KV region", s);
    }
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    if (ucs_status_t s = ucp_mem_query(m->memh, &attr); s != UCS_OK) {
      return UcsError("querying the KV region", s);
    }
    m->base = attr.address;
    m->length = attr.length;
    return m;
  }
};

Result<std::unique_ptr<UcxKvMemory>> UcxKvMemory::Allocate(std::int64_t bytes,
                                                           const std::string& tls) {
  if (bytes <= 0) return Status::Error("UCX KV memory: nothing to allocate");
  auto mapping = Mapping::Create(nullptr, static_cast<std::size_t>(bytes), tls);
  if (!mapping.ok()) return mapping.status();
  return std::unique_ptr<UcxKvMemory>(new UcxKvMemory(std::move(*mapping)));
}

void* UcxKvMemory::data() { return mapping_->base; }

namespace {

// Over shared memory UCX maps a peer's KV region into this process (ucp_rkey_ptr gives its
// address here), and a pull is a memcpy from it; the first read of each page then page-faults,
// which made the first pull of each part of a prefill worker's pool several times slower than
// the rest (docs/validation.md). Maps every page of it, on a thread of its own: the kernel
// fills the page tables (MADV_POPULATE_READ, Linux 5.14), or, where it cannot, one read a page
// does. Pulls meanwhile read what is mapped and fault on the rest, as before.
//
// In chunks: one madvise holds the process's memory-map lock for all of its length (a GiB
// region: a few hundred milliseconds), and every other thread's mmap waits behind it; a
// decode worker's first step, which allocates, took over 200 ms instead of about 11 or 27 as
// now (docs/validation.md).
// Between chunks the lock is free, and Stop ends the work at the next one.
class PeerPageMapper {
 public:
  static constexpr std::uintptr_t kChunkBytes = std::uintptr_t{16} << 20;

  PeerPageMapper(void* local, std::int64_t bytes)
      : thread_([this, local, bytes] { Map(local, bytes); }) {}
  ~PeerPageMapper() { Stop(); }
  PeerPageMapper(const PeerPageMapper&) = delete;
  PeerPageMapper& operator=(const PeerPageMapper&) = delete;
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Map(void* local, std::int64_t bytes) {
    const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto from = reinterpret_cast<std::uintptr_t>(local) & ~(page - 1);
    const auto to = reinterpret_cast<std::uintptr_t>(local) + static_cast<std::uintptr_t>(bytes);
    for (std::uintptr_t a = from; a < to && !stop_.load(std::memory_order_relaxed);
         a += kChunkBytes) {
      const std::uintptr_t end = std::min(to, a + kChunkBytes);
#ifdef MADV_POPULATE_READ
      if (madvise(reinterpret_cast<void*>(a), end - a, MADV_POPULATE_READ) == 0) continue;
#endif
      for (std::uintptr_t p = a; p < end; p += page)
        (void)*reinterpret_cast<volatile const unsigned char*>(p);
    }
  }

  std::atomic<bool> stop_{false};  // before thread_: set before the thread starts
  std::thread thread_;
};

}  // namespace

struct UcxKvTransport::Impl {
  policies::InstanceId self = policies::kNoInstance;
  std::string path;
  KvRegion region;
  std::shared_ptr<UcxKvMemory::Mapping> mapping;  // released after the worker is destroyed
  ucp_worker_h worker = nullptr;
  std::string address;     // this worker's
  std::string remote_key;  // this region's, packed
  struct Peer {
    ucp_ep_h ep = nullptr;
    ucp_rkey_h rkey = nullptr;
    std::uint64_t base = 0;
    KvRegion region;
    std::shared_ptr<PeerPageMapper> map_pages;  // stopped before the rkey goes
  };
  std::map<policies::InstanceId, Peer> peers;
  // Transfers in flight, in slots reused once they finish, so that a pull allocates nothing
  // once warm (over shared memory a 64 KiB pull takes one to two microseconds). An id is its
  // slot's index plus a sequence number above kSlotBits: never reused.
  struct Transfer {
    TransferId id = 0;            // 0: a free slot
    std::vector<void*> requests;  // UCX requests still in flight
    KvTransferRecord record;
    std::chrono::steady_clock::time_point start;
  };
  static constexpr int kSlotBits = 24;
  static constexpr TransferId kSlotMask = (TransferId{1} << kSlotBits) - 1;
  std::vector<Transfer> transfers;
  static constexpr int kIdlePolls = 64;
  int polls_without_progress = 0;  // Poll skips progress for transfers already complete
  std::vector<std::uint32_t> free_slots;
  std::uint64_t sequence = 1;

  Transfer& NewTransfer() {
    std::uint32_t slot;
    if (free_slots.empty()) {
      DUET_CHECK_MSG(transfers.size() <= kSlotMask, "too many KV pulls in flight");
      slot = static_cast<std::uint32_t>(transfers.size());
      transfers.emplace_back();
    } else {
      slot = free_slots.back();
      free_slots.pop_back();
    }
    Transfer& t = transfers[slot];
    t.id = (sequence++ << kSlotBits) | slot;
    return t;
  }
  Transfer* Find(TransferId id) {
    const std::size_t slot = id & kSlotMask;
    return slot < transfers.size() && transfers[slot].id == id ? &transfers[slot] : nullptr;
  }
  void Release(Transfer& t) {
    free_slots.push_back(static_cast<std::uint32_t>(t.id & kSlotMask));
    t.id = 0;
    t.requests.clear();
  }

  void Close(Peer& p) {
    if (p.map_pages) p.map_pages->Stop();
    if (p.rkey) ucp_rkey_destroy(p.rkey);
    if (!p.ep) return;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* close = ucp_ep_close_nbx(p.ep, &param);
    // Bounded: a forced close completes locally.
    for (int i = 0; UCS_PTR_IS_PTR(close) && i < 100000; ++i) {
      ucp_worker_progress(worker);
      if (ucp_request_check_status(close) != UCS_INPROGRESS) break;
    }
    if (UCS_PTR_IS_PTR(close)) ucp_request_free(close);
  }

  void FlushWorker(std::chrono::milliseconds limit) {
    ucp_request_param_t param{};
    void* flush = ucp_worker_flush_nbx(worker, &param);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (UCS_PTR_IS_PTR(flush) && ucp_request_check_status(flush) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker);
    }
    if (UCS_PTR_IS_PTR(flush)) ucp_request_free(flush);  // released once done, if not yet
  }

  ~Impl() {
    for (Transfer& t : transfers) {
      for (void* r : t.requests) {
        ucp_request_cancel(worker, r);
        ucp_request_free(r);
      }
    }
    // UCX 1.13 aborts in ucp_worker_destroy when a wireup message (the reply to a peer that
    // connected to this worker a moment ago) is still pending on an endpoint the worker made
    // for itself: let pending wireup traffic go out first, for at most 200 ms.
    if (worker) FlushWorker(std::chrono::milliseconds(200));
    for (auto& [id, p] : peers) Close(p);
    if (worker) ucp_worker_destroy(worker);
  }
};

UcxKvTransport::UcxKvTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxKvTransport::~UcxKvTransport() = default;

Result<std::unique_ptr<UcxKvTransport>> UcxKvTransport::Create(policies::InstanceId self,
                                                               KvRegion region,
                                                               const std::string& tls) {
  if (region.base == nullptr || region.block_bytes <= 0 || region.num_blocks <= 0) {
    return Status::Error("UCX KV transport: an empty KV region");
  }
  auto impl = std::make_unique<Impl>();
  impl->self = self;
  impl->region = region;
  impl->path = "ucx:" + (tls.empty() ? std::string("auto") : tls);
  const auto length = static_cast<std::size_t>(region.block_bytes * region.num_blocks);
  if (auto* memory = dynamic_cast<UcxKvMemory*>(region.memory)) {
    impl->mapping = memory->mapping_;
    const auto* base = static_cast<const char*>(impl->mapping->base);
    const auto* begin = static_cast<const char*>(region.base);
    if (begin < base || begin + length > base + impl->mapping->length) {
      return Status::Error("UCX KV transport: the KV region lies outside its UCX memory");
    }
    if (impl->mapping->tls != tls) {
      return Status::Error("UCX KV transport: the KV memory was allocated for UCX_TLS '" +
                           impl->mapping->tls + "', not '" + tls + "'");
    }
  } else {
    auto mapping = UcxKvMemory::Mapping::Create(region.base, length, tls);
    if (!mapping.ok()) return mapping.status();
    impl->mapping = std::move(*mapping);
  }
  const ucp_context_h context = impl->mapping->context;
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucs_status_t s = ucp_worker_create(context, &worker_params, &impl->worker); s != UCS_OK) {
    return UcsError("worker", s);
  }
  ucp_address_t* address = nullptr;
  std::size_t address_size = 0;
  if (ucs_status_t s = ucp_worker_get_address(impl->worker, &address, &address_size); s != UCS_OK) {
    return UcsError("worker address", s);
  }
  impl->address.assign(reinterpret_cast<const char*>(address), address_size);
  ucp_worker_release_address(impl->worker, address);
  void* key = nullptr;
  std::size_t key_size = 0;
  if (ucs_status_t s = ucp_rkey_pack(context, impl->mapping->memh, &key, &key_size); s != UCS_OK) {
    return UcsError("packing the remote key", s);
  }
  impl->remote_key.assign(static_cast<const char*>(key), key_size);
  ucp_rkey_buffer_release(key);
  return std::unique_ptr<UcxKvTransport>(new UcxKvTransport(std::move(impl)));
}

std::string UcxKvTransport::Descriptor() const {
  UcxPeerDescriptor d;
  d.worker_address = impl_->address;
  d.base = reinterpret_cast<std::uint64_t>(impl_->region.base);
  d.region.block_bytes = impl_->region.block_bytes;
  d.region.num_blocks = impl_->region.num_blocks;
  d.remote_key = impl_->remote_key;
  return EncodeUcxDescriptor(d);
}

Status UcxKvTransport::Connect(policies::InstanceId peer, std::string_view descriptor) {
  Result<UcxPeerDescriptor> d = ParseUcxDescriptor(descriptor);
  if (!d.ok()) return d.status();
  if (impl_->peers.count(peer)) {
    return Status::Error("UCX KV transport: instance " + std::to_string(peer) +
                         " is already connected");
  }
  Impl::Peer p;
  p.base = d->base;
  p.region = d->region;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = reinterpret_cast<const ucp_address_t*>(d->worker_address.data());
  if (ucs_status_t s = ucp_ep_create(impl_->worker, &ep, &p.ep); s != UCS_OK) {
    return UcsError("endpoint", s);
  }
  if (ucs_status_t s = ucp_ep_rkey_unpack(p.ep, d->remote_key.data(), &p.rkey); s != UCS_OK) {
    p.rkey = nullptr;
    impl_->Close(p);
    return UcsError("remote key", s);
  }
  void* local = nullptr;
  if (ucp_rkey_ptr(p.rkey, p.base, &local) == UCS_OK)
    p.map_pages =
        std::make_shared<PeerPageMapper>(local, p.region.block_bytes * p.region.num_blocks);
  impl_->peers[peer] = p;
  return Status::Ok();
}

void UcxKvTransport::SetSelf(policies::InstanceId self) { impl_->self = self; }

Status UcxKvTransport::Flush(policies::InstanceId peer, double timeout_s) {
  auto it = impl_->peers.find(peer);
  if (it == impl_->peers.end()) return Status::Ok();  // a pull from it fails, saying so
  ucp_request_param_t param{};
  void* request = ucp_ep_flush_nbx(it->second.ep, &param);
  if (request == nullptr) return Status::Ok();
  if (UCS_PTR_IS_ERR(request)) return UcsError("flush", UCS_PTR_STATUS(request));
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  ucs_status_t status = UCS_INPROGRESS;
  while (status == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
    ucp_worker_progress(impl_->worker);
    status = ucp_request_check_status(request);
  }
  if (status == UCS_INPROGRESS) ucp_request_cancel(impl_->worker, request);
  while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(impl_->worker);
  ucp_request_free(request);
  if (status == UCS_INPROGRESS) return Status::Error("UCX flush: the peer did not answer");
  return status == UCS_OK ? Status::Ok() : UcsError("flush", status);
}

void UcxKvTransport::Disconnect(policies::InstanceId peer) {
  auto it = impl_->peers.find(peer);
  if (it == impl_->peers.end()) return;
  impl_->Close(it->second);
  impl_->peers.erase(it);
}

TransferId UcxKvTransport::Post(const policies::KvTransferRequest& transfer) {
  Impl& im = *impl_;
  Impl::Transfer& t = im.NewTransfer();
  const TransferId id = t.id;
  t.start = std::chrono::steady_clock::now();
  t.record = {transfer.request, transfer.src, transfer.dst, 0, 0, im.path, false, {}};
  auto peer = im.peers.find(transfer.src);
  const KvRegion* src = peer == im.peers.end() ? nullptr : &peer->second.region;
  const KvRegion* dst = transfer.dst == im.self ? &im.region : nullptr;
  t.record.error = CheckKvTransfer(transfer, src, dst);
  if (!t.record.error.empty()) return id;
  const std::int64_t block_bytes = im.region.block_bytes;
  ForEachBlockRun(transfer.src_blocks, transfer.dst_blocks, [&](const BlockRun& run) {
    ucp_request_param_t param{};
    void* request = ucp_get_nbx(peer->second.ep,
                                static_cast<char*>(im.region.base) + run.dst_block * block_bytes,
                                static_cast<std::size_t>(run.blocks * block_bytes),
                                peer->second.base + static_cast<std::uint64_t>(run.src_block) *
                                                        static_cast<std::uint64_t>(block_bytes),
                                peer->second.rkey, &param);
    if (UCS_PTR_IS_ERR(request)) {
      t.record.error = std::string("UCX get: ") + ucs_status_string(UCS_PTR_STATUS(request));
      return false;
    }
    if (request != nullptr) t.requests.push_back(request);
    return true;
  });
  t.record.bytes = static_cast<std::int64_t>(transfer.src_blocks.size()) * block_bytes;
  return id;
}

TransferStatus UcxKvTransport::Poll(TransferId id) {
  Impl& im = *impl_;
  Impl::Transfer* found = im.Find(id);
  DUET_CHECK_MSG(found != nullptr, "poll of an unknown or finished transfer");
  Impl::Transfer& t = *found;
  // Gets that completed when posted (a copy from a peer's mapped shared memory) need no
  // progress, and a 64 KiB pull over shared memory takes about 1.5 us, where a progress call per
  // poll shows. The worker is still progressed every kIdlePolls polls for what else it serves.
  if (!t.requests.empty() || ++im.polls_without_progress >= Impl::kIdlePolls) {
    im.polls_without_progress = 0;
    Progress();
  }
  for (std::size_t i = 0; i < t.requests.size();) {
    const ucs_status_t s = ucp_request_check_status(t.requests[i]);
    if (s == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    ucp_request_free(t.requests[i]);
    t.requests.erase(t.requests.begin() + static_cast<std::ptrdiff_t>(i));
    if (s != UCS_OK && t.record.error.empty()) {
      t.record.error = std::string("UCX get: ") + ucs_status_string(s);
    }
  }
  // A failed transfer still waits for its gets in flight: they write into the region.
  if (!t.requests.empty()) return TransferStatus::kInProgress;
  t.record.ok = t.record.error.empty();
  if (!t.record.ok) t.record.bytes = 0;
  t.record.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t.start).count();
  const TransferStatus status = t.record.ok ? TransferStatus::kDone : TransferStatus::kFailed;
  Record(std::move(t.record));
  im.Release(t);
  return status;
}

void UcxKvTransport::Progress() {
  // Until UCX has nothing more to do now, at most a bounded number of rounds.
  for (int i = 0; i < 64 && ucp_worker_progress(impl_->worker) != 0; ++i) {
  }
}

int UcxKvTransport::WakeupFd() {
  int fd = -1;
  return ucp_worker_get_efd(impl_->worker, &fd) == UCS_OK ? fd : -1;
}

bool UcxKvTransport::Arm() { return ucp_worker_arm(impl_->worker) == UCS_OK; }

}  // namespace duet::backend
