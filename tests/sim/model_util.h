// What the end-to-end simulation tests compute by hand: the links of a cluster file, the time
// of a message alone on its route, the roofline step cost the cluster configures, and the
// constants of the simulator's messages. Shared by the tests of tests/sim.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/cost_model.h"
#include "models/model_spec.h"
#include "tests/common/metrics_schema.h"
#include "tests/sim/e2e_util.h"

namespace duet::e2e {

inline std::string Src(const std::string& relative) { return SourceDir() + "/" + relative; }

// requests.csv prints milliseconds with 3 decimals: a value is within 0.0005 ms of the exact
// one. Hand-computed times must match to a few times that.
inline constexpr double kCsvTolMs = 0.0015;

inline const std::vector<std::string> kStringColumns = {"prefill_instance", "decode_instance",
                                                        "status", "reason"};

// ---- The network as the cluster file describes it ------------------------------------------

struct Link {
  double bandwidth = 0;  // bytes/s
  double latency = 0;    // s
};

inline Link ReadLink(const nlohmann::json& j) {
  return {j.at("bandwidth_GBps").get<double>() * 1e9, j.at("latency_us").get<double>() * 1e-6};
}

// The links of a cluster file whose nodes are all one group.
struct Network {
  Link frontend, sw, nic, pcie;
  explicit Network(const nlohmann::json& cluster) {
    const auto& node = cluster.at("nodes").at(0);
    frontend = ReadLink(cluster.at("network").at("frontend"));
    sw = ReadLink(cluster.at("network").at("switch"));
    nic = ReadLink(node.at("nic"));
    pcie = ReadLink(node.at("pcie"));
  }
  // Frontend host -> a GPU: frontend link, switch, the GPU's NIC (no PCIe on this route).
  std::vector<Link> FrontendToGpu() const { return {frontend, sw, nic}; }
  // GPU -> GPU on another node (GPUDirect RDMA): PCIe, NIC, switch, NIC, PCIe.
  std::vector<Link> GpuToGpu() const { return {pcie, nic, sw, nic, pcie}; }
};

// One message alone on its route: the latencies add up, the slowest link sets the rate.
inline double MessageSeconds(double bytes, const std::vector<Link>& route) {
  double latency = 0, bandwidth = INFINITY;
  for (const Link& l : route) {
    latency += l.latency;
    bandwidth = std::min(bandwidth, l.bandwidth);
  }
  return latency + bytes / bandwidth;
}

inline double MinBandwidth(const std::vector<Link>& route) {
  double bw = INFINITY;
  for (const Link& l : route) bw = std::min(bw, l.bandwidth);
  return bw;
}

// The roofline step-cost model the cluster file configures, built here from the same model and
// hardware spec files and the cluster's cost_model block (not through the cluster parser).
inline models::RooflineCostModel CostModelFor(const nlohmann::json& cluster, int tp,
                                              models::ModelSpec* model_out = nullptr) {
  auto model = models::LoadModelSpec(
      Src("models/specs/" + cluster.at("model").get<std::string>() + ".json"));
  auto hw = models::LoadHardwareSpec(
      Src("models/hardware/" + cluster.at("nodes").at(0).at("gpu").get<std::string>() + ".json"));
  if (!model.ok()) throw std::runtime_error(model.error());
  if (!hw.ok()) throw std::runtime_error(hw.error());
  // The simulator runs TP all-reduces over the cluster file's NVLink.
  const auto& node = cluster.at("nodes").at(0);
  if (node.contains("nvlink")) hw->nvlink_bw = node["nvlink"]["bandwidth_GBps"].get<double>() * 1e9;
  const auto& c = cluster.at("cost_model");
  models::RooflineOptions options;
  options.tp = tp;
  options.compute_efficiency = c.at("compute_efficiency").get<double>();
  options.memory_efficiency = c.at("memory_efficiency").get<double>();
  options.comm_efficiency = c.at("comm_efficiency").get<double>();
  options.step_overhead = c.at("step_overhead_ms").get<double>() * 1e-3;
  if (model_out) *model_out = *model;
  return models::RooflineCostModel(*model, *hw, options);
}

inline models::StepShape PrefillShape(Tokens tokens, Tokens context) {
  models::StepShape shape;
  shape.prefill.push_back({tokens, context});
  return shape;
}

inline models::StepShape DecodeShape(Tokens context) {
  models::StepShape shape;
  shape.decode_tokens = 1;
  shape.decode_context_tokens = context;
  return shape;
}

// Bytes of the SimGrid control messages (KvReady, KvRelease): sim/simulation.cpp.
inline constexpr double kControlMessageBytes = 256;
// The frontend sends a request's token ids: 4 bytes a token.
inline constexpr double kBytesPerPromptToken = 4;

}  // namespace duet::e2e
