// The registry of KV transports (kv_transport_registry.h): it lists what this build has (UCX
// only with UCX, CUDA IPC only where the CUDA plugin was made), an unknown name's error lists
// the names, a transport is refused for what it cannot serve with a reason, auto chooses the
// first that serves, and loopback sides connect by descriptor within this process only.
#include "backend/transport/kv_transport_registry.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "backend/transport/local_kv_transports.h"

namespace duet::backend {
namespace {

std::vector<std::string> Names() {
  std::vector<std::string> names;
  for (const KvTransportEntry& t : KvTransports()) names.push_back(t.name);
  return names;
}

TEST(KvTransportRegistry, ListsWhatThisBuildHasEachWithWhatItServes) {
  std::vector<std::string> expected = {"loopback"};
  if (DUET_HAVE_UCX) expected.push_back("ucx");
  if (DUET_TEST_CUDA_PLUGIN) expected.push_back("cuda-ipc");
  EXPECT_EQ(Names(), expected);
  std::string joined;
  for (const std::string& name : expected) joined += (joined.empty() ? "" : ", ") + name;
  EXPECT_EQ(KvTransportNames(), joined);
  for (const KvTransportEntry& t : KvTransports()) {
    EXPECT_FALSE(t.description.empty()) << t.name;
    EXPECT_TRUE(t.threads || t.processes) << t.name;
    EXPECT_TRUE(t.create) << t.name;
    EXPECT_NE(DescribeKvTransports().find(t.name + " (" + t.description + ")"), std::string::npos);
    auto found = FindKvTransport(t.name);
    ASSERT_TRUE(found.ok()) << found.error();
    EXPECT_EQ(*found, &t);
  }
}

TEST(KvTransportRegistry, AnUnknownNameIsAnErrorListingTheNames) {
  const auto pigeon = FindKvTransport("pigeon");
  ASSERT_FALSE(pigeon.ok());
  EXPECT_EQ(pigeon.error(),
            "unknown KV transport 'pigeon' (this build has: " + KvTransportNames() + ")");
  const auto chosen = ChooseKvTransport("--kv-transport", "pigeon", {});
  ASSERT_FALSE(chosen.ok());
  EXPECT_EQ(chosen.error(), "--kv-transport: " + pigeon.error());
  // One Duet has but this build lacks says why instead.
  if (!DUET_HAVE_UCX) {
    EXPECT_NE(FindKvTransport("ucx").error().find("has no UCX"), std::string::npos);
  }
  if (!DUET_TEST_CUDA_PLUGIN) {
    EXPECT_NE(FindKvTransport("cuda-ipc").error().find("no CUDA plugin"), std::string::npos);
  }
}

TEST(KvTransportRegistry, RefusesWhatATransportCannotServeSayingWhy) {
  const KvTransportMode threads{.processes = false, .device = "cpu"};
  const KvTransportMode processes{.processes = true, .device = "cpu"};
  ASSERT_TRUE(ChooseKvTransport("--kv-transport", "loopback", threads).ok());
  const auto loopback = ChooseKvTransport("--kv-transport", "loopback", processes);
  ASSERT_FALSE(loopback.ok());
  EXPECT_EQ(loopback.error(),
            "--kv-transport loopback moves KV within one process: use --workers thread");
  const auto on_gpu =
      ChooseKvTransport("--kv-transport", "loopback", {.processes = false, .device = "cuda"});
  ASSERT_FALSE(on_gpu.ok());
  EXPECT_NE(on_gpu.error().find("use --device cpu"), std::string::npos) << on_gpu.error();
  if (DUET_TEST_CUDA_PLUGIN) {
    // The CPU backend's KV is in host memory, which CUDA IPC cannot map.
    for (const KvTransportMode& mode : {threads, processes}) {
      const auto cuda = ChooseKvTransport("--kv-transport", "cuda-ipc", mode);
      ASSERT_FALSE(cuda.ok());
      EXPECT_EQ(cuda.error(),
                "--kv-transport cuda-ipc moves KV in GPU memory, and the CPU backend (--device "
                "cpu) keeps its KV in host memory: use --device cuda");
    }
    const auto gpu =
        ChooseKvTransport("--kv-transport", "cuda-ipc", {.processes = true, .device = "cuda"});
    ASSERT_TRUE(gpu.ok()) << gpu.error();
  }
}

TEST(KvTransportRegistry, AutoChoosesTheFirstThatServes) {
  auto threads = ChooseKvTransport("--kv-transport", "auto", {.processes = false, .device = "cpu"});
  ASSERT_TRUE(threads.ok()) << threads.error();
  EXPECT_EQ((*threads)->name, "loopback");
  auto processes =
      ChooseKvTransport("--kv-transport", "auto", {.processes = true, .device = "cpu"});
  if (DUET_HAVE_UCX) {
    ASSERT_TRUE(processes.ok()) << processes.error();
    EXPECT_EQ((*processes)->name, "ucx");
  } else {
    ASSERT_FALSE(processes.ok());
    EXPECT_EQ(processes.error(),
              "--kv-transport auto: no KV transport of this build (loopback) moves KV between "
              "worker processes on --device cpu");
  }
}

// The one transport whose sides this machine can always make: loopback sides connect by the
// descriptors they publish, and refuse one that is malformed or of another process.
TEST(KvTransportRegistry, LoopbackSidesConnectByDescriptorWithinThisProcessOnly) {
  auto loopback = FindKvTransport("loopback");
  ASSERT_TRUE(loopback.ok());
  std::vector<unsigned char> a(4 * 64, 7), b(4 * 64, 0);
  auto source = (*loopback)->create(0, {a.data(), 64, 4, nullptr}, {});
  auto sink = (*loopback)->create(1, {b.data(), 64, 4, nullptr}, {});
  ASSERT_TRUE(source.ok() && sink.ok());
  const std::string descriptor = (*source)->Descriptor();
  ASSERT_TRUE((*sink)->Connect(0, descriptor).ok());
  EXPECT_FALSE((*sink)->Connect(0, descriptor).ok());  // connected already
  const std::vector<BlockId> blocks = {2};
  EXPECT_EQ((*sink)->Poll((*sink)->Post({1, 0, 1, 64, blocks, blocks})),
            policies::TransferStatus::kDone);
  EXPECT_EQ(b[2 * 64], 7);
  EXPECT_EQ(b[0], 0);
  (*sink)->Disconnect(0);
  EXPECT_EQ((*sink)->Poll((*sink)->Post({2, 0, 1, 64, blocks, blocks})),
            policies::TransferStatus::kFailed);

  // The process id follows the 4-byte magic and the 4-byte version.
  std::string other_process = descriptor;
  other_process[8] ^= 0x5a;
  const Status refused = (*sink)->Connect(0, other_process);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("loopback moves KV within one process"), std::string::npos)
      << refused.message();
  EXPECT_FALSE((*sink)->Connect(0, descriptor.substr(0, descriptor.size() - 1)).ok());
  EXPECT_FALSE((*sink)->Connect(0, descriptor + "x").ok());
  EXPECT_FALSE((*sink)->Connect(0, "DKVX" + descriptor.substr(4)).ok());
  EXPECT_TRUE((*sink)->Connect(0, descriptor).ok());
}

// A worker process's transport refuses one that cannot cross processes; colocated instances
// need none, whatever the options name.
TEST(KvTransportRegistry, AWorkersTransportMustServeWorkerProcesses) {
  std::vector<unsigned char> a(4 * 64);
  const auto worker = WorkerKvTransport::Create(
      policies::InstanceRole::kPrefill, KvRegion{a.data(), 64, 4, nullptr},
      {.transport = "loopback", .ucx_tls = "", .wrap = {}});
  ASSERT_FALSE(worker.ok());
  EXPECT_EQ(worker.error(), "loopback moves KV within one process, not between worker processes");
  EXPECT_TRUE(WorkerKvTransport::Create(policies::InstanceRole::kColocated, std::nullopt,
                                        {.transport = "pigeon", .ucx_tls = "", .wrap = {}})
                  .ok());
}

}  // namespace
}  // namespace duet::backend
