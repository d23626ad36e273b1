// Builds the SimGrid platform of a cluster: one host per GPU plus a frontend host; per GPU a
// split-duplex NVLink, PCIe and NIC link; one shared switch link between nodes. Routes:
// same node GPU->GPU over NVLink; across nodes PCIe, NIC, switch, NIC, PCIe (GPUDirect RDMA);
// frontend to GPU over the frontend link and the switch.
#pragma once

#include <simgrid/s4u.hpp>
#include <vector>

#include "sim/cluster_spec.h"

namespace duet::sim {

struct Platform {
  simgrid::s4u::Host* frontend = nullptr;
  std::vector<std::vector<simgrid::s4u::Host*>> gpus;  // [node][gpu]
};

Platform BuildPlatform(const ClusterSpec& cluster);

}  // namespace duet::sim
