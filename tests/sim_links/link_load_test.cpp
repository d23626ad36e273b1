// links.csv's bytes are counted by hand on the route of every transfer the simulator starts
// (World::Transfer, sim/world.h), not read from SimGrid's link-load plugin
// (simgrid/plugins/load.h). SimGrid 3.32's plugin integrates a link's load by sampling it only
// when a communication crossing that link starts or ends, and holds the sampled rate over the
// whole interval since the previous sample: it counts each communication's latency phase at its
// bandwidth rate, and misses the rate changes that communications on other links cause. Over
// the Mooncake hour it is 1.7% over the count on a busy NIC of h100-8p8d-llama8b, 11% over on
// the switch of its tiered variant, and many times over on links that carry only control
// messages (docs/outputs.md). Where its sampling is exact (no latency, and every change of a
// link's rate caused by a communication crossing that link) the two must agree: this checks
// that the hand count puts every byte SimGrid moves on exactly the links it moves over.
//
// A binary of its own: the plugin must be set up before the platform is built, and SimGrid
// allows one engine per process, while duet_sim_tests shares one built without it.
#include <gtest/gtest.h>
#include <simgrid/plugins/load.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include "sim/world.h"

namespace duet::sim {
namespace {

// The tiny PD cluster with a DRAM tier (tests/data/1p1d-tiny-dram.json), every latency zero.
ClusterSpec TinyClusterWithoutLatency() {
  const std::string path = std::string(DUET_SOURCE_DIR) + "/tests/data/1p1d-tiny-dram.json";
  nlohmann::json doc = nlohmann::json::parse(std::ifstream(path));
  for (const char* link : {"nvlink", "pcie", "nic"}) doc["nodes"][0][link]["latency_us"] = 0;
  for (const char* link : {"switch", "frontend"}) doc["network"][link]["latency_us"] = 0;
  doc["tiers"]["dram"]["latency_us"] = 0;
  Result<ClusterSpec> cluster = ParseClusterSpec(doc, path, DUET_SOURCE_DIR);
  EXPECT_TRUE(cluster.ok()) << cluster.error();
  return std::move(*cluster);
}

// Runs the simulated clock until every one of `comms` finished.
void RunUntilDone(std::vector<sg4::CommPtr> comms) {
  while (!comms.empty()) {
    ASSERT_TRUE(DropFinished(comms).empty());
    sg4::Engine::get_instance()->run_until(sg4::Engine::get_clock() + 1e-4);
  }
}

TEST(LinkLoad, HandCountEqualsSimGridsLoadWhereItsSamplingIsExact) {
  const std::unique_ptr<sg4::Engine> engine = MakeEngine();
  sg_link_load_plugin_init();
  const ClusterSpec cluster = TinyClusterWithoutLatency();
  const traces::Trace trace;
  const SimOptions options;
  World w(cluster, trace, options);
  w.platform = BuildPlatform(cluster);
  for (const sg4::Link* link : engine->get_all_links()) sg_link_load_track(link);
  const Platform& p = w.platform;
  ASSERT_EQ(p.gpus.size(), 2u);
  ASSERT_EQ(p.node_hosts.size(), 2u);
  sg4::Host *prefill = p.gpus[0][0], *decode = p.gpus[1][0];

  // Each kind of traffic alone, then two KV transfers sharing their whole route, one of them
  // starting while the other moves (the rates change on every link both cross).
  RunUntilDone({w.Transfer(p.frontend, prefill, 8'512)});           // a request
  RunUntilDone({w.Transfer(prefill, decode, 256)});                 // a control message
  RunUntilDone({w.Transfer(prefill, p.node_hosts[0], 3'000'000)});  // a DRAM write
  RunUntilDone({w.Transfer(p.node_hosts[1], decode, 1'000'000)});   // a DRAM read
  std::vector<sg4::CommPtr> both = {w.Transfer(prefill, decode, 5'000'000)};
  engine->run_until(sg4::Engine::get_clock() + 1e-3);
  both.push_back(w.Transfer(prefill, decode, 2'000'000));
  RunUntilDone(both);

  double counted = 0;
  for (const sg4::Link* link : engine->get_all_links()) {
    if (link->get_name() == "__loopback__") continue;
    const auto it = w.link_bytes.find(link);
    const double hand = it == w.link_bytes.end() ? 0.0 : it->second;
    counted += hand;
    EXPECT_NEAR(sg_link_get_cum_load(link), hand, 1e-9 * std::max(hand, 1.0)) << link->get_name();
  }
  // The request crosses the frontend link, the switch, the NIC and the PCIe link: 4 links.
  EXPECT_GT(counted, 4 * 8'512.0);
  EXPECT_EQ(w.link_bytes.at(engine->link_by_name("switch")), 8'512.0 + 256 + 5'000'000 + 2'000'000);
}

}  // namespace
}  // namespace duet::sim
