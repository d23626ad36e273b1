// The KV tiers below GPU memory (`tiers` in a cluster file): what each tier holds and how
// blocks move between them, read by the simulator and the live server with this one parser.
//   "tiers": {"dram": {...}, "ssd": {...}, "remote": {...}}, each optional:
//     capacity_gib                 per node (DRAM, SSD); the whole store (remote)
//     placement, eviction          "write-through" | "write-back"; "lru" | "arc"
//     dram: bandwidth_GBps, latency_us, prefetch
//     ssd: read_GBps, write_GBps, directory (live: where the block files go; default a
//          directory per server under the system's temporary directory), io (live: "mmap",
//          the default, or "io_uring": O_DIRECT reads and writes of an I/O's blocks together)
//     remote: bandwidth_GBps, latency_us, endpoint (live: the redis-server "host:port")
//     fitted: true, in place of a tier's bandwidths and latency: the fits of its reads and
//          writes that `duet calibrate --tiers` measured on this host's real tier, from the
//          profile of the file's fitted cost model (links "<tier>-read", "<tier>-write")
// Bandwidths and latencies price I/O in the simulator and estimate load times for routing in
// both worlds; the live server moves real bytes at whatever speed they go.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "models/step_profile.h"
#include "policies/kv_tiers.h"

namespace duet::deploy {

struct LinkSpec {
  BytesPerSecond bandwidth = 0;  // per direction
  Seconds latency = 0;
};

struct TierSpec {
  bool enabled = false;
  Bytes capacity_bytes = 0;  // per node; the whole store for the remote tier
  policies::TierPlacement placement = policies::TierPlacement::kWriteThrough;
  policies::EvictionPolicy eviction = policies::EvictionPolicy::kLru;
  LinkSpec link;                // dram: host memory bandwidth; remote: the store's link
  BytesPerSecond read_bw = 0;   // ssd: the node's disk read bandwidth
  BytesPerSecond write_bw = 0;  // ssd: the node's disk write bandwidth
  Seconds read_latency = 0;     // ssd: per I/O (fitted; 0 unless)
  Seconds write_latency = 0;
  bool fitted = false;    // the numbers above come from the profile's tier fits
  bool prefetch = true;   // dram: promote queued requests' prefixes from SSD/remote
  std::string directory;  // ssd, live: the block files' directory ("": the default)
  bool io_uring = false;  // ssd, live: O_DIRECT through io_uring, not mmap
  std::string host;       // remote, live: the redis-server
  int port = 0;
};

struct TiersSpec {
  TierSpec dram, ssd, remote;
  bool any() const { return dram.enabled || ssd.enabled || remote.enabled; }
  const TierSpec& operator[](policies::TierKind kind) const {
    return kind == policies::TierKind::kDram  ? dram
           : kind == policies::TierKind::kSsd ? ssd
                                              : remote;
  }
};

// Bounds of a link in a cluster file.
inline constexpr double kMinBandwidthGBps = 1e-6, kMaxBandwidthGBps = 1e6;
inline constexpr double kMaxLatencyUs = 1e6;  // one second per link

// The name of the profile link that `duet calibrate --tiers` fits for a tier's reads or writes:
// "dram-read", "ssd-write", ...
std::string TierLinkName(policies::TierKind kind, bool read);

// A fitted tier takes its numbers from a profile: `profile` (null when the cluster file's cost
// model is not fitted), read from `profile_path` (for messages).
struct TierFits {
  const models::StepProfile* profile = nullptr;
  std::string profile_path = {};
  // `duet calibrate --tiers` reads the file to time its tiers: a fitted tier is read without
  // its numbers (they are what is being measured).
  bool timing = false;
};

// Reads doc's "tiers" (absent or null: none). `block_bytes`: one engine block of KV, which each
// tier must hold at least one of; `prefix_caching`: the engine's, which tiers need. Errors name
// the file and the field.
Result<TiersSpec> ParseTiers(const nlohmann::json& doc, const std::string& path, Bytes block_bytes,
                             bool prefix_caching, const TierFits& fits = {});
// Whether doc's "tiers" ask for fits (any tier says "fitted").
bool TiersWantFits(const nlohmann::json& doc);

// The tier manager's setup for instances placed on nodes (`instance_node`, `num_nodes`): each
// tier's policy from `tiers`, and for routing estimates the tier's own read bandwidth (the
// simulator narrows it to the slowest link on the path).
policies::TierSetup TierSetupFor(const TiersSpec& tiers, Bytes block_bytes,
                                 std::vector<int> instance_node, int num_nodes);

}  // namespace duet::deploy
