// The engine's host time: what one iteration of an instance's loop does outside its forward
// pass, measured live by phase (`duet serve --step-log`: each line's "host"), and the counts of
// the step it is fitted on (`duet calibrate --host-steps`: a profile's "host" fit prices it in
// the simulator). Pure C++.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/units.h"

namespace duet::models {

// The phases of one iteration outside the forward pass, in the order they run.
enum class HostPhase {
  kSchedule,  // taking messages, planning the batch, tier bookkeeping (allocation excluded)
  kAllocate,  // the scheduler's KV block allocation and prefix lookups (preemptions' frees too)
  kPrepare,   // block table snapshot, the model's inputs, waiting on tier writes of its blocks
  kSample,    // picking each row's token from the logits (greedy rows: inside the forward pass)
  kApply,     // applying the tokens to the requests, finishing them (streaming excluded)
  kStream,    // the event sink: detokenizing and handing tokens and records to their streams
              // (a worker process: encoding its events and sending them to the frontend)
};
inline constexpr std::size_t kHostPhases = 6;
// Names as reports print them; step logs write each as "<name>_s" (seconds).
inline constexpr std::array<std::string_view, kHostPhases> kHostPhaseNames = {
    "schedule", "allocate", "prepare", "sample", "apply", "stream"};

// What host time is fitted on (and priced from in the simulator).
struct HostCounts {
  double rows = 0;      // batch rows: prefill chunks and decoding requests
  double admitted = 0;  // requests that joined the batch in the step
  double finished = 0;  // requests that ended in the step (completed or failed)
  double tokens = 0;    // tokens handed to streams: one per decode row and per finished prefill
};

// One iteration's host time by phase and its counts.
struct HostStep {
  std::array<Seconds, kHostPhases> phase_s{};
  HostCounts counts;
  Seconds& at(HostPhase p) { return phase_s[static_cast<std::size_t>(p)]; }
  Seconds total() const;  // the phases' sum
};

// {"schedule_s": .., ..., "stream_s": .., "rows": N, "admitted": N, "finished": N, "tokens": N}
nlohmann::json HostStepToJson(const HostStep& step);
// Every field required and bounded (phases at most `max_s` each, counts at most 2^31); errors
// name `where` and the field.
Result<HostStep> ParseHostStep(const nlohmann::json& obj, const std::string& where, Seconds max_s);

// The columns a host-time fit uses, in this order; names as profile files write them.
inline constexpr std::size_t kHostColumns = 5;
inline constexpr std::array<std::string_view, kHostColumns> kHostColumnNames = {
    "step", "row", "admitted", "finished", "token"};
std::array<double, kHostColumns> HostColumns(const HostCounts& c);

}  // namespace duet::models
