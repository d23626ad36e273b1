// A request's lifecycle as the shared engine sees it, in both worlds (simulated and real):
// arrival -> queued -> prefill (possibly in chunks) -> [KV transfer] -> decode -> completed,
// or rejected / failed. Timestamps are absolute seconds on the run's clock.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/units.h"

namespace duet::policies {

using RequestId = std::uint64_t;
using BlockHash = std::uint64_t;
using InstanceId = int;
inline constexpr InstanceId kNoInstance = -1;
// KV tiers below GPU memory: host DRAM, local SSD, remote store (policies/kv_tiers.h).
inline constexpr int kNumLowerTiers = 3;

enum class RequestState {
  kArrived,       // seen by the frontend, not yet routed
  kQueued,        // waiting on an instance for its (next) prefill
  kLoading,       // admitted: KV blocks held, cached prefix blocks loading from lower tiers
  kPrefilling,    // admitted: KV blocks held, prompt being computed in chunks
  kTransferring,  // PD: prefill done, KV waiting for / moving to the decode instance
  kDecoding,      // generating one token per step
  kCompleted,
  kRejected,  // never served (reason says why)
  kFailed,    // started but could not finish (reason says why)
};

const char* ToString(RequestState state);
bool IsFinished(RequestState state);

// Why a request that was served ended: a stop token or stop string, its max_tokens, an abort
// (the client went away), or an error (state kFailed, reason says which).
enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* ToString(FinishReason reason);  // "stop", "length", "abort", "error", ""

// How a request picks its tokens and when it stops, as an OpenAI-compatible client gives them.
// Real backend only: the simulator has no token ids, and output_tokens stands in for EOS there.
struct SamplingParams {
  float temperature = 0.0f;           // 0: greedy (the largest logit)
  float top_p = 1.0f;                 // 1: off
  std::int32_t top_k = 0;             // 0: off
  std::optional<std::uint64_t> seed;  // absent: derived from the request id
  // Sampling one of these ends the request; it is the last output token (EOS ids belong here
  // unless the client asked to ignore EOS).
  std::vector<std::int32_t> stop_token_ids;
  // Text that ends the request where it appears in the output (excluded from it). Matched on
  // the decoded text by whoever detokenizes (the server), which then finishes the request: the
  // engine sees only token ids.
  std::vector<std::string> stop_strings;
};

// What the engine's sampler requires of a request's settings, checked in the engine's own
// types (float): every edge that builds SamplingParams from a client's values (the HTTP
// server, the worker wire) calls this after converting them, so that no value it let through
// can trip the sampler's invariants (a top_p of 1e-300 is positive as a double and 0 as a
// float). Empty when the settings are valid; otherwise the field and what is wrong with it.
struct SamplingProblem {
  std::string field;    // "temperature", "top_p", "top_k" or "stop_token_ids"
  std::string message;  // "must be in (0, 1], got 0 as the engine's 32-bit float"
};
std::optional<SamplingProblem> CheckSampling(const SamplingParams& sampling);

// What the client asked for: fixed once the frontend has sent it (the engine never writes it).
// Serializable: the worker wire carries it whole (backend/cluster/wire.cpp, one field table).
struct RequestSpec {
  RequestId id = 0;
  Seconds arrival_s = 0;  // the client's send (simulated), or the server's receipt (live)
  // From arrival to the hand-over to the engines: the frontend's parsing, tokenization, prefix
  // hashing and routing. Measured live; priced by a profile's frontend fit in the simulator.
  Seconds frontend_s = 0;
  Tokens input_tokens = 0;
  // The most tokens to generate (a client's max_tokens). The simulator's stand-in for EOS; in
  // the real backend a stop token can end the request earlier (RequestRecord::generated_tokens
  // says how many it got).
  Tokens output_tokens = 0;
  // Chained hashes of the prompt's full engine blocks (prefix identity); may cover fewer
  // blocks than the prompt when the trace has no content information for the rest. When a
  // later request continues this one's context (a session's next turn), they go on over the
  // output's full blocks, which a colocated instance caches at completion.
  std::vector<BlockHash> block_hashes;
  // Real backend only (empty in simulation): the prompt's token ids.
  std::vector<std::int32_t> prompt_ids;
  SamplingParams sampling;  // real backend only
  // The session (or closed-loop user) the request belongs to, for per-session throughput; -1:
  // none.
  std::int64_t session = -1;
};

// What happened to the request: where it ran, its timeline and its outcome. METRICS.md's
// outputs are computed from it (with the spec's arrival and sizes); the worker wire mirrors it
// to the frontend with every event.
struct RequestRecord {
  RequestState state = RequestState::kArrived;
  InstanceId prefill_instance = kNoInstance;
  InstanceId decode_instance = kNoInstance;
  std::optional<double> router_score;  // the router's score of prefill_instance (RoutingDecision)
  Tokens generated_tokens = 0;         // output tokens produced so far
  Tokens cached_tokens = 0;            // prompt tokens served from the prefix cache (GPU and lower
                                       // tiers), first admission
  // Prompt tokens found in each lower tier at the first admission (part of cached_tokens).
  std::array<Tokens, kNumLowerTiers> tier_hit_tokens{};
  int preemptions = 0;
  Bytes kv_transfer_bytes = 0;  // PD: KV moved from the prefill to the decode instance

  // Timeline (seconds; negative: not reached).
  Seconds first_scheduled_s = -1;  // first admission: KV blocks allocated, prefill (or the
                                   // load of its cached prefix) starts
  // Time before the first token spent waiting for prefix loads from the lower tiers and not
  // hidden behind computation (the whole load, or what outlasted the overlapped prefill step).
  Seconds load_wait_s = 0;
  Seconds prefill_done_s = -1;     // end of the prefill step that produced the first token
  Seconds kv_arrived_s = -1;       // PD: its KvReady message reached the decode instance
  Seconds kv_pull_started_s = -1;  // PD: the decode instance started pulling its KV
  Seconds kv_ready_s = -1;         // PD: KV usable on the decode instance
  Seconds first_token_s = -1;      // first token delivered to the client
  Seconds second_token_s = -1;     // the second one (PD: the first from the decode instance)
  Seconds last_token_s = -1;
  Seconds finished_s = -1;
  FinishReason finish_reason = FinishReason::kNone;
  std::string reason;  // for rejected / failed
};

// The time from one timeline stamp to another, both reached (nullopt otherwise). Stamps of
// worker processes are on clocks set to the run's within an error each
// (backend/cluster/clock_sync.h): a span shorter than their errors together may read
// negative, and counts as 0.
inline std::optional<Seconds> Elapsed(Seconds from, Seconds to) {
  if (from < 0 || to < 0) return std::nullopt;
  return to > from ? to - from : 0.0;
}

// PD: a KV transfer (the end of the prefill to the KV usable on the decode instance) in the
// parts that add up to it: the KvReady message's way to the decode instance (`message`), its
// wait there until the pull started (the decode engine's step in flight, then room for the KV:
// `wait`), and the pull until the decode engine saw it complete (at a step boundary: `pull`).
// nullopt: no transfer completed, or one whose parts were not stamped.
struct KvTransferParts {
  // The parts' names, in this order, as every output spells them: summary.json's
  // kv_transfer.parts_ms, a reply's duet.kv_transfer_parts_ms, requests.csv's kv_NAME_ms, the
  // label of duet:kv_transfer_part_seconds and validate's kv_transfer_parts_ms.NAME.
  static constexpr std::array<const char*, 3> kNames = {"message", "wait", "pull"};
  Seconds message_s = 0, wait_s = 0, pull_s = 0;
  std::array<Seconds, 3> InOrder() const { return {message_s, wait_s, pull_s}; }
};
inline std::optional<KvTransferParts> KvTransferBreakdown(const RequestRecord& r) {
  const auto message = Elapsed(r.prefill_done_s, r.kv_arrived_s);
  const auto wait = Elapsed(r.kv_arrived_s, r.kv_pull_started_s);
  const auto pull = Elapsed(r.kv_pull_started_s, r.kv_ready_s);
  if (!message || !wait || !pull) return std::nullopt;
  return KvTransferParts{*message, *wait, *pull};
}

// Moves the timeline stamps reached (those not negative) by `delta_s`, onto another clock (a
// worker serving several frontends converts between each one's run clock and its engine's). A
// stamp that would fall before that clock's start reads 0: still reached.
inline void ShiftTimeline(RequestRecord& record, Seconds delta_s) {
  for (Seconds* t : {&record.first_scheduled_s, &record.prefill_done_s, &record.kv_arrived_s,
                     &record.kv_pull_started_s, &record.kv_ready_s, &record.first_token_s,
                     &record.second_token_s, &record.last_token_s, &record.finished_s}) {
    if (*t >= 0) *t = std::max(0.0, *t + delta_s);
  }
}

// The serving engine's working state on the instance that holds the request now. Travels only
// with a PD hand-over (the decode instance goes on from it).
struct RequestProgress {
  Tokens prefill_target = 0;   // tokens to compute in the current prefill (prompt + output
                               // so far after a preemption)
  Tokens computed_tokens = 0;  // tokens whose KV is present (cache hits included)
  // While kLoading: tokens being loaded from each lower tier (not yet in computed_tokens).
  std::array<Tokens, kNumLowerTiers> loading_tokens{};
  std::int64_t offloaded_blocks = 0;  // leading prompt blocks already handed to the lower tiers
  // Real backend only: the ids of the tokens generated so far (generated_tokens of them).
  std::vector<std::int32_t> output_ids;
};

// A request as an engine holds it: the three parts side by side. Code that needs one part only
// takes that part (spec(), record()).
struct Request : RequestSpec, RequestRecord, RequestProgress {
  const RequestSpec& spec() const { return *this; }
  RequestSpec& spec() { return *this; }
  const RequestRecord& record() const { return *this; }
  RequestRecord& record() { return *this; }
  const RequestProgress& progress() const { return *this; }
  RequestProgress& progress() { return *this; }

  Tokens SequenceTokens() const { return input_tokens + generated_tokens; }
  Tokens RemainingOutput() const { return output_tokens - generated_tokens; }
  Tokens LoadingTokens() const { return loading_tokens[0] + loading_tokens[1] + loading_tokens[2]; }
  // Real backend: the id of the sequence's token at `position` (prompt, then output).
  std::int32_t TokenAt(Tokens position) const {
    return position < input_tokens ? prompt_ids[static_cast<std::size_t>(position)]
                                   : output_ids[static_cast<std::size_t>(position - input_tokens)];
  }
};

}  // namespace duet::policies
