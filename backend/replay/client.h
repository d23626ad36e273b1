// `duet replay`'s load generator: sends a trace's requests to an OpenAI-compatible server when
// traces::Arrivals says (open loop at their (scaled) arrival times, session turns after their
// predecessors, or a closed loop), a later turn's prompt carrying its predecessor's prompt and
// reply token ids; reads every streamed reply as it arrives, and turns each into the final
// request record the metrics collector (policies/metrics.h) takes, so a live run writes the same
// files as a simulated one. Boost.Beast/Asio, asynchronous on one io_context run
// by the calling thread: one connection per request, thousands in flight, no thread per request.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "backend/replay/openai.h"
#include "common/status.h"
#include "common/units.h"
#include "policies/metrics.h"
#include "traces/arrivals.h"
#include "traces/prompt.h"
#include "traces/trace.h"

namespace duet::backend::replay {

// The longest request timeout accepted (11.6 days): longer ones overflow the timers' clock.
inline constexpr Seconds kMaxTimeoutS = 1e6;

struct ReplayOptions {
  Endpoint endpoint;
  std::string model;    // the "model" of every request; required
  std::string api_key;  // sent as "Authorization: Bearer KEY"; empty: no such header
  traces::PromptOptions prompt;
  Seconds timeout_s = 600;  // per request: its send to the end of its reply; <= kMaxTimeoutS
  bool progress = false;    // redraw a progress bar on stderr
  // users > 0: a closed loop replaces the trace's arrival times (traces/arrivals.h).
  traces::ClosedLoop closed_loop;
};

// Facts about the run that the request records do not hold (summary.json's "replay" section).
struct ReplayReport {
  Seconds wall_s = 0;  // start of the run to the end of the last reply
  // Actual send minus scheduled send over the requests sent (the open loop's own lateness;
  // it counts into their TTFT and E2E, which run from the scheduled send).
  policies::Distribution send_lag_ms;
  std::map<std::string, std::int64_t> errors;  // requests not completed, by kind (docs/outputs.md)
  std::int64_t sent = 0;
  std::int64_t max_in_flight = 0;
  std::int64_t cached_tokens_reported = 0;    // completed replies with prompt_tokens_details
  std::int64_t duet_fields_reported = 0;      // completed replies with Duet's "duet" object
  std::int64_t prompt_tokens_mismatched = 0;  // usage.prompt_tokens differed from the prompt sent
  int instances_seen = 0;                     // 1 + the largest "duet" instance (0: none reported)
  bool interrupted = false;                   // SIGINT or SIGTERM ended the run early
};

// GET {endpoint}/v1/models and the first model id; errors name the URL and what failed. Blocks
// for at most `timeout_s`.
Result<std::string> QueryFirstModel(const Endpoint& endpoint, const std::string& api_key,
                                    Seconds timeout_s);
// Opens (and closes) one TCP connection to the endpoint. Blocks for at most `timeout_s`.
Status CheckReachable(const Endpoint& endpoint, Seconds timeout_s);

// Replays `trace` and returns when every request has a final record in `metrics` (completed,
// rejected: HTTP 429 or 503, or a turn whose predecessor cannot be continued; or failed: any
// other error, a timeout, an interruption; requests never sent are failed too), so the collector
// ends with exactly one record per trace request. Errors only when the run cannot start (bad
// options, or the host does not resolve). Request k is sent at start + (arrival_k - arrival_0); its
// record's arrival_s is the trace's arrival_k, and its other times are on the same clock (steady
// clock since the start, offset by arrival_0), so TTFT and E2E run from the scheduled send. SIGINT
// and SIGTERM end the run early: requests in flight fail ("interrupted") and the rest are recorded
// as not sent. Blocks the calling thread, which runs the network loop.
Result<ReplayReport> RunReplay(const traces::Trace& trace, const ReplayOptions& options,
                               policies::MetricsCollector& metrics);

}  // namespace duet::backend::replay
