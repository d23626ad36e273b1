// `duet simulate --timeline FILE`: what the simulated cluster did, as a Chrome / Perfetto trace
// (JSON trace-event format, docs/outputs.md): a track per instance with each engine step as a
// slice, a track per KV route with each transfer, a track per tier and direction with each I/O,
// flow arrows from a request's last prefill step over its KV transfer to its first decode
// step, and each request's lifecycle as nested async slices (its KV transfer in its parts). Opens
// in ui.perfetto.dev as is.
//
// The records are added where the simulator knows them (SimPorts::Execute,
// SimKvTransport::Poll, SimTierStorage::Poll), not from SimGrid's activity signals, because
// no signal carries them. A step is a sleep, or a wait that new work may cut short, not an
// activity. A KV transfer or tier I/O is one communication per TP shard (none when it fails
// its check), and its record ends when its owner polls it done: when the engine takes the KV
// (kv_ready). SimGrid 3.32 signals a communication's completion when an actor first tests or
// waits on it (Activity::on_completion; it declares Comm::on_start but never fires it), and
// an instance in a decode run wakes on its transfer's end but polls it at the step boundary.
// Recorded at the signal, such transfers and tier I/Os would end earlier than the engine takes
// them, and the requests' kv transfer phases and the flows would no longer meet the transfers'
// slices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "policies/kv_tiers.h"
#include "policies/request.h"

namespace duet::sim {

class Timeline {
 public:
  // One engine step: its tokens and requests (a decode run's steps each get one).
  struct Step {
    policies::InstanceId instance;
    Seconds start_s, end_s;
    Tokens prefill_tokens, decode_tokens;
    std::int32_t prefill_requests, decode_requests;
  };
  struct Transfer {
    policies::RequestId request;
    policies::InstanceId src, dst;
    Bytes bytes;
    Seconds start_s, end_s;
    bool failed;
  };
  struct TierIo {
    policies::TierKind tier;
    int node;
    bool read;
    policies::InstanceId instance;  // kNoInstance: between two tiers
    Bytes bytes;
    Seconds start_s, end_s;
    bool failed;
  };

  void Add(const Step& s) { steps_.push_back(s); }
  void Add(const Transfer& t) { transfers_.push_back(t); }
  void Add(const TierIo& io) { tier_ios_.push_back(io); }

  // Writes the trace to `path`; requests give the lifecycles and the flows' end points.
  Status Write(const std::string& path, const std::vector<std::string>& instance_names,
               const std::vector<policies::Request>& requests) const;

 private:
  std::vector<Step> steps_;
  std::vector<Transfer> transfers_;
  std::vector<TierIo> tier_ios_;
};

}  // namespace duet::sim
