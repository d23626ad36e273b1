// The KV transport contract (kv_transport_contract.h), run against every transport this build
// has that needs no device (loopback, UCX over tcp and over shared memory, the worker
// processes' UCX transport, the fault-injecting wrapper passing everything through, and each
// registered transport that serves host memory as the registry's factory makes it; tests/gpu
// runs it over CUDA IPC). Then the fault-injecting wrapper's faults, and the UCX and CUDA IPC
// descriptor formats' parsers on malformed input.
#include "backend/transport/kv_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/transport/cuda_ipc_descriptor.h"
#include "backend/transport/kv_transport_registry.h"
#include "backend/transport/local_kv_transports.h"
#include "backend/transport/ucx_descriptor.h"
#include "tests/transport/kv_transport_contract.h"
#if DUET_HAVE_UCX
#include "backend/transport/ucx_kv_transport.h"
#endif

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
using policies::TransferId;
using policies::TransferStatus;

std::vector<Named> Transports() {
  std::vector<Named> all;
  all.push_back({"loopback", [](Region& src, Region& dst) {
                   auto h = std::make_unique<Harness>();
                   auto loopback = std::make_unique<LoopbackKvTransport>();
                   loopback->Register(kPrefill, src.region);
                   loopback->Register(kDecode, dst.region);
                   h->transport = loopback.get();
                   h->log = loopback.get();
                   h->owned.push_back(std::move(loopback));
                   return h;
                 }});
  all.push_back({"fault_injection_passing", [](Region& src, Region& dst) {
                   auto h = std::make_unique<Harness>();
                   auto loopback = std::make_unique<LoopbackKvTransport>();
                   loopback->Register(kPrefill, src.region);
                   loopback->Register(kDecode, dst.region);
                   auto faulty = std::make_unique<FaultInjectingKvTransport>(
                       *loopback, [](const KvTransferRequest&) {
                         return FaultInjectingKvTransport::Fault::kNone;
                       });
                   h->transport = faulty.get();
                   h->log = loopback.get();
                   h->owned.push_back(std::move(loopback));
                   h->owned.push_back(std::move(faulty));
                   return h;
                 }});
#if DUET_HAVE_UCX
  // Regions on the heap (registered), and in memory UCX allocated (UcxKvMemory, what
  // `duet worker` and PD `duet serve` give their models: over shared memory a peer maps it and
  // copies from it directly).
  for (const std::string tls : {"tcp", "posix,cma"}) {
    for (const bool ucx_memory : {false, true}) {
      const KvTransportOptions options{"ucx", tls, {}};
      all.push_back(
          {std::string(ucx_memory ? "ucx_memory_" : "ucx_") + (tls == "tcp" ? "tcp" : "shm"),
           [tls](Region& src, Region& dst) -> std::unique_ptr<Harness> {
             return ConnectedPair(UcxKvTransport::Create(kPrefill, src.region, tls),
                                  UcxKvTransport::Create(kDecode, dst.region, tls));
           },
           RegionMemory{ucx_memory ? KvTransportAllocator(options) : nullptr, {}, {}}});
    }
  }
  // The transport of a worker process: peers announced from another thread, connected at the
  // next post; the prefill side progressed by its own thread.
  all.push_back({"worker_ucx_tcp", [](Region& src, Region& dst) -> std::unique_ptr<Harness> {
                   KvTransportOptions options{"ucx", "tcp", {}};
                   auto source = WorkerKvTransport::Create(policies::InstanceRole::kPrefill,
                                                           src.region, options);
                   auto sink = WorkerKvTransport::Create(policies::InstanceRole::kDecode,
                                                         dst.region, options);
                   if (!source.ok() || !sink.ok()) {
                     ADD_FAILURE() << (source.ok() ? sink.error() : source.error());
                     return nullptr;
                   }
                   (*source)->SetSelf(kPrefill);
                   (*sink)->SetSelf(kDecode);
                   EXPECT_TRUE((*sink)->descriptor().empty());  // only prefill sides publish
                   std::thread([&] { (*sink)->SetPeer(kPrefill, (*source)->descriptor()); }).join();
                   auto h = std::make_unique<Harness>();
                   h->transport = sink->get();
                   h->log = (*sink)->log();
                   // The source and its progress thread go first: UCX 1.13 asserts in a
                   // progress call that meets a peer torn down during its wire-up.
                   h->owned.push_back(std::move(*source));
                   h->owned.push_back(std::move(*sink));
                   return h;
                 }});
#endif
  // Every transport of the registry that serves engine threads over host memory, as
  // LocalKvTransports makes them: each side by the entry's factory, connected by descriptor.
  for (const KvTransportEntry& entry : KvTransports()) {
    if (!CheckKvTransportServes(entry, {.processes = false, .device = "cpu"}).ok()) continue;
    all.push_back(
        {"registry_" + entry.name, [&entry](Region& src, Region& dst) -> std::unique_ptr<Harness> {
           const KvTransportOptions options{entry.name, "tcp", {}};
           return ConnectedPair(entry.create(kPrefill, src.region, options),
                                entry.create(kDecode, dst.region, options));
         }});
  }
  return all;
}
INSTANTIATE_TEST_SUITE_P(Transports, KvTransportContract, ::testing::ValuesIn(Transports()),
                         [](const ::testing::TestParamInfo<Named>& info) {
                           return info.param.name;
                         });

// The wrapper's faults, over the loopback transport.
class FaultInjection : public ::testing::Test {
 protected:
  using Fault = FaultInjectingKvTransport::Fault;
  Region src_{256, 8, 3};
  Region dst_{256, 8, 4};
  Region dst_before_{256, 8, 4};
  LoopbackKvTransport loopback_;
  void SetUp() override {
    loopback_.Register(kPrefill, src_.region);
    loopback_.Register(kDecode, dst_.region);
  }
  KvTransferRequest Transfer() {
    static const std::vector<BlockId> src = {0, 1, 2, 3}, dst = {4, 5, 6, 7};
    return {9, kPrefill, kDecode, 4 * 256, src, dst};
  }
  bool BlockMoved(int i) const {
    const std::vector<unsigned char> dst = dst_.Bytes(), src = src_.Bytes();
    return std::memcmp(dst.data() + (4 + i) * 256, src.data() + i * 256, 256) == 0;
  }
  bool Untouched() const { return dst_ == dst_before_; }
};

TEST_F(FaultInjection, FailedTransfersFailAndMoveNothing) {
  FaultInjectingKvTransport faulty(loopback_, [](auto&) { return Fault::kFail; });
  EXPECT_EQ(faulty.Poll(faulty.Post(Transfer())), TransferStatus::kFailed);
  EXPECT_TRUE(Untouched());
}

TEST_F(FaultInjection, DelayedTransfersStayInProgressThenFinish) {
  FaultInjectingKvTransport faulty(
      loopback_, [](auto&) { return Fault::kDelay; }, 3);
  const TransferId id = faulty.Post(Transfer());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(faulty.Poll(id), TransferStatus::kInProgress);
  EXPECT_EQ(faulty.Poll(id), TransferStatus::kDone);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(BlockMoved(i)) << i;
}

TEST_F(FaultInjection, DroppedTransfersNeverFinish) {
  FaultInjectingKvTransport faulty(loopback_, [](auto&) { return Fault::kDrop; });
  const TransferId id = faulty.Post(Transfer());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(faulty.Poll(id), TransferStatus::kInProgress);
}

TEST_F(FaultInjection, TruncatedTransfersFailAfterMovingHalf) {
  FaultInjectingKvTransport faulty(loopback_, [](auto&) { return Fault::kTruncate; });
  EXPECT_EQ(faulty.Poll(faulty.Post(Transfer())), TransferStatus::kFailed);
  EXPECT_TRUE(BlockMoved(0));
  EXPECT_TRUE(BlockMoved(1));
  EXPECT_FALSE(BlockMoved(2));
  EXPECT_FALSE(BlockMoved(3));
}

TEST_F(FaultInjection, TheRuleChoosesPerTransfer) {
  FaultInjectingKvTransport faulty(loopback_, [](const KvTransferRequest& t) {
    return t.request == 9 ? Fault::kFail : Fault::kNone;
  });
  KvTransferRequest other = Transfer();
  other.request = 10;
  EXPECT_EQ(faulty.Poll(faulty.Post(Transfer())), TransferStatus::kFailed);
  EXPECT_EQ(faulty.Poll(faulty.Post(other)), TransferStatus::kDone);
}

TEST(BlockRuns, MergesBlocksConsecutiveOnBothSides) {
  const std::vector<BlockId> src = {1, 2, 3, 7, 8, 4};
  const std::vector<BlockId> dst = {5, 6, 9, 10, 11, 12, 13};  // longer: room to grow
  std::vector<BlockRun> runs;
  ForEachBlockRun(src, dst, [&](const BlockRun& run) {
    runs.push_back(run);
    return true;
  });
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].src_block, 1);
  EXPECT_EQ(runs[0].dst_block, 5);
  EXPECT_EQ(runs[0].blocks, 2);  // 1,2 -> 5,6
  EXPECT_EQ(runs[1].blocks, 1);  // 3 -> 9 (dst jumps)
  EXPECT_EQ(runs[2].src_block, 7);
  EXPECT_EQ(runs[2].dst_block, 10);
  EXPECT_EQ(runs[2].blocks, 2);  // 7,8 -> 10,11
  EXPECT_EQ(runs[3].src_block, 4);
  EXPECT_EQ(runs[3].dst_block, 12);
  EXPECT_EQ(runs[3].blocks, 1);  // 4 -> 12 (src jumps back)

  int calls = 0;  // false stops the walk
  ForEachBlockRun(src, dst, [&](const BlockRun&) { return ++calls < 2; });
  EXPECT_EQ(calls, 2);
}

TEST(UcxDescriptor, RoundTripsAndRejectsEveryMalformation) {
  UcxPeerDescriptor d;
  d.worker_address = std::string("\x01\x02\x03worker", 9);
  d.base = 0x7f0012345000;
  d.region.block_bytes = 4096;
  d.region.num_blocks = 100;
  d.remote_key = "key bytes";
  const std::string bytes = EncodeUcxDescriptor(d);
  Result<UcxPeerDescriptor> back = ParseUcxDescriptor(bytes);
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back->worker_address, d.worker_address);
  EXPECT_EQ(back->base, d.base);
  EXPECT_EQ(back->region.block_bytes, 4096);
  EXPECT_EQ(back->region.num_blocks, 100);
  EXPECT_EQ(back->remote_key, d.remote_key);
  // Every truncation, and one byte too many.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(ParseUcxDescriptor(std::string_view(bytes).substr(0, n)).ok()) << n;
  }
  const Result<UcxPeerDescriptor> longer = ParseUcxDescriptor(bytes + "x");
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.error().find("after its end"), std::string::npos) << longer.error();
  std::string wrong_version = bytes;
  wrong_version[4] = 2;
  EXPECT_NE(ParseUcxDescriptor(wrong_version).error().find("version 2"), std::string::npos);
  UcxPeerDescriptor huge = d;
  huge.region.num_blocks = std::int64_t{1} << 40;
  EXPECT_NE(ParseUcxDescriptor(EncodeUcxDescriptor(huge)).error().find("out of range"),
            std::string::npos);
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_FALSE(ParseUcxDescriptor(bad_magic).ok());
}

#if DUET_HAVE_UCX
TEST(CudaIpcDescriptor, RoundTripsAndRejectsEveryMalformation) {
  CudaIpcPeerDescriptor d;
  d.pid = 4242;
  for (std::size_t i = 0; i < d.device_uuid.size(); ++i) d.device_uuid[i] = 0xa0 + i;
  for (std::size_t i = 0; i < d.handle.size(); ++i) d.handle[i] = static_cast<unsigned char>(i);
  d.base = 0x7f0012345000;
  d.offset = 4096;
  d.block_bytes = 65536;
  d.num_blocks = 100;
  const std::string bytes = EncodeCudaIpcDescriptor(d);
  Result<CudaIpcPeerDescriptor> back = ParseCudaIpcDescriptor(bytes);
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back->pid, d.pid);
  EXPECT_EQ(back->device_uuid, d.device_uuid);
  EXPECT_EQ(back->handle, d.handle);
  EXPECT_EQ(back->base, d.base);
  EXPECT_EQ(back->offset, d.offset);
  EXPECT_EQ(back->block_bytes, d.block_bytes);
  EXPECT_EQ(back->num_blocks, d.num_blocks);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(ParseCudaIpcDescriptor(std::string_view(bytes).substr(0, n)).ok()) << n;
  }
  auto error = [](const CudaIpcPeerDescriptor& x) {
    const auto r = ParseCudaIpcDescriptor(EncodeCudaIpcDescriptor(x));
    return r.ok() ? std::string() : r.error();
  };
  EXPECT_NE(ParseCudaIpcDescriptor(bytes + "x").error().find("after its end"), std::string::npos);
  std::string wrong_version = bytes;
  wrong_version[4] = 2;
  EXPECT_NE(ParseCudaIpcDescriptor(wrong_version).error().find("version 2"), std::string::npos);
  std::string ucx = bytes;
  ucx[3] = 'U';  // another transport's descriptor
  EXPECT_NE(ParseCudaIpcDescriptor(ucx).error().find("DKVC"), std::string::npos);
  CudaIpcPeerDescriptor x = d;
  x.num_blocks = 0;
  EXPECT_NE(error(x).find("out of range"), std::string::npos);
  x = d;
  x.block_bytes = std::int64_t{1} << 40;
  x.num_blocks = std::int64_t{1} << 31;  // their product overflows
  EXPECT_NE(error(x).find("out of range"), std::string::npos);
  x = d;
  x.base = ~std::uint64_t{0} - 4096;  // the region would wrap past the address space
  EXPECT_NE(error(x).find("address out of range"), std::string::npos);
  x = d;
  x.pid = 0;
  EXPECT_NE(error(x).find("process id 0"), std::string::npos);
}

TEST(UcxTransport, ConnectRejectsAMalformedDescriptorAndASecondConnection) {
  Region a(256, 4, 1), b(256, 4, 2);
  auto ta = UcxKvTransport::Create(kPrefill, a.region, "tcp");
  auto tb = UcxKvTransport::Create(kDecode, b.region, "tcp");
  ASSERT_TRUE(ta.ok() && tb.ok());
  const Status bad = (*tb)->Connect(kPrefill, "DKVU");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("UCX KV descriptor"), std::string::npos) << bad.message();
  ASSERT_TRUE((*tb)->Connect(kPrefill, (*ta)->Descriptor()).ok());
  EXPECT_FALSE((*tb)->Connect(kPrefill, (*ta)->Descriptor()).ok());
}

// The permissions of the mapping of this process that holds `address` ("rw-s": shared), from
// /proc/self/maps; empty when none does.
std::string MappingPermissions(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  std::string line;
  while (std::getline(maps, line)) {
    std::uintptr_t begin = 0, end = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &begin, &end, perms) == 3 && begin <= a && a < end)
      return perms;
  }
  return "";
}

TEST(UcxKvMemory, OverSharedMemoryTransportsIsSharedMemory) {
  // What lets a peer process copy from it directly rather than by a system call per pull.
  auto memory = UcxKvMemory::Allocate(1 << 20, "posix,cma");
  ASSERT_TRUE(memory.ok()) << memory.error();
  EXPECT_EQ(MappingPermissions((*memory)->data()), "rw-s");
  auto any = UcxKvMemory::Allocate(1 << 20, "");  // UCX's choice, as `duet worker` defaults
  ASSERT_TRUE(any.ok()) << any.error();
  EXPECT_EQ(MappingPermissions((*any)->data()), "rw-s");
  EXPECT_FALSE(UcxKvMemory::Allocate(0, "").ok());
}

TEST(UcxKvMemory, ATransportOverItChecksItsRegionAndKeepsItAllocated) {
  const KvTransportOptions options{"ucx", "posix,cma", {}};
  Region src(4096, 4, 5, RegionMemory{KvTransportAllocator(options), {}, {}});
  Region dst(4096, 4, 6);
  const Region src_before(4096, 4, 5);
  KvRegion outside = src.region;
  outside.base = static_cast<char*>(outside.base) + 4096;  // its last block past the memory
  auto bad = UcxKvTransport::Create(kPrefill, outside, "posix,cma");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), "UCX KV transport: the KV region lies outside its UCX memory");
  auto other_tls = UcxKvTransport::Create(kPrefill, src.region, "tcp");
  ASSERT_FALSE(other_tls.ok());
  EXPECT_EQ(other_tls.error(),
            "UCX KV transport: the KV memory was allocated for UCX_TLS 'posix,cma', not 'tcp'");

  auto source = UcxKvTransport::Create(kPrefill, src.region, "posix,cma");
  auto sink = UcxKvTransport::Create(kDecode, dst.region, "posix,cma");
  ASSERT_TRUE(source.ok() && sink.ok());
  ASSERT_TRUE((*sink)->Connect(kPrefill, (*source)->Descriptor()).ok());
  src.memory.reset();  // the model goes first; the transport still serves the memory
  const std::vector<BlockId> blocks = {0, 1, 2, 3};
  const TransferId id = (*sink)->Post({1, kPrefill, kDecode, 4 * 4096, blocks, blocks});
  TransferStatus status = TransferStatus::kInProgress;
  for (int i = 0; i < 100000 && status == TransferStatus::kInProgress; ++i) {
    (*source)->Progress();
    status = (*sink)->Poll(id);
  }
  ASSERT_EQ(status, TransferStatus::kDone);
  EXPECT_TRUE(dst == src_before);
}
#else
TEST(UcxTransport, NotInThisBuild) {
  GTEST_SKIP() << "this build has no UCX (libucx-dev, which scripts/setup.sh installs): the UCX "
                  "cases of the contract suite do not run";
}
#endif

}  // namespace
}  // namespace duet::backend
