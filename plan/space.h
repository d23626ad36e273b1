// The clusters `duet plan` chooses among: colocated or PD layouts of one model on one of the
// GPU types searched, with their instance counts and TP degrees, the engine's token budget, host
// DRAM and SSD KV tiers per node and the router; what each costs per hour; and each as a cluster
// file built on a base cluster (links, engine settings, tier parameters) whose GPU and step cost
// model are its type's.
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/units.h"
#include "policies/router.h"

namespace duet::plan {

struct SpaceOptions {
  // GPU types, as a cluster file names them (a bundled name or a path); the default base's.
  std::vector<std::string> gpus = {"h100-sxm"};
  int max_gpus = 16;
  int gpus_per_node = 8;
  bool colocated = true, pd = true;
  std::vector<int> tp = {1, 2, 4};  // colocated instances and PD prefill instances
  std::vector<int> dp = {1};        // their attention data-parallel ranks
  std::vector<int> decode_tp = {1};
  std::vector<int> decode_dp = {1};  // attention data-parallel ranks of PD decode instances
  std::vector<Tokens> token_budgets = {8192, 16384};
  std::vector<double> dram_gib = {0, 512};  // per node
  std::vector<double> ssd_tib = {0, 4};     // per node; only with DRAM
  std::vector<policies::RouterKind> routers = {policies::RouterKind::kKvAware,
                                               policies::RouterKind::kPrefixAware};
};

// Hourly prices: a GPU of each type (as SpaceOptions::gpus names them; plan/gpu_prices.h), a GiB
// of host DRAM and a TiB of SSD (defaults: docs/planning.md).
struct Prices {
  std::map<std::string, double> gpu_hour;
  double dram_gib_hour = 0.002;
  double ssd_tib_hour = 0.05;
};

struct Candidate {
  std::string gpu;  // its GPU type, as SpaceOptions::gpus names it
  // Whether Key() and Layout() name the GPU: Enumerate sets it in a search of several types, so
  // that a single type's keys stay as they were and its resumed searches find their runs.
  bool gpu_named = false;
  bool pd = false;
  int prefill = 0, prefill_tp = 1, prefill_dp = 1;  // colocated: the instances, TP and DP
  int decode = 0, decode_tp = 1, decode_dp = 1;  // decode instances of decode_tp x decode_dp GPUs
  Tokens token_budget = 0;
  double dram_gib = 0, ssd_tib = 0;  // per node
  policies::RouterKind router = policies::RouterKind::kKvAware;
  int gpus = 0, nodes = 0;
  double cost_per_hour = 0;

  // Unique and safe as a file name: "pd-2xtp4-3xtp1-b8192-dram512-ssd0-kv-aware" (instances
  // with data-parallel attention: "1xtp1dp8"; with the GPU named: "h200-pd-...").
  std::string Key() const;
  // "2 TP4 prefill + 3 TP1 decode", "1 TP8 prefill + 1 TP1xDP8 decode" or "4 TP2 colocated"
  // (with the GPU named: "4 TP2 colocated on h200").
  std::string Layout() const;
};

// The most candidates a search may hold (about 200 bytes each).
inline constexpr std::size_t kMaxCandidates = 1000000;
// How many candidates Enumerate would give, counted without building them.
std::size_t CountCandidates(const SpaceOptions& options);

// The GPU as keys name it: a bundled name as it is, a file by its name without the extension.
std::string GpuKeyName(const std::string& gpu);

// Every candidate within the options, of every GPU type, cheapest first (ties: fewer GPUs, then
// colocated, then by key), priced by `prices`, which must price every type. Nodes are filled
// first fit, prefill instances first, as a cluster file places them.
std::vector<Candidate> Enumerate(const SpaceOptions& options, const Prices& prices);

// The candidates one step cheaper than all[winner] along one dimension: one instance fewer of
// a role, the next lower TP degree, DRAM or SSD size, on the same GPU type. What a check of the
// winner simulates to show that nothing just below it would do.
std::vector<std::size_t> CheaperNeighbours(const std::vector<Candidate>& all, std::size_t winner);

// `base` (a cluster file's document, its file references absolute) for the candidates of
// `model` on `gpu`, each a bundled name or a path relative to `ref_dir`; empty: the base's. Steps
// are priced by the base's cost model when it is the roofline or was measured on this model and
// GPU; else by the bundled profile of the pair (sim/profiles/GPU-MODEL.json under `data_dir`)
// where there is one, else by the roofline. `*pricing` says which of the last two, or is empty.
nlohmann::json OnHardware(const nlohmann::json& base, const std::string& model,
                          const std::string& gpu, const std::string& ref_dir,
                          const std::string& data_dir, std::string* pricing);

// The candidate as a cluster file: `base`, the cluster of the candidate's GPU type
// (OnHardware), with its nodes, instances, token budget, DRAM and SSD tiers and router replaced
// (tier parameters other than capacity come from the base's tiers where it has them, else the
// bundled tiered clusters' values).
nlohmann::json ClusterDocument(const nlohmann::json& base, const Candidate& candidate);

}  // namespace duet::plan
