// The simulated tier storage port (sim/sim_tier_storage.h) on the tiered PD cluster's platform
// (tests/sim/shared_simulation.h), posted and polled from the test's thread: each kind of I/O
// takes its route's latency plus its bytes over the narrowest link, I/O that names no such
// tier, node or instance fails on its first poll, and I/O whose link fails fails.
#include "sim/sim_tier_storage.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tests/sim/shared_simulation.h"

namespace duet::sim {
namespace {

namespace sg4 = simgrid::s4u;
using policies::TierIo;
using policies::TierKind;
using policies::TransferStatus;

constexpr Bytes kBytes = 64 << 20;
using testing::kPollS;

// Instance 0 on GPU 0 of node 0, instance 1 on GPUs 0 and 1 of node 1 (TP2).
struct Storage {
  std::vector<SimKvEndpoint> instances;
  std::unique_ptr<SimTierStorage> storage;
  const Platform* platform = testing::Shared().platform.get();

  Storage() {
    if (!platform) return;
    instances = {{{platform->gpus[0][0]}, {}}, {{platform->gpus[1][0], platform->gpus[1][1]}, {}}};
    storage = std::make_unique<SimTierStorage>(*platform, instances, testing::DirectStart());
  }
  // Posts `io` and polls until it finishes (bounded: 10 s simulated); returns its status and
  // how long it took.
  std::pair<TransferStatus, double> Run(const TierIo& io) {
    const double start = sg4::Engine::get_clock();
    const policies::TierIoId id = storage->Post(io);
    const TransferStatus s = testing::PollUntilDone([&] { return storage->Poll(id); }, 10.0);
    return {s, sg4::Engine::get_clock() - start};
  }
};

TierIo Io(bool read, TierKind tier, int node, policies::InstanceId instance,
          TierKind from = TierKind::kDram) {
  TierIo io;
  io.read = read;
  io.tier = tier;
  io.node = node;
  io.instance = instance;
  io.from = from;
  io.blocks = 32;
  io.bytes = kBytes;
  return io;
}

TEST(SimTierStorage, EachIoTakesItsRoutesLatencyPlusBytesOverItsNarrowestLink) {
  Storage s;
  ASSERT_NE(s.storage, nullptr);
  const Platform& p = *s.platform;
  ASSERT_EQ(p.ssds.size(), 2u);
  ASSERT_EQ(p.remote_store, nullptr);
  struct Case {
    const char* what;
    TierIo io;
    const sg4::Host *src, *dst;
    double bytes;  // on that route (a TP shard's share)
  };
  const std::vector<Case> cases = {
      {"GPU to DRAM", Io(false, TierKind::kDram, 0, 0), p.gpus[0][0], p.node_hosts[0], kBytes},
      {"DRAM to GPU", Io(true, TierKind::kDram, 0, 0), p.node_hosts[0], p.gpus[0][0], kBytes},
      {"SSD to GPU", Io(true, TierKind::kSsd, 0, 0), p.ssds[0], p.gpus[0][0], kBytes},
      {"DRAM to SSD", Io(false, TierKind::kSsd, 1, policies::kNoInstance, TierKind::kDram),
       p.node_hosts[1], p.ssds[1], kBytes},
      {"SSD to DRAM", Io(false, TierKind::kDram, 1, policies::kNoInstance, TierKind::kSsd),
       p.ssds[1], p.node_hosts[1], kBytes},
      {"TP2 GPUs to DRAM, a shard each", Io(false, TierKind::kDram, 1, 1), p.gpus[1][1],
       p.node_hosts[1], kBytes / 2.0},
  };
  for (const Case& c : cases) {
    const auto [status, took] = s.Run(c.io);
    EXPECT_EQ(status, TransferStatus::kDone) << c.what;
    const double want = testing::LoneTransferSeconds(c.src, c.dst, c.bytes);
    EXPECT_GE(took, want * (1 - 1e-9)) << c.what;
    EXPECT_LE(took, want + kPollS) << c.what;
  }
  EXPECT_EQ(s.storage->times(TierKind::kDram, false).count, 3);
  EXPECT_EQ(s.storage->times(TierKind::kSsd, true).count, 1);
}

TEST(SimTierStorage, IoNamingNoSuchTierNodeOrInstanceFailsOnItsFirstPoll) {
  Storage s;
  ASSERT_NE(s.storage, nullptr);
  const std::vector<std::pair<const char*, TierIo>> bad = {
      {"no remote store", Io(false, TierKind::kRemote, 0, 0)},
      {"node past the cluster", Io(false, TierKind::kDram, 2, 0)},
      {"negative node", Io(true, TierKind::kSsd, -1, 0)},
      {"unknown instance", Io(false, TierKind::kDram, 0, 7)},
      {"tier to itself", Io(false, TierKind::kSsd, 0, policies::kNoInstance, TierKind::kSsd)},
      {"from no remote store",
       Io(false, TierKind::kDram, 0, policies::kNoInstance, TierKind::kRemote)},
  };
  for (const auto& [what, io] : bad) {
    const policies::TierIoId id = s.storage->Post(io);
    EXPECT_EQ(s.storage->Poll(id), TransferStatus::kFailed) << what;
  }
  for (const TierKind kind : {TierKind::kDram, TierKind::kSsd, TierKind::kRemote}) {
    for (const bool read : {false, true}) EXPECT_EQ(s.storage->times(kind, read).count, 0);
  }
}

TEST(SimTierStorage, IoWhoseLinkFailsMidWayFails) {
  Storage s;
  ASSERT_NE(s.storage, nullptr);
  const Platform& p = *s.platform;
  std::vector<sg4::Link*> route;
  p.node_hosts[0]->route_to(p.ssds[0], route, nullptr);
  ASSERT_FALSE(route.empty());
  const policies::TierIoId id =
      s.storage->Post(Io(false, TierKind::kSsd, 0, policies::kNoInstance, TierKind::kDram));
  testing::RunFor(testing::LoneTransferSeconds(p.node_hosts[0], p.ssds[0], kBytes) / 2);
  EXPECT_EQ(s.storage->Poll(id), TransferStatus::kInProgress);
  route.back()->turn_off();
  testing::RunFor(kPollS);
  const TransferStatus status = s.storage->Poll(id);
  route.back()->turn_on();  // the platform is shared with the other tests
  EXPECT_EQ(status, TransferStatus::kFailed);
  EXPECT_EQ(s.storage->times(TierKind::kSsd, false).count, 0);
}

}  // namespace
}  // namespace duet::sim
