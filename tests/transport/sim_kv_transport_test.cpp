// The simulated KV transport (sim/sim_kv_transport.h) under the transport contract, on the
// platform of a bundled PD cluster (a prefill GPU on one node, a decode GPU on the other;
// tests/sim/shared_simulation.h), and its times against the platform's links. Posted and
// polled from the test's thread; the tests share one engine, each with transports of its own.
#include "sim/sim_kv_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "sim/platform.h"
#include "tests/sim/shared_simulation.h"
#include "tests/transport/kv_transport_contract.h"

namespace duet::sim {
namespace {

namespace sg4 = simgrid::s4u;
using backend::contract::Harness;
using backend::contract::kDecode;
using backend::contract::kPrefill;
using backend::contract::KvTransportContract;
using backend::contract::Named;
using backend::contract::Region;
using policies::KvBlockLayout;
using policies::KvTransferRequest;
using policies::TransferId;
using policies::TransferStatus;

// A simulated transport with instance kPrefill on the first `tp` GPUs of node 0, kDecode on
// node 1's.
struct World {
  std::vector<SimKvEndpoint> endpoints;
  std::unique_ptr<SimKvTransport> transport;

  World(KvBlockLayout src, KvBlockLayout dst, std::size_t tp = 1) {
    const Platform* platform = testing::Shared().platform.get();
    if (!platform) return;
    auto gpus = [&](int node) {
      const auto& all = platform->gpus[static_cast<std::size_t>(node)];
      return std::vector<sg4::Host*>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(tp));
    };
    static_assert(kPrefill == 0 && kDecode == 1);
    endpoints = {{gpus(0), src}, {gpus(1), dst}};
    transport = std::make_unique<SimKvTransport>(endpoints, testing::DirectStart());
  }
  // Polls until the transfer finishes (bounded: 1 s of simulated time).
  TransferStatus Wait(TransferId id) {
    return testing::PollUntilDone([&] { return transport->Poll(id); }, 1.0);
  }
};

KvBlockLayout LayoutOf(const Region& r) { return {r.region.block_bytes, r.region.num_blocks}; }

std::vector<Named> Transports() {
  Named sim{"sim", [](Region& src, Region& dst) {
              auto h = std::make_unique<Harness>();
              auto world = std::make_shared<World>(LayoutOf(src), LayoutOf(dst));
              if (!world->transport) return std::unique_ptr<Harness>();
              h->transport = world->transport.get();
              h->log = world->transport.get();
              h->progress_source = [] { testing::RunFor(1e-5); };
              h->keep_alive.push_back(std::move(world));
              return h;
            }};
  sim.moves_bytes = false;
  return {sim};
}
INSTANTIATE_TEST_SUITE_P(Simulated, KvTransportContract, ::testing::ValuesIn(Transports()),
                         [](const ::testing::TestParamInfo<Named>& info) {
                           return info.param.name;
                         });

// What a lone transfer takes between the two instances' first GPUs.
double LoneTransferSeconds(const World& w, double bytes) {
  return testing::LoneTransferSeconds(w.endpoints.front().gpus.front(),
                                      w.endpoints.back().gpus.front(), bytes);
}

constexpr KvBlockLayout kLayout{1 << 20, 64};  // 1 MiB blocks

TEST(SimKvTransport, ALoneTransferTakesLatencyPlusBytesOverTheNarrowestLink) {
  World w(kLayout, kLayout);
  ASSERT_NE(w.transport, nullptr);
  const std::vector<policies::KvBlockManager::BlockId> src = {0, 1, 2, 3}, dst = {7, 8, 9, 10};
  const Bytes bytes = 4 * kLayout.block_bytes - 1000;  // a partly filled last block
  const double start = sg4::Engine::get_clock();
  ASSERT_EQ(w.Wait(w.transport->Post({5, kPrefill, kDecode, bytes, src, dst})),
            TransferStatus::kDone);
  const double want = LoneTransferSeconds(w, static_cast<double>(bytes));
  ASSERT_EQ(w.transport->records().size(), 1u);
  const policies::KvTransferRecord& r = w.transport->records().front();
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.bytes, bytes);
  EXPECT_EQ(r.path, "sim");
  // Seen finished at the first poll after its modelled end.
  EXPECT_GE(r.seconds, want * (1 - 1e-9));
  EXPECT_LE(r.seconds, want + testing::kPollS);
  EXPECT_NEAR(sg4::Engine::get_clock() - start, r.seconds, 1e-12);
}

TEST(SimKvTransport, TransfersOnOneRouteShareItsBandwidth) {
  World w(kLayout, kLayout);
  ASSERT_NE(w.transport, nullptr);
  const std::vector<policies::KvBlockManager::BlockId> a = {0, 1, 2, 3}, b = {4, 5, 6, 7};
  const Bytes bytes = 4 * kLayout.block_bytes;
  const TransferId first = w.transport->Post({1, kPrefill, kDecode, bytes, a, a});
  const TransferId second = w.transport->Post({2, kPrefill, kDecode, bytes, b, b});
  EXPECT_EQ(w.Wait(first), TransferStatus::kDone);
  EXPECT_EQ(w.Wait(second), TransferStatus::kDone);
  // Together they move twice the bytes over the same narrowest link, at once.
  const double want = LoneTransferSeconds(w, 2.0 * static_cast<double>(bytes));
  ASSERT_EQ(w.transport->records().size(), 2u);
  for (const policies::KvTransferRecord& r : w.transport->records()) {
    EXPECT_GE(r.seconds, want * (1 - 1e-9)) << "request " << r.request;
    EXPECT_LE(r.seconds, want + testing::kPollS) << "request " << r.request;
  }
}

TEST(SimKvTransport, TensorParallelShardsMoveInParallel) {
  // TP2 on both sides: each shard moves half the bytes between corresponding GPUs, each over
  // its own PCIe and NIC; the switch is wide enough for both.
  World w(kLayout, kLayout, 2);
  ASSERT_NE(w.transport, nullptr);
  const std::vector<policies::KvBlockManager::BlockId> blocks = {0, 1, 2, 3};
  const Bytes bytes = 4 * kLayout.block_bytes;
  ASSERT_EQ(w.Wait(w.transport->Post({3, kPrefill, kDecode, bytes, blocks, blocks})),
            TransferStatus::kDone);
  const double want = LoneTransferSeconds(w, static_cast<double>(bytes) / 2);
  const policies::KvTransferRecord& r = w.transport->records().front();
  EXPECT_EQ(r.bytes, bytes);
  EXPECT_GE(r.seconds, want * (1 - 1e-9));
  EXPECT_LE(r.seconds, want + testing::kPollS);
}

TEST(SimKvTransport, ALinkFailingMidTransferFailsItWithItsRecord) {
  World w(kLayout, kLayout);
  ASSERT_NE(w.transport, nullptr);
  std::vector<sg4::Link*> route;
  w.endpoints.front().gpus.front()->route_to(w.endpoints.back().gpus.front(), route, nullptr);
  ASSERT_FALSE(route.empty());
  const std::vector<policies::KvBlockManager::BlockId> blocks = {0, 1, 2, 3};
  const TransferId id =
      w.transport->Post({4, kPrefill, kDecode, 4 * kLayout.block_bytes, blocks, blocks});
  testing::RunFor(LoneTransferSeconds(w, 4.0 * kLayout.block_bytes) / 2);
  EXPECT_EQ(w.transport->Poll(id), TransferStatus::kInProgress);
  sg4::Link* nic = route[1];
  nic->turn_off();
  testing::RunFor(testing::kPollS);
  const TransferStatus status = w.Wait(id);
  nic->turn_on();  // the platform is shared with the other tests
  EXPECT_EQ(status, TransferStatus::kFailed);
  ASSERT_EQ(w.transport->records().size(), 1u);
  const policies::KvTransferRecord& r = w.transport->records().front();
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bytes, 0);
  EXPECT_NE(r.error.find("the simulated transfer failed"), std::string::npos) << r.error;
  EXPECT_EQ(w.transport->totals().failed, 1);
}

}  // namespace
}  // namespace duet::sim
