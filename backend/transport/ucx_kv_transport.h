// The UCX KV transport: the decode side pulls a request's blocks with RMA gets from the
// prefill side's KV region (one ucp_get_nbx per run of consecutive blocks), over whichever UCX
// transports are allowed (tcp, shared memory, cma on this machine; CUDA memory where UCX has
// it). Each side maps its region once (ucp_mem_map: registered, or allocated by UCX where the
// model's memory is a UcxKvMemory) and publishes a descriptor: its worker address, the
// region's address, block size and count, and the packed remote key, in a versioned, bounded
// binary format that the frontend relays; a peer Connects with it. A side that is pulled from
// must call Progress() now and then (over tcp, UCX serves a get with the target's help), or
// sleep on WakeupFd() between calls (PeerKvTransport says how). Not thread-safe: one thread at a
// time uses an instance.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/transport/kv_transport.h"
#include "backend/transport/ucx_descriptor.h"
#include "common/status.h"

namespace duet::backend {

// KV memory that UCX allocates (ucp_mem_map with UCP_MEM_MAP_ALLOCATE) in a UCP context of its
// own, which a UcxKvTransport over it shares: on this machine shared memory (System V or POSIX,
// where UCX_TLS allows them), which a peer's UCX maps into its own address space when it
// connects, so a pull over shared memory is one memcpy by the puller instead of a system call
// per get (cma), as for memory the transport only registers. Without a shared-memory transport
// (tcp), ordinary memory. It stays allocated while a transport over it lives.
class UcxKvMemory final : public KvMemory {
 public:
  static Result<std::unique_ptr<UcxKvMemory>> Allocate(std::int64_t bytes, const std::string& tls);
  void* data() override;
  struct Mapping;  // the UCP context and the registration

 private:
  friend class UcxKvTransport;
  explicit UcxKvMemory(std::shared_ptr<Mapping> mapping) : mapping_(std::move(mapping)) {}
  std::shared_ptr<Mapping> mapping_;
};

class UcxKvTransport final : public PeerKvTransport {
 public:
  // tls: UCX_TLS for this transport ("tcp", "posix,cma", ...); empty: UCX's choice. A region
  // whose memory is a UcxKvMemory (allocated for the same tls) is used as UCX allocated it;
  // any other is registered.
  static Result<std::unique_ptr<UcxKvTransport>> Create(policies::InstanceId self, KvRegion region,
                                                        const std::string& tls);
  ~UcxKvTransport() override;
  UcxKvTransport(const UcxKvTransport&) = delete;
  UcxKvTransport& operator=(const UcxKvTransport&) = delete;

  std::string Descriptor() const override;
  void SetSelf(policies::InstanceId self) override;
  Status Connect(policies::InstanceId peer, std::string_view descriptor) override;
  // Waits up to `timeout_s` for the endpoint to `peer` to be wired up (the peer must make
  // progress meanwhile): a peer that goes away later then finds an established endpoint (UCX
  // 1.13 asserts when one vanishes in the middle of its wire-up). No effect for an unknown peer.
  Status Flush(policies::InstanceId peer, double timeout_s) override;
  // Its endpoint is closed with force, so pulls from it in flight fail.
  void Disconnect(policies::InstanceId peer) override;

  // Pulls into this side's region: transfer.dst must be this instance, transfer.src a
  // connected peer.
  policies::TransferId Post(const policies::KvTransferRequest& transfer) override;
  policies::TransferStatus Poll(policies::TransferId id) override;
  // Over tcp UCX serves a get with the target's help, so a side pulled from makes progress.
  bool NeedsProgress() const override { return true; }
  void Progress() override;
  int WakeupFd() override;
  bool Arm() override;

 private:
  struct Impl;
  explicit UcxKvTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace duet::backend
