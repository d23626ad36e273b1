// What a run reports: the lifecycle events to the metrics collector (SimSink), the tiers'
// summary and links.csv. See world.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "common/progress.h"
#include "sim/world.h"

namespace duet::sim {

using policies::RequestState;

void SimSink::OnFinished(const policies::RequestSpec& spec, const policies::RequestRecord& record) {
  // Nothing reads a finished request's prefix hashes again (routing, admission and offload
  // are behind it) unless a later turn continues its context: free them, about 6 KB per
  // Mooncake request.
  const std::size_t k = world_.request_index.at(spec.id);
  Request& r = world_.requests[k];
  // The table keeps what the frontend sent and, from now on, the record the engine reports
  // (the frontend's own rejections report the table's entry itself).
  if (&record != &r.record()) r.record() = record;
  if (world_.arrivals->continuations_left(k) == 0) {
    std::vector<policies::BlockHash>().swap(r.block_hashes);
  } else if (world_.pooled && !world_.cluster.pd() && record.state == RequestState::kCompleted) {
    // Colocated instances cache the output of a request that later turns continue (the engine
    // does, at completion): so does the pooled reference.
    world_.pooled->Touch(r.block_hashes, r.input_tokens + r.output_tokens - 1);
  }
  world_.metrics.OnFinished(spec, record);
  world_.router->OnFinished(spec, record);
  ++world_.finished;
  if (world_.options.stop_below_attainment > 0 &&
      !world_.options.slo.Met(policies::FinishedRequest::Of(spec, record)) &&
      ++world_.misses > world_.allowed_misses) {
    // The target is out of reach: end every actor, this one last. Nothing after this point
    // runs, and the run's end skips the checks of a drained cluster.
    world_.stopped_early = true;
    sg4::Actor::kill_all();
    sg4::this_actor::exit();
  }
  if (world_.options.progress) DrawProgress(false);
  world_.arrivals->OnFinished(k, sg4::Engine::get_clock(),
                              record.state == RequestState::kCompleted);
  if (world_.frontend_sleeping) world_.wake->notify_all();
  if (world_.finished == world_.arrivals->released() && world_.arrivals->Exhausted() &&
      world_.frontend_waiting) {
    // SimGrid needs a non-null payload to tell a send from a receive.
    static int done_token = 0;
    world_.done_mailbox->put_init(&done_token, 0)->detach();
  }
}

void SimSink::OnPrefillDone(const policies::RequestSpec& spec,
                            const policies::RequestRecord& record) {
  world_.router->OnPrefillDone(spec, record);
}

void SimSink::OnTokenGaps(Seconds gap_s, std::int64_t count) {
  world_.metrics.OnTokenGaps(gap_s, count);
}

void SimSink::OnPreempted(const policies::RequestSpec& spec, const policies::RequestRecord& record,
                          InstanceId instance) {
  world_.metrics.OnPreempted(spec, record, instance);
}

void SimSink::OnKvEvents(InstanceId instance, std::span<const policies::KvCacheEvent> events) {
  world_.kv_events_in_flight.push_back(
      {sg4::Engine::get_clock() + world_.options.router_staleness_s, instance,
       std::vector<policies::KvCacheEvent>(events.begin(), events.end())});
}

void SimSink::DrawProgress(bool final) {
  const std::size_t total = world_.requests.size();
  const std::size_t step = std::max<std::size_t>(1, total / 100);
  if (!final && world_.finished - last_drawn_ < step && world_.finished != total) return;
  last_drawn_ = world_.finished;
  char detail[96];
  std::snprintf(detail, sizeof detail, "%zu/%zu requests  simulated %.1f s", world_.finished, total,
                sg4::Engine::get_clock());
  duet::DrawProgress(world_.finished, total, detail);
}

// Per tier: configuration, traffic and occupancy. Present with zeros when a tier is absent.
nlohmann::json TiersSummary(const World& w) {
  using policies::TierKind;
  nlohmann::json out = nlohmann::json::object();
  for (int k = 0; k < policies::kNumLowerTiers; ++k) {
    const auto kind = static_cast<TierKind>(k);
    const TierSpec& spec = w.cluster.tiers[kind];
    nlohmann::json j = {{"enabled", spec.enabled}, {"capacity_bytes", spec.capacity_bytes}};
    policies::TierCounters c;
    std::int64_t evictions = 0, peak = 0;
    if (w.tiers && spec.enabled) {
      c = w.tiers->counters(kind);
      evictions = w.tiers->evictions(kind);
      peak = w.tiers->peak_used_blocks(kind);
      j["placement"] = policies::ToString(spec.placement);
      j["eviction"] = policies::ToString(spec.eviction);
    }
    j["write_blocks"] = c.write_blocks;
    j["written_blocks"] = c.written_blocks;
    j["write_bytes"] = c.write_bytes;
    j["write_ios"] = c.write_ios;
    j["read_blocks"] = c.read_blocks;
    j["read_bytes"] = c.read_bytes;
    j["read_ios"] = c.read_ios;
    j["evictions"] = evictions;
    j["dropped_writes"] = c.dropped_writes;
    j["prefetch_blocks"] = c.prefetch_blocks;
    j["peak_used_blocks"] = peak;
    for (bool read : {false, true}) {
      SimTierStorage::IoTimes t;
      if (w.storage) t = w.storage->times(kind, read);
      j[read ? "read_time_ms" : "write_time_ms"] = {
          {"mean", t.count ? std::round(t.total_s / static_cast<double>(t.count) * 1e6) / 1e3 : 0},
          {"max", std::round(t.max_s * 1e6) / 1e3}};
    }
    out[policies::ToString(kind)] = j;
  }
  return out;
}

// links.csv: bytes carried by every link direction and disk, and its busy time at full rate
// (bytes / bandwidth) and utilization over the simulated time.
Status WriteLinksCsv(const World& w, const std::string& path) {
  std::ofstream out(path);
  if (!out) return Status::Error(path + ": cannot open for writing");
  const double simulated_s = sg4::Engine::get_clock();
  out << "resource,kind,bandwidth_GBps,bytes,busy_s,utilization\n";
  auto row = [&](const std::string& name, const char* kind, double bw, double bytes) {
    const double busy = bw > 0 ? bytes / bw : 0.0;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s,%s,%.3f,%.0f,%.6f,%.6f\n", name.c_str(), kind, bw / kGB,
                  bytes, busy, simulated_s > 0 ? busy / simulated_s : 0.0);
    out << buf;
  };
  auto links = sg4::Engine::get_instance()->get_all_links();
  std::sort(links.begin(), links.end(),
            [](const sg4::Link* a, const sg4::Link* b) { return a->get_name() < b->get_name(); });
  for (const sg4::Link* link : links) {
    if (link->get_name() == "__loopback__") continue;
    const std::string& name = link->get_name();
    const bool disk = name.find("-ssd-") != std::string::npos;
    auto it = w.link_bytes.find(link);
    row(name, disk ? "disk" : "link", link->get_bandwidth(),
        it == w.link_bytes.end() ? 0.0 : it->second);
  }
  out.flush();
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

}  // namespace duet::sim
