// The KV transport contract (tests/transport/kv_transport_contract.h) over the CUDA IPC
// transport, on device memory: a source in this process (copied from by address) and a source
// in another process (duet_cuda_ipc_peer, whose region is opened through its IPC handle), and
// sides made as the transport registry makes them, by the CUDA plugin.
// Then what Create and Connect refuse, and Disconnect. Every test skips without a device.
#include "backend/cuda/cuda_ipc_kv_transport.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/transport/kv_transport_registry.h"
#include "kernels/cuda/device_buffer.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/transport/kv_transport_contract.h"

namespace duet::backend {
namespace {

using contract::ConnectedPair;
using contract::Harness;
using contract::kDecode;
using contract::kPrefill;
using contract::KvTransportContract;
using contract::Named;
using contract::Region;
using contract::RegionMemory;
using policies::KvTransferRequest;
using policies::TransferStatus;

class DeviceKvMemory final : public KvMemory {
 public:
  explicit DeviceKvMemory(std::int64_t bytes) : buffer_(static_cast<std::size_t>(bytes)) {}
  void* data() override { return buffer_.get(); }

 private:
  kernels::cuda::DeviceBuffer<unsigned char> buffer_;
};

RegionMemory DeviceMemory() {
  return {[](std::int64_t bytes) -> Result<std::unique_ptr<KvMemory>> {
            return std::unique_ptr<KvMemory>(std::make_unique<DeviceKvMemory>(bytes));
          },
          [](void* dst, const void* src, std::size_t n) {
            DUET_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
          },
          [](void* dst, const void* src, std::size_t n) {
            DUET_CUDA_CHECK(cudaDeviceSynchronize());
            DUET_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
          }};
}

std::string NoDevice() {
  return kernels::cuda::DeviceCount() == 0
             ? "needs a CUDA device: " + kernels::cuda::DescribeDevice()
             : std::string();
}

// duet_cuda_ipc_peer running with a region like the contract's source: killed when released.
class PeerProcess {
 public:
  ~PeerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  // Starts it and reads its descriptor (hex, one line) within 60 s; empty on failure.
  std::string Start(std::int64_t block_bytes, std::int64_t blocks, unsigned seed) {
    int fds[2];
    if (::pipe(fds) != 0) return {};
    // Beside this test's executable (gpu_check.sh runs binaries copied elsewhere).
    std::error_code ec;
    const std::string bin =
        (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "duet_cuda_ipc_peer")
            .string();
    const std::string a = std::to_string(block_bytes), b = std::to_string(blocks),
                      c = std::to_string(seed);
    pid_ = ::fork();
    if (pid_ == 0) {  // no CUDA call before exec
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::execl(bin.c_str(), bin.c_str(), a.c_str(), b.c_str(), c.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
    std::string hex;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    char ch = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      if (::read(out_, &ch, 1) != 1) return {};  // it exited
      if (ch == '\n') break;
      hex += ch;
    }
    std::string bytes;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
      bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    return bytes;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
};

std::vector<Named> Transports() {
  std::vector<Named> all;
  all.push_back({"cuda_ipc_same_process",
                 [](Region& src, Region& dst) -> std::unique_ptr<Harness> {
                   return ConnectedPair(CudaIpcKvTransport::Create(kPrefill, src.region),
                                        CudaIpcKvTransport::Create(kDecode, dst.region));
                 },
                 DeviceMemory(), NoDevice});
  // The source region lives in another process, made with the contract source's size and
  // seed, so the local `src` holds the same bytes for the comparisons.
  all.push_back({"cuda_ipc_other_process",
                 [](Region& src, Region& dst) -> std::unique_ptr<Harness> {
                   auto peer = std::make_shared<PeerProcess>();
                   const std::string descriptor =
                       peer->Start(src.region.block_bytes, src.region.num_blocks, 1);
                   if (descriptor.empty()) {
                     ADD_FAILURE() << "duet_cuda_ipc_peer gave no descriptor";
                     return nullptr;
                   }
                   auto sink = CudaIpcKvTransport::Create(kDecode, dst.region);
                   if (!sink.ok()) {
                     ADD_FAILURE() << sink.error();
                     return nullptr;
                   }
                   if (Status s = (*sink)->Connect(kPrefill, descriptor); !s.ok()) {
                     ADD_FAILURE() << s.message();
                     return nullptr;
                   }
                   auto h = std::make_unique<Harness>();
                   h->keep_alive.push_back(peer);
                   h->transport = sink->get();
                   h->log = sink->get();
                   h->owned.push_back(std::move(*sink));
                   return h;
                 },
                 DeviceMemory(), NoDevice});
  // As `--kv-transport cuda-ipc` makes its sides: through the registry's factory, which has
  // the CUDA plugin (loaded here) make them.
  all.push_back({"cuda_ipc_registry",
                 [](Region& src, Region& dst) -> std::unique_ptr<Harness> {
                   auto entry = FindKvTransport("cuda-ipc");
                   if (!entry.ok()) {
                     ADD_FAILURE() << entry.error();
                     return nullptr;
                   }
                   return ConnectedPair((*entry)->create(kPrefill, src.region, {}),
                                        (*entry)->create(kDecode, dst.region, {}));
                 },
                 DeviceMemory(), NoDevice});
  return all;
}

INSTANTIATE_TEST_SUITE_P(CudaIpc, KvTransportContract, ::testing::ValuesIn(Transports()),
                         [](const ::testing::TestParamInfo<Named>& info) {
                           return info.param.name;
                         });

TEST(CudaIpcTransport, RefusesHostMemoryAMalformedDescriptorAndASecondConnection) {
  DUET_REQUIRE_CUDA_DEVICE();
  std::vector<unsigned char> host(4096 * 4);
  const auto on_host = CudaIpcKvTransport::Create(kPrefill, {host.data(), 4096, 4, nullptr});
  ASSERT_FALSE(on_host.ok());
  EXPECT_NE(on_host.error().find("not device memory"), std::string::npos) << on_host.error();

  kernels::cuda::DeviceBuffer<unsigned char> a(4096 * 4), b(4096 * 4);
  auto source = CudaIpcKvTransport::Create(kPrefill, {a.get(), 4096, 4, nullptr});
  auto sink = CudaIpcKvTransport::Create(kDecode, {b.get(), 4096, 4, nullptr});
  ASSERT_TRUE(source.ok()) << source.error();
  ASSERT_TRUE(sink.ok()) << sink.error();
  // Far past the end of its allocation (whatever the driver rounds it up to).
  EXPECT_FALSE(CudaIpcKvTransport::Create(kPrefill, {a.get(), 4096, 1 << 20, nullptr}).ok());
  EXPECT_FALSE((*sink)->Connect(kPrefill, "not a descriptor").ok());
  ASSERT_TRUE((*sink)->Connect(kPrefill, (*source)->Descriptor()).ok());
  EXPECT_FALSE((*sink)->Connect(kPrefill, (*source)->Descriptor()).ok());
}

TEST(CudaIpcTransport, AfterDisconnectPullsFromThePeerFail) {
  DUET_REQUIRE_CUDA_DEVICE();
  kernels::cuda::DeviceBuffer<unsigned char> a(std::vector<unsigned char>(4096 * 4, 1));
  kernels::cuda::DeviceBuffer<unsigned char> b(std::vector<unsigned char>(4096 * 4, 2));
  auto source = CudaIpcKvTransport::Create(kPrefill, {a.get(), 4096, 4, nullptr});
  auto sink = CudaIpcKvTransport::Create(kDecode, {b.get(), 4096, 4, nullptr});
  ASSERT_TRUE(source.ok() && sink.ok());
  ASSERT_TRUE((*sink)->Connect(kPrefill, (*source)->Descriptor()).ok());
  const std::vector<BlockId> blocks = {0, 1};
  const KvTransferRequest t{1, kPrefill, kDecode, 2 * 4096, blocks, blocks};
  (*sink)->Disconnect(kPrefill);
  EXPECT_EQ((*sink)->Poll((*sink)->Post(t)), TransferStatus::kFailed);
  EXPECT_EQ(b.ToHost(), std::vector<unsigned char>(4096 * 4, 2));
  // It can connect again.
  ASSERT_TRUE((*sink)->Connect(kPrefill, (*source)->Descriptor()).ok());
  const auto id = (*sink)->Post(t);
  TransferStatus s = TransferStatus::kInProgress;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s == TransferStatus::kInProgress && std::chrono::steady_clock::now() < deadline)
    s = (*sink)->Poll(id);
  EXPECT_EQ(s, TransferStatus::kDone);
  std::vector<unsigned char> want(4096 * 4, 2);
  std::fill(want.begin(), want.begin() + 2 * 4096, 1);
  EXPECT_EQ(b.ToHost(), want);
}

}  // namespace
}  // namespace duet::backend
