#include "deploy/tiers.h"

#include "common/json_util.h"

namespace duet::deploy {
namespace {

using nlohmann::json;

// A fitted tier's numbers, from the fits of its reads and writes in the profile.
Status ApplyFits(const json& j, const std::string& where, policies::TierKind kind,
                 const TierFits& fits, TierSpec& t) {
  auto fitted = JsonBoolOr(j, "fitted", false, where);
  if (!fitted) return fitted.status();
  if (!*fitted) return FieldError(where, "fitted", "must be true where given");
  for (const char* own : {"bandwidth_GBps", "latency_us", "read_GBps", "write_GBps"}) {
    if (JsonHas(j, own))
      return FieldError(where, "fitted", std::string("excludes ") + own + " (the fit gives it)");
  }
  t.fitted = true;
  if (fits.timing) return Status::Ok();
  if (!fits.profile)
    return FieldError(where, "fitted",
                      "needs cost_model kind 'fitted': its profile holds the tier's fits");
  const models::LinkFit* read = fits.profile->LinkFor(TierLinkName(kind, true));
  const models::LinkFit* write = fits.profile->LinkFor(TierLinkName(kind, false));
  if (!read || !write)
    return FieldError(where, "fitted",
                      "profile " + fits.profile_path + " has no fit of " +
                          TierLinkName(kind, !read) + " (duet calibrate --tiers times them)");
  if (kind == policies::TierKind::kSsd) {
    t.read_bw = read->bandwidth;
    t.write_bw = write->bandwidth;
    t.read_latency = read->latency;
    t.write_latency = write->latency;
  } else {
    // Reads and writes share one link in the simulator: it takes the reads' fit, which loads
    // (what a request waits for) follow.
    t.link = {read->bandwidth, read->latency};
  }
  return Status::Ok();
}

Status ParseTier(const json& tiers, const char* key, const std::string& where_tiers,
                 const TierFits& fits, TierSpec& t) {
  auto it = tiers.find(key);
  if (it == tiers.end() || it->is_null()) return Status::Ok();
  const std::string where = where_tiers + "." + key;
  if (!it->is_object()) return Status::Error(where + ": must be an object");
  const json& j = *it;
  t.enabled = true;
  auto gib = JsonNumber(j, "capacity_gib", where);
  if (!gib) return gib.status();
  if (!(*gib * kGiB >= 1) || *gib > 1e9)
    return FieldError(where, "capacity_gib", "must be in (0, 1e9], got " + std::to_string(*gib));
  t.capacity_bytes = static_cast<Bytes>(*gib * kGiB);
  auto placement_name = JsonStringOr(j, "placement", "write-through", where);
  if (!placement_name) return placement_name.status();
  auto placement = policies::ParseTierPlacement(*placement_name);
  if (!placement) return Status::Error(where + ": field 'placement': " + placement.error());
  t.placement = *placement;
  auto eviction_name = JsonStringOr(j, "eviction", "lru", where);
  if (!eviction_name) return eviction_name.status();
  auto eviction = policies::ParseEvictionPolicy(*eviction_name);
  if (!eviction) return Status::Error(where + ": field 'eviction': " + eviction.error());
  t.eviction = *eviction;
  const std::string k = key;
  if (JsonHas(j, "fitted")) {
    const auto kind = k == "dram"  ? policies::TierKind::kDram
                      : k == "ssd" ? policies::TierKind::kSsd
                                   : policies::TierKind::kRemote;
    DUET_RETURN_IF_ERROR(ApplyFits(j, where, kind, fits, t));
  } else if (k == "ssd") {
    auto read = JsonNumberIn(j, "read_GBps", kMinBandwidthGBps, kMaxBandwidthGBps, where);
    auto write = JsonNumberIn(j, "write_GBps", kMinBandwidthGBps, kMaxBandwidthGBps, where);
    if (!read) return read.status();
    if (!write) return write.status();
    t.read_bw = *read * kGB;
    t.write_bw = *write * kGB;
  } else {
    // DRAM: the host memory bandwidth that the node's GPUs share; remote: the store's link.
    auto bw = JsonNumberIn(j, "bandwidth_GBps", kMinBandwidthGBps, kMaxBandwidthGBps, where,
                           k == "dram" ? std::optional<double>(200.0) : std::nullopt);
    auto lat = JsonNumberIn(j, "latency_us", 0, kMaxLatencyUs, where, k == "dram" ? 0.0 : 10.0);
    if (!bw) return bw.status();
    if (!lat) return lat.status();
    t.link = {*bw * kGB, *lat * 1e-6};
  }
  if (k == "ssd") {
    auto directory = JsonStringOr(j, "directory", "", where);
    if (!directory) return directory.status();
    t.directory = *directory;
    auto io = JsonStringOr(j, "io", "mmap", where);
    if (!io) return io.status();
    if (*io != "mmap" && *io != "io_uring")
      return FieldError(where, "io", "must be 'mmap' or 'io_uring', got '" + *io + "'");
    t.io_uring = *io == "io_uring";
  }
  if (k == "dram") {
    auto prefetch = JsonBoolOr(j, "prefetch", true, where);
    if (!prefetch) return prefetch.status();
    t.prefetch = *prefetch;
  }
  if (k == "remote") {
    auto endpoint = JsonStringOr(j, "endpoint", "127.0.0.1:6379", where);
    if (!endpoint) return endpoint.status();
    const std::size_t colon = endpoint->rfind(':');
    const std::string port = colon == std::string::npos ? "" : endpoint->substr(colon + 1);
    const bool digits = !port.empty() && port.size() <= 5 &&
                        port.find_first_not_of("0123456789") == std::string::npos;
    if (colon == 0 || !digits || std::stoi(port) < 1 || std::stoi(port) > 65535)
      return FieldError(where, "endpoint",
                        "must be host:port with a port in [1, 65535], got '" + *endpoint + "'");
    t.host = endpoint->substr(0, colon);
    t.port = std::stoi(port);
  }
  return Status::Ok();
}

}  // namespace

std::string TierLinkName(policies::TierKind kind, bool read) {
  return std::string(policies::ToString(kind)) + (read ? "-read" : "-write");
}

bool TiersWantFits(const json& doc) {
  auto it = doc.find("tiers");
  if (it == doc.end() || !it->is_object()) return false;
  for (const auto& [key, tier] : it->items())
    if (tier.is_object() && tier.contains("fitted")) return true;
  return false;
}

Result<TiersSpec> ParseTiers(const json& doc, const std::string& path, Bytes block_bytes,
                             bool prefix_caching, const TierFits& fits) {
  TiersSpec tiers;
  auto it = doc.find("tiers");
  if (it == doc.end() || it->is_null()) return tiers;
  const std::string where = path + ": tiers";
  if (!it->is_object()) return Status::Error(where + ": must be an object");
  for (const auto& [key, value] : it->items()) {
    if (key != "dram" && key != "ssd" && key != "remote")
      return Status::Error(where + ": unknown tier '" + key + "' (expected dram, ssd, remote)");
  }
  DUET_RETURN_IF_ERROR(ParseTier(*it, "dram", where, fits, tiers.dram));
  DUET_RETURN_IF_ERROR(ParseTier(*it, "ssd", where, fits, tiers.ssd));
  DUET_RETURN_IF_ERROR(ParseTier(*it, "remote", where, fits, tiers.remote));
  // A tier must hold at least one engine block (every TP shard's share of it).
  for (int k = 0; k < policies::kNumLowerTiers; ++k) {
    const auto kind = static_cast<policies::TierKind>(k);
    const TierSpec& t = tiers[kind];
    if (t.enabled && t.capacity_bytes < block_bytes)
      return FieldError(path + ": tiers." + policies::ToString(kind), "capacity_gib",
                        "holds " + std::to_string(t.capacity_bytes) +
                            " bytes, less than one KV block of " + std::to_string(block_bytes) +
                            " bytes (block_tokens x KV bytes per token)");
  }
  if (tiers.any() && !prefix_caching)
    return Status::Error(path +
                         ": tiers: need engine.enable_prefix_caching (tiers hold cached "
                         "prefix blocks)");
  return tiers;
}

policies::TierSetup TierSetupFor(const TiersSpec& tiers, Bytes block_bytes,
                                 std::vector<int> instance_node, int num_nodes) {
  policies::TierSetup setup;
  setup.block_bytes = block_bytes;
  setup.num_nodes = num_nodes;
  setup.instance_node = std::move(instance_node);
  setup.prefetch_to_dram = tiers.dram.prefetch;
  for (int k = 0; k < policies::kNumLowerTiers; ++k) {
    const TierSpec& spec = tiers[static_cast<policies::TierKind>(k)];
    policies::TierConfig& c = setup.tiers[static_cast<std::size_t>(k)];
    c.enabled = spec.enabled;
    c.capacity_bytes = spec.capacity_bytes;
    c.placement = spec.placement;
    c.eviction = spec.eviction;
    c.read_bandwidth = k == 1 ? spec.read_bw : spec.link.bandwidth;
  }
  return setup;
}

}  // namespace duet::deploy
