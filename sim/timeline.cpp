#include "sim/timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <unordered_map>

namespace duet::sim {
namespace {

// Processes of the trace, each a group of tracks in the viewer.
constexpr int kInstancesPid = 1, kTransfersPid = 2, kTiersPid = 3, kRequestsPid = 4;

std::int64_t Ns(Seconds s) { return std::llround(s * 1e9); }

// Streams trace events: times in whole nanoseconds, written as microseconds (the format's
// unit) with three decimals, so a point 1 ns inside a slice is inside it in the file too.
class EventWriter {
 public:
  explicit EventWriter(std::ofstream& out) : out_(out) { out_ << "{\"traceEvents\": [\n"; }
  void Finish() { out_ << "\n], \"displayTimeUnit\": \"ms\"}\n"; }

  void Metadata(const char* what, int pid, int tid, const std::string& name) {
    Begin();
    out_ << "{\"ph\": \"M\", \"name\": \"" << what << "\", \"pid\": " << pid << ", \"tid\": " << tid
         << ", \"args\": {\"name\": " << nlohmann::json(name).dump() << "}}";
  }
  void SortIndex(int pid, int tid, int index) {
    Begin();
    out_ << "{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": " << pid
         << ", \"tid\": " << tid << ", \"args\": {\"sort_index\": " << index << "}}";
  }
  // A complete slice on (pid, tid).
  void Slice(const std::string& name, int pid, int tid, std::int64_t start_ns, std::int64_t end_ns,
             const nlohmann::json& args) {
    Begin();
    out_ << "{\"ph\": \"X\", \"name\": " << nlohmann::json(name).dump() << ", \"pid\": " << pid
         << ", \"tid\": " << tid << ", \"ts\": " << Us(start_ns)
         << ", \"dur\": " << Us(end_ns - start_ns) << ", \"args\": " << args.dump() << "}";
  }
  // A flow point ("s", "t" or "f"), bound to the slice enclosing `ns` on (pid, tid).
  void Flow(char phase, std::uint64_t id, int pid, int tid, std::int64_t ns) {
    Begin();
    out_ << "{\"ph\": \"" << phase
         << "\", \"name\": \"kv handoff\", \"cat\": \"kv\", \"id\": " << id << ", \"pid\": " << pid
         << ", \"tid\": " << tid << ", \"ts\": " << Us(ns) << ", \"bp\": \"e\"}";
  }
  // Nestable async begin ("b") or end ("e") of request `id`'s slice `name`.
  void Async(char phase, const std::string& name, std::uint64_t id, std::int64_t ns,
             const nlohmann::json* args = nullptr) {
    Begin();
    out_ << "{\"ph\": \"" << phase << "\", \"name\": " << nlohmann::json(name).dump()
         << ", \"cat\": \"request\", \"id\": " << id << ", \"pid\": " << kRequestsPid
         << ", \"tid\": 0, \"ts\": " << Us(ns);
    if (args) out_ << ", \"args\": " << args->dump();
    out_ << "}";
  }

 private:
  void Begin() {
    if (!first_) out_ << ",\n";
    first_ = false;
  }
  static std::string Us(std::int64_t ns) {
    char text[32];
    const std::int64_t whole = ns / 1000, frac = ns % 1000;
    std::snprintf(text, sizeof text, "%s%lld.%03lld", ns < 0 ? "-" : "",
                  static_cast<long long>(whole < 0 ? -whole : whole),
                  static_cast<long long>(frac < 0 ? -frac : frac));
    return text;
  }

  std::ofstream& out_;
  bool first_ = true;
};

const char* StepName(const Timeline::Step& s) {
  if (s.decode_tokens == 0) return "prefill";
  return s.prefill_tokens == 0 ? "decode" : "mixed";
}

std::string InstanceName(const std::vector<std::string>& names, policies::InstanceId i) {
  return i == policies::kNoInstance ? std::string() : names.at(static_cast<std::size_t>(i));
}

}  // namespace

Status Timeline::Write(const std::string& path, const std::vector<std::string>& instance_names,
                       const std::vector<policies::Request>& requests) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::Error(path + ": cannot open for writing");
  EventWriter w(out);
  w.Metadata("process_name", kInstancesPid, 0, "instances");
  w.Metadata("process_name", kTransfersPid, 0, "KV transfers");
  w.Metadata("process_name", kTiersPid, 0, "KV tiers");
  w.Metadata("process_name", kRequestsPid, 0, "requests");
  for (std::size_t i = 0; i < instance_names.size(); ++i) {
    const int tid = static_cast<int>(i) + 1;
    w.Metadata("thread_name", kInstancesPid, tid, instance_names[i]);
    w.SortIndex(kInstancesPid, tid, tid);
  }
  for (const Step& s : steps_) {
    w.Slice(StepName(s), kInstancesPid, s.instance + 1, Ns(s.start_s), Ns(s.end_s),
            {{"prefill_tokens", s.prefill_tokens},
             {"decode_tokens", s.decode_tokens},
             {"batch_size", s.prefill_requests + s.decode_requests},
             {"prefill_requests", s.prefill_requests},
             {"decode_requests", s.decode_requests}});
  }

  // A track per route; each transfer's flow runs from the prefill step that produced the
  // request's first token, through the transfer, to the decode step of its second token.
  std::map<std::pair<policies::InstanceId, policies::InstanceId>, int> routes;
  std::unordered_map<policies::RequestId, const policies::Request*> by_id;
  for (const policies::Request& r : requests) by_id.emplace(r.id, &r);
  std::uint64_t flow = 0;
  for (const Transfer& t : transfers_) {
    auto [it, added] = routes.emplace(std::make_pair(t.src, t.dst), routes.size() + 1);
    if (added) {
      w.Metadata(
          "thread_name", kTransfersPid, it->second,
          InstanceName(instance_names, t.src) + " -> " + InstanceName(instance_names, t.dst));
    }
    const std::int64_t start = Ns(t.start_s), end = Ns(t.end_s);
    w.Slice((t.failed ? "failed kv " : "kv ") + std::to_string(t.request), kTransfersPid,
            it->second, start, end,
            {{"request", t.request}, {"bytes", t.bytes}, {"failed", t.failed}});
    auto r = by_id.find(t.request);
    if (t.failed || r == by_id.end() || r->second->prefill_done_s < 0 ||
        r->second->second_token_s < 0 || end <= start)
      continue;
    ++flow;
    w.Flow('s', flow, kInstancesPid, t.src + 1, Ns(r->second->prefill_done_s) - 1);
    w.Flow('t', flow, kTransfersPid, it->second, start + (end - start) / 2);
    w.Flow('f', flow, kInstancesPid, t.dst + 1, Ns(r->second->second_token_s) - 1);
  }

  std::map<std::tuple<int, int, bool>, int> tier_tracks;
  for (const TierIo& io : tier_ios_) {
    const auto key = std::make_tuple(io.node, static_cast<int>(io.tier), io.read);
    auto [it, added] = tier_tracks.emplace(key, tier_tracks.size() + 1);
    if (added) {
      w.Metadata("thread_name", kTiersPid, it->second,
                 "node" + std::to_string(io.node) + " " + policies::ToString(io.tier) +
                     (io.read ? " read" : " write"));
    }
    w.Slice(std::string(io.read ? "read " : "write ") + policies::ToString(io.tier), kTiersPid,
            it->second, Ns(io.start_s), Ns(io.end_s),
            {{"bytes", io.bytes},
             {"instance", InstanceName(instance_names, io.instance)},
             {"failed", io.failed}});
  }

  // Lifecycles: the request, and inside it the phases it went through.
  for (const policies::Request& r : requests) {
    if (r.finished_s < 0) continue;  // never sent (a closed loop that ran out of time)
    const nlohmann::json args = {
        {"input_tokens", r.input_tokens},
        {"output_tokens", r.output_tokens},
        {"cached_tokens", r.cached_tokens},
        {"prefill_instance", InstanceName(instance_names, r.prefill_instance)},
        {"decode_instance", InstanceName(instance_names, r.decode_instance)},
        {"status", policies::ToString(r.state)},
        {"reason", r.reason}};
    const std::string name = "request " + std::to_string(r.id);
    w.Async('b', name, r.id, Ns(r.arrival_s), &args);
    const Seconds first_token_s = r.kv_ready_s >= 0 ? r.kv_ready_s : r.prefill_done_s;
    const std::pair<const char*, std::pair<Seconds, Seconds>> phases[] = {
        {"queued", {r.arrival_s, r.first_scheduled_s}},
        {"prefill", {r.first_scheduled_s, r.prefill_done_s}},
        {"kv transfer", {r.prefill_done_s, r.kv_ready_s}},
        {"decode", {first_token_s, r.finished_s}}};
    const auto kv_parts = policies::KvTransferBreakdown(r);
    for (const auto& [phase, span] : phases) {
      if (span.first < 0 || span.second < span.first) continue;
      w.Async('b', phase, r.id, Ns(span.first));
      // The KV transfer's parts nest inside it, one after another from its start.
      if (kv_parts && std::string_view(phase) == "kv transfer") {
        Seconds at_s = span.first;
        for (const auto& [part, part_s] :
             {std::pair{"kv message", kv_parts->message_s}, std::pair{"kv wait", kv_parts->wait_s},
              std::pair{"kv pull", kv_parts->pull_s}}) {
          w.Async('b', part, r.id, Ns(at_s));
          at_s += part_s;
          w.Async('e', part, r.id, Ns(std::min(at_s, span.second)));
        }
      }
      w.Async('e', phase, r.id, Ns(span.second));
    }
    w.Async('e', name, r.id, Ns(r.finished_s));
  }
  w.Finish();
  out.flush();
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

}  // namespace duet::sim
