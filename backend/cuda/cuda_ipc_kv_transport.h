// The CUDA IPC KV transport: the decode side pulls a request's blocks from the prefill side's
// KV region in device memory on the same machine, one cudaMemcpyAsync per run of consecutive
// blocks on a stream of its own, and polls an event recorded after them. Each side publishes a
// descriptor of its region (cuda_ipc_descriptor.h: the CUDA IPC handle of the allocation that
// holds it); a peer in another process opens the handle once, at Connect, and a peer in the
// same process (where CUDA does not open a process's own handles) copies from the address.
// Between two devices the copy goes peer to peer where they allow it (NVLink or PCIe), staged
// by the driver otherwise. Not thread-safe: one thread at a time uses an instance.
//
// Written and compiled everywhere nvcc is; it has run only where a device was lent
// (tests/gpu/cuda_ipc_transport_test.cpp skips without one). The CUDA plugin makes it for the
// transport registry (`--kv-transport cuda-ipc`), but no model exposes a device region yet
// (CudaModel keeps one K and one V array per layer), so PD over it stops at start, saying so.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "backend/transport/kv_transport.h"
#include "common/status.h"

namespace duet::backend {

class CudaIpcKvTransport final : public PeerKvTransport {
 public:
  // `region` must be device memory inside one cudaMalloc allocation.
  static Result<std::unique_ptr<CudaIpcKvTransport>> Create(policies::InstanceId self,
                                                            KvRegion region);
  ~CudaIpcKvTransport() override;
  CudaIpcKvTransport(const CudaIpcKvTransport&) = delete;
  CudaIpcKvTransport& operator=(const CudaIpcKvTransport&) = delete;

  std::string Descriptor() const override;
  void SetSelf(policies::InstanceId self) override;
  // A second Connect to a connected peer is an error (Disconnect first).
  Status Connect(policies::InstanceId peer, std::string_view descriptor) override;
  // Waits for the copies from the peer in flight, which then fail, and closes its mapping.
  void Disconnect(policies::InstanceId peer) override;

  // Pulls into this side's region: transfer.dst must be this instance, transfer.src a
  // connected peer.
  policies::TransferId Post(const policies::KvTransferRequest& transfer) override;
  policies::TransferStatus Poll(policies::TransferId id) override;

 private:
  struct Impl;
  explicit CudaIpcKvTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace duet::backend
