// Fuzz target for the cluster description parser (sim/cluster_spec.cpp): any bytes must give
// a spec or a clear error, never a crash. Model and GPU names resolve against the source tree.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "sim/cluster_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return 0;
  auto spec = duet::sim::ParseClusterSpec(doc, "fuzz.json", DUET_SOURCE_DIR);
  if (spec.ok()) {
    // Every placed instance got its own GPUs, which exist, and a KV capacity.
    if (spec->placements.size() != spec->instances.size()) __builtin_trap();
    std::set<std::pair<int, int>> taken;
    for (std::size_t i = 0; i < spec->instances.size(); ++i) {
      const auto& at = spec->placements[i];
      if (at.gpus.size() != static_cast<std::size_t>(spec->instances[i].Gpus()) ||
          at.memory.kv_blocks < 1)
        __builtin_trap();
      for (const auto& g : at.gpus) {
        if (g.node < at.node || g.node >= at.node + at.nodes ||
            g.gpu >= spec->nodes[static_cast<std::size_t>(g.node)].gpus ||
            !taken.insert({g.node, g.gpu}).second)
          __builtin_trap();
      }
    }
    // Every enabled tier has a capacity and the bandwidths its path needs.
    for (auto kind : {duet::policies::TierKind::kDram, duet::policies::TierKind::kSsd,
                      duet::policies::TierKind::kRemote}) {
      const auto& t = spec->tiers[kind];
      if (!t.enabled) continue;
      if (t.capacity_bytes <= 0) __builtin_trap();
      if (kind == duet::policies::TierKind::kSsd ? !(t.read_bw > 0 && t.write_bw > 0)
                                                 : !(t.link.bandwidth > 0))
        __builtin_trap();
    }
  } else if (spec.error().empty()) {
    __builtin_trap();
  }
  return 0;
}
