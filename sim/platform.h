// Builds the SimGrid platform of a cluster: one host per GPU plus a frontend host; per GPU a
// split-duplex NVLink, PCIe and NIC link; one shared switch link between nodes. Routes:
// same node GPU->GPU over NVLink; across nodes PCIe, NIC, switch, NIC, PCIe (GPUDirect RDMA);
// frontend to GPU over the frontend link and the switch.
// With KV tiers (cluster "tiers"): a host per node whose memory (one shared link at the DRAM
// bandwidth) holds the DRAM tier, GPU <-> host over the GPU's PCIe and the host memory; an SSD
// per node, a host behind two links with the disk's read and write bandwidth, reached through
// host memory; a remote-store host reached over its link and the switch (from a GPU through
// its NIC and PCIe, from a node host through the host's NIC).
#pragma once

#include <simgrid/s4u.hpp>

#include <memory>
#include <vector>

#include "sim/cluster_spec.h"

namespace duet::sim {

struct Platform {
  simgrid::s4u::Host* frontend = nullptr;
  std::vector<std::vector<simgrid::s4u::Host*>> gpus;  // [node][gpu]
  std::vector<simgrid::s4u::Host*> node_hosts;         // [node], with tiers only
  std::vector<simgrid::s4u::Host*> ssds;               // [node], with an SSD tier only
  simgrid::s4u::Host* remote_store = nullptr;          // with a remote tier only
};

// A SimGrid engine set up as every Duet simulation's: SimGrid's own log quiet but for critical
// errors; max-min bandwidth sharing without TCP corrections, so a transfer alone on its route
// takes latency + bytes / bandwidth and concurrent transfers share the bottleneck link fairly.
// One engine at a time per process; build the platform after it.
std::unique_ptr<simgrid::s4u::Engine> MakeEngine();

Platform BuildPlatform(const ClusterSpec& cluster);

}  // namespace duet::sim
