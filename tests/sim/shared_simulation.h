// For tests that post and poll the simulator's ports (SimKvTransport, SimTierStorage) from
// their own thread: SimGrid allows one engine per process, so they share one, made on first
// use with the platform of a bundled cluster, and advance its clock with RunFor. The tiered PD
// cluster: 8 prefill instances on node 0 and 8 decode instances on node 1, one H100 each
// (TP1); per node a DRAM tier and an SSD tier; GPUs of the two nodes joined over PCIe, NIC,
// switch, NIC, PCIe.
#pragma once

#include <gtest/gtest.h>

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <memory>
#include <vector>

#include "policies/ports.h"
#include "sim/cluster_spec.h"
#include "sim/comms.h"
#include "sim/platform.h"

namespace duet::sim::testing {

inline const char* const kTieredPdCluster = "sim/clusters/h100-8p8d-llama8b-tiered.json";

struct SharedSimulation {
  std::unique_ptr<simgrid::s4u::Engine> engine;
  std::unique_ptr<ClusterSpec> cluster;
  std::unique_ptr<Platform> platform;  // null when the cluster did not load
};

// Kept to the process's end: no SimGrid engine may follow another.
inline SharedSimulation& Shared() {
  static SharedSimulation* const shared = [] {
    auto* s = new SharedSimulation;
    s->engine = MakeEngine();
    auto cluster = LoadClusterSpec(kTieredPdCluster, DUET_SOURCE_DIR);
    EXPECT_TRUE(cluster.ok()) << cluster.error();
    if (cluster.ok()) {
      s->cluster = std::make_unique<ClusterSpec>(std::move(*cluster));
      s->platform = std::make_unique<Platform>(BuildPlatform(*s->cluster));
    }
    return s;
  }();
  return *shared;
}

// Starts a communication with nothing counted (the tests' ports' StartComm).
inline StartComm DirectStart() {
  return [](simgrid::s4u::Host* src, simgrid::s4u::Host* dst, std::uint64_t bytes) {
    return simgrid::s4u::Comm::sendto_async(src, dst, bytes);
  };
}

// How often PollUntilDone polls, in simulated seconds: a finish is seen at most this late.
inline constexpr double kPollS = 1e-6;

// Advances the simulated clock by `seconds`.
inline void RunFor(double seconds) {
  Shared().engine->run_until(simgrid::s4u::Engine::get_clock() + seconds);
}

// Calls poll() every kPollS of simulated time until it returns other than kInProgress, for at
// most `limit_s`; returns that status (kInProgress, with a test failure, when time ran out).
template <typename Poll>
policies::TransferStatus PollUntilDone(Poll poll, double limit_s) {
  for (double waited = 0; waited <= limit_s; waited += kPollS) {
    const policies::TransferStatus s = poll();
    if (s != policies::TransferStatus::kInProgress) return s;
    RunFor(kPollS);
  }
  ADD_FAILURE() << "not finished in " << limit_s << " s of simulated time";
  return policies::TransferStatus::kInProgress;
}

// What a transfer alone on the route from `src` to `dst` takes: the route's latency plus its
// bytes over the narrowest link (CM02 without TCP corrections, as MakeEngine sets up).
inline double LoneTransferSeconds(const simgrid::s4u::Host* src, const simgrid::s4u::Host* dst,
                                  double bytes) {
  std::vector<simgrid::s4u::Link*> links;
  double latency = 0;
  src->route_to(dst, links, &latency);
  EXPECT_FALSE(links.empty());
  double bandwidth = links.empty() ? 0 : links.front()->get_bandwidth();
  for (const simgrid::s4u::Link* l : links) bandwidth = std::min(bandwidth, l->get_bandwidth());
  return latency + bytes / bandwidth;
}

}  // namespace duet::sim::testing
