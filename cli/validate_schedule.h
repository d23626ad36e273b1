// `duet validate`'s account of the schedule each world ran: which steps, not what they cost.
// With the steps priced right, a latency error comes from the batches themselves: requests that
// met in one step live and in two simulated, decode tokens that shared their steps with more
// rows or with a prefill chunk. Both worlds write the same step log (policies/step_log.h: the
// live servers' `--step-log`, `duet simulate --step-log`), and both are read the same way here.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "models/step_profile.h"
#include "sim/cluster_spec.h"

namespace duet::cli {

// An instance's steps that begin after it ran none for this long began after an idle spell (a
// live loop's back-to-back iterations are tens of microseconds apart, a simulated one's 0).
inline constexpr Seconds kIdleSpellS = 1e-3;

// One world's schedule on one instance, from one step log.
struct Schedule {
  std::int64_t steps = 0;
  double busy_s = 0;  // its iterations, summed
  // The steps that began after an idle spell (the first one included), and their rows summed
  // (prefill chunks and decode rows): how many requests one step took on waking.
  std::int64_t after_idle_steps = 0;
  std::int64_t after_idle_rows = 0;
  // The wake-ups of the steps whose iteration a message woke from idle (the step log's
  // "woke_s"; none in a log written before they were measured), and of those a new request
  // woke (StepLogLine::RequestWakeS).
  std::vector<Seconds> woke_s, request_woke_s;
  // Decode tokens, and of them: the rows of their steps summed (each token counts its step's
  // rows), their steps' iterations summed (each token counts its step's time: the time per
  // output token the steps give), and those whose step also ran prefill chunks.
  std::int64_t decode_tokens = 0;
  double decode_rows_sum = 0, decode_iteration_sum_s = 0;
  std::int64_t decode_tokens_in_mixed = 0;

  // Its figures as the report gives them (null where there are no such steps).
  nlohmann::json ToJson() const;
};

// The figures of Schedule::ToJson as the report's line and the page's table give them: key,
// label, printf format.
struct ScheduleFigure {
  const char* key;
  const char* label;
  const char* format;
};
inline constexpr std::array<ScheduleFigure, 7> kScheduleFigures = {{
    {"after_idle_steps", "steps after an idle spell", "%.0f"},
    {"rows_per_step_after_idle", "requests per such step", "%.2f"},
    {"wake_ms", "ms from the message that woke the engine to its step (median)", "%.3f"},
    {"decode_rows_per_token", "rows in a decode token's step", "%.2f"},
    {"decode_ms_per_token", "ms of a decode token's step", "%.2f"},
    {"decode_tokens_in_mixed_pct", "% of decode tokens in steps with prefill chunks", "%.1f"},
    {"busy_s", "s busy", "%.2f"},
}};

// Per instance of `cluster` (by index), the schedule a step log holds. Errors name the file and
// line (a bad line, an instance the cluster file does not have).
Result<std::vector<Schedule>> ReadSchedules(const std::string& step_log,
                                            const sim::ClusterSpec& cluster);

// A simulation of the load besides the plain one, whose schedule is compared too: its key
// ("as_live": the schedule's "simulated_as_live"), its label in the report's line ("as live")
// and its step log.
struct VariantLog {
  std::string key, label, step_log;
};

// The schedules of a load, per instance by name: "live" (each figure the median of the live
// runs' schedules, ReadSchedules of their step logs, with "live_runs": each run's), "simulated"
// (the simulation's step log) and each variant's ("simulated_KEY"). Instances that ran no step
// in either world are left out.
Result<nlohmann::json> CompareSchedules(const std::vector<std::vector<Schedule>>& live,
                                        const std::string& simulated_step_log,
                                        const std::vector<VariantLog>& variants,
                                        const sim::ClusterSpec& cluster);

// The report's lines for one load's comparison ("schedule at xR, INSTANCE: LABEL A live [MIN-MAX],
// B simulated (C as live, ...); ..." for each of kScheduleFigures), one per instance.
std::string ScheduleText(const nlohmann::json& schedule, const std::string& rate);

// How the live runs handed requests to their engines, as measured: the wake-up of an idle engine
// that a new request woke (the median of the runs' schedules' request_woke_s; a PD decode
// engine, woken by KV, wakes sooner), and the frontend's time per request beyond what the
// profile's frontend fit prices per prompt token: the median over the completed requests of their
// requests.csv files of each one's service time, its hand-over (arrival_s plus ttft_frontend_ms)
// less the later of its arrival and the hand-over before it in the same run. The simulated
// frontend takes one request at a time; a request's own frontend time also holds its wait behind
// a burst's earlier requests, which the simulated queue adds again. A burst's requests that reach
// an engine while it wakes join its step; the frontend's pace and the wake-up decide how many do.
struct LiveHandOver {
  Seconds wake_s = 0;
  std::int64_t wakes = 0;  // the wake-ups measured (0: the logs predate them)
  Seconds frontend_request_s = 0;
  std::int64_t requests = 0;
  nlohmann::json ToJson() const;
};
Result<LiveHandOver> MeasureLiveHandOver(const std::vector<std::vector<Schedule>>& live,
                                         const std::vector<std::string>& live_requests_csvs,
                                         const models::StepProfile& profile);
// `profile` handing over as the live runs did: its host fit's wake-up set to theirs (a host fit
// that prices nothing else where it had none) and its frontend fit's time per request (its
// time per prompt token kept; none: 0).
models::StepProfile ProfileWithHandOver(const models::StepProfile& profile,
                                        const LiveHandOver& hand_over);

}  // namespace duet::cli
