// The CUDA IPC KV transport (see cuda_ipc_kv_transport.h).
#include "backend/cuda/cuda_ipc_kv_transport.h"

#include <cuda.h>  // driver types of cuMemGetAddressRange, found at run time (no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <vector>

#include "backend/transport/cuda_ipc_descriptor.h"

namespace duet::backend {
namespace {

using Clock = std::chrono::steady_clock;
using policies::InstanceId;
using policies::TransferId;
using policies::TransferStatus;

std::string CudaError(const char* what, cudaError_t err) {
  cudaGetLastError();  // clears the error it also left behind
  return std::string(what) + ": " + cudaGetErrorString(err);
}

// The allocation holding `ptr`: its base and size (cuMemGetAddressRange, through the runtime's
// driver entry point so the binary needs no libcuda to start on a machine without a driver).
Status AllocationOf(void* ptr, CUdeviceptr* base, std::size_t* size) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 3020,
                                                           cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr)
    return Status::Error("the driver has no cuMemGetAddressRange");
  auto range = reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn);
  if (range(base, size, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
    return Status::Error("the KV region is not inside a device allocation");
  return Status::Ok();
}

// The device whose UUID this is, or -1.
int DeviceWithUuid(const std::array<unsigned char, 16>& uuid) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return -1;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess &&
        std::memcmp(prop.uuid.bytes, uuid.data(), uuid.size()) == 0)
      return d;
  }
  return -1;
}

}  // namespace

struct CudaIpcKvTransport::Impl {
  struct Peer {
    KvRegion region;         // mapped into this process (base: where to copy from)
    void* opened = nullptr;  // the allocation cudaIpcOpenMemHandle mapped; null in-process
  };
  struct Transfer {
    InstanceId src = policies::kNoInstance;
    cudaEvent_t event = nullptr;  // recorded after its copies; null when it failed at Post
    KvTransferRecord record;
    Clock::time_point start;
  };

  InstanceId self = policies::kNoInstance;
  KvRegion region;
  int device = 0;
  cudaStream_t stream = nullptr;
  std::string descriptor;
  std::map<InstanceId, Peer> peers;
  std::map<TransferId, Transfer> transfers;
  std::vector<cudaEvent_t> spare_events;
  TransferId next = 1;

  ~Impl() {
    if (stream) cudaStreamSynchronize(stream);
    for (auto& [id, peer] : peers) {
      if (peer.opened) cudaIpcCloseMemHandle(peer.opened);
    }
    for (auto& [id, t] : transfers) {
      if (t.event) cudaEventDestroy(t.event);
    }
    for (cudaEvent_t e : spare_events) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }

  Result<cudaEvent_t> TakeEvent() {
    if (!spare_events.empty()) {
      cudaEvent_t e = spare_events.back();
      spare_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess)
      return Status::Error(CudaError("cudaEventCreateWithFlags", err));
    return e;
  }
};

CudaIpcKvTransport::CudaIpcKvTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaIpcKvTransport::~CudaIpcKvTransport() = default;

Result<std::unique_ptr<CudaIpcKvTransport>> CudaIpcKvTransport::Create(InstanceId self,
                                                                       KvRegion region) {
  if (region.base == nullptr || region.block_bytes <= 0 || region.num_blocks <= 0)
    return Status::Error("CUDA IPC: an empty KV region");
  cudaPointerAttributes attr{};
  if (cudaError_t err = cudaPointerGetAttributes(&attr, region.base); err != cudaSuccess)
    return Status::Error(CudaError("CUDA IPC: cudaPointerGetAttributes", err));
  if (attr.type != cudaMemoryTypeDevice)
    return Status::Error("CUDA IPC: the KV region is not device memory");
  auto impl = std::make_unique<Impl>();
  impl->self = self;
  impl->region = region;
  impl->device = attr.device;
  if (cudaError_t err = cudaSetDevice(impl->device); err != cudaSuccess)
    return Status::Error(CudaError("CUDA IPC: cudaSetDevice", err));

  CUdeviceptr alloc_base = 0;
  std::size_t alloc_size = 0;
  if (Status s = AllocationOf(region.base, &alloc_base, &alloc_size); !s.ok())
    return Status::Error("CUDA IPC: " + s.message());
  const auto base = reinterpret_cast<std::uint64_t>(region.base);
  const auto size = static_cast<std::uint64_t>(region.block_bytes * region.num_blocks);
  if (base < alloc_base || base + size > alloc_base + alloc_size)
    return Status::Error("CUDA IPC: the KV region runs past the end of its allocation");

  CudaIpcPeerDescriptor d;
  d.pid = static_cast<std::uint32_t>(::getpid());
  cudaDeviceProp prop{};
  if (cudaError_t err = cudaGetDeviceProperties(&prop, impl->device); err != cudaSuccess)
    return Status::Error(CudaError("CUDA IPC: cudaGetDeviceProperties", err));
  std::memcpy(d.device_uuid.data(), prop.uuid.bytes, d.device_uuid.size());
  cudaIpcMemHandle_t handle{};
  if (cudaError_t err = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(alloc_base));
      err != cudaSuccess)
    return Status::Error(CudaError("CUDA IPC: cudaIpcGetMemHandle", err));
  static_assert(sizeof handle == sizeof d.handle);
  std::memcpy(d.handle.data(), &handle, sizeof handle);
  d.base = base;
  d.offset = base - alloc_base;
  d.block_bytes = region.block_bytes;
  d.num_blocks = region.num_blocks;
  impl->descriptor = EncodeCudaIpcDescriptor(d);

  if (cudaError_t err = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
      err != cudaSuccess)
    return Status::Error(CudaError("CUDA IPC: cudaStreamCreateWithFlags", err));
  return std::unique_ptr<CudaIpcKvTransport>(new CudaIpcKvTransport(std::move(impl)));
}

std::string CudaIpcKvTransport::Descriptor() const { return impl_->descriptor; }

void CudaIpcKvTransport::SetSelf(InstanceId self) { impl_->self = self; }

Status CudaIpcKvTransport::Connect(InstanceId peer, std::string_view descriptor) {
  if (impl_->peers.count(peer))
    return Status::Error("CUDA IPC: instance " + std::to_string(peer) + " is already connected");
  auto d = ParseCudaIpcDescriptor(descriptor);
  if (!d.ok()) return d.status();
  if (DeviceWithUuid(d->device_uuid) < 0)
    return Status::Error("CUDA IPC: instance " + std::to_string(peer) +
                         "'s device is not visible to this process");
  Impl::Peer p;
  p.region.block_bytes = d->block_bytes;
  p.region.num_blocks = d->num_blocks;
  if (d->pid == static_cast<std::uint32_t>(::getpid())) {
    p.region.base = reinterpret_cast<void*>(d->base);
  } else {
    cudaIpcMemHandle_t handle{};
    std::memcpy(&handle, d->handle.data(), sizeof handle);
    if (cudaError_t err = cudaSetDevice(impl_->device); err != cudaSuccess)
      return Status::Error(CudaError("CUDA IPC: cudaSetDevice", err));
    if (cudaError_t err = cudaIpcOpenMemHandle(&p.opened, handle, cudaIpcMemLazyEnablePeerAccess);
        err != cudaSuccess)
      return Status::Error(CudaError(
          ("CUDA IPC: opening instance " + std::to_string(peer) + "'s KV memory").c_str(), err));
    p.region.base = static_cast<char*>(p.opened) + d->offset;
  }
  impl_->peers[peer] = p;
  return Status::Ok();
}

void CudaIpcKvTransport::Disconnect(InstanceId peer) {
  auto it = impl_->peers.find(peer);
  if (it == impl_->peers.end()) return;
  // Nothing may still be copying from a mapping about to close.
  cudaStreamSynchronize(impl_->stream);
  for (auto& [id, t] : impl_->transfers) {
    if (t.src == peer && t.record.error.empty()) t.record.error = "the source instance left";
  }
  if (it->second.opened) cudaIpcCloseMemHandle(it->second.opened);
  impl_->peers.erase(it);
}

TransferId CudaIpcKvTransport::Post(const policies::KvTransferRequest& transfer) {
  Impl& m = *impl_;
  Impl::Transfer t;
  t.src = transfer.src;
  t.start = Clock::now();
  t.record = {transfer.request, transfer.src, transfer.dst, 0, 0, "cuda_ipc", false, {}};
  auto peer = m.peers.find(transfer.src);
  const KvRegion* src = peer == m.peers.end() ? nullptr : &peer->second.region;
  const KvRegion* dst = transfer.dst == m.self ? &m.region : nullptr;
  t.record.error = CheckKvTransfer(transfer, src, dst);
  if (t.record.error.empty()) {
    if (cudaError_t err = cudaSetDevice(m.device); err != cudaSuccess)
      t.record.error = CudaError("cudaSetDevice", err);
  }
  if (t.record.error.empty()) {
    ForEachBlockRun(transfer.src_blocks, transfer.dst_blocks, [&](const BlockRun& run) {
      const cudaError_t err = cudaMemcpyAsync(
          static_cast<char*>(dst->base) + run.dst_block * dst->block_bytes,
          static_cast<const char*>(src->base) + run.src_block * src->block_bytes,
          static_cast<std::size_t>(run.blocks * src->block_bytes), cudaMemcpyDefault, m.stream);
      if (err != cudaSuccess) t.record.error = CudaError("cudaMemcpyAsync", err);
      return err == cudaSuccess;
    });
    // Even after a failed copy: the event marks when the runs queued before it are done.
    if (auto event = m.TakeEvent(); !event.ok()) {
      if (t.record.error.empty()) t.record.error = event.error();
    } else if (cudaError_t err = cudaEventRecord(*event, m.stream); err != cudaSuccess) {
      m.spare_events.push_back(*event);
      if (t.record.error.empty()) t.record.error = CudaError("cudaEventRecord", err);
      cudaStreamSynchronize(m.stream);
    } else {
      t.event = *event;
    }
    if (t.record.error.empty())
      t.record.bytes = static_cast<std::int64_t>(transfer.src_blocks.size()) * src->block_bytes;
  }
  const TransferId id = m.next++;
  m.transfers.emplace(id, std::move(t));
  return id;
}

TransferStatus CudaIpcKvTransport::Poll(TransferId id) {
  Impl& m = *impl_;
  auto it = m.transfers.find(id);
  DUET_CHECK_MSG(it != m.transfers.end(), "poll of an unknown or finished transfer");
  Impl::Transfer& t = it->second;
  if (t.event) {
    const cudaError_t err = cudaEventQuery(t.event);
    if (err == cudaErrorNotReady) return TransferStatus::kInProgress;
    if (err != cudaSuccess && t.record.error.empty()) t.record.error = CudaError("the copy", err);
    m.spare_events.push_back(t.event);
  }
  t.record.ok = t.record.error.empty();
  if (!t.record.ok) t.record.bytes = 0;
  t.record.seconds = std::chrono::duration<double>(Clock::now() - t.start).count();
  const TransferStatus status = t.record.ok ? TransferStatus::kDone : TransferStatus::kFailed;
  Record(std::move(t.record));
  m.transfers.erase(it);
  return status;
}

}  // namespace duet::backend
