// `duet validate`'s comparison of the worlds and its report on stdout: each metric's live value
// (the median of a load's live runs, with their range) against the simulated one
// (cli/validate.cpp runs the worlds; validate_steps.h says where the error comes from).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/validate_flags.h"
#include "common/status.h"

namespace duet::cli {

// A rate scale as directory names and the report print it ("0.5", "2").
std::string RateText(double r);
// A percentage as the report prints it ("+1.2%"), or "n/a" for a null.
std::string PercentText(const nlohmann::json& value);
// The attribution's split of the live steps by whether another instance's iterations ran beside
// theirs ("beside_other_instances" and the decode bands' "alone" and "beside" of
// validate_steps.h's AttributeSteps), in words; "" where it has none (one instance).
std::string BesideOthersText(const nlohmann::json& steps);
// The attribution's split of each class's live steps by what their instance ran before them
// (its "after", validate_steps.h), in words: "prefill after idle +1.0% (80 steps), after prefill
// -2.0% (54 steps); decode ..."; "" where it has none.
std::string AfterText(const nlohmann::json& steps);
// The attribution's "on_cpu" (validate_steps.h): how much of the live forward passes' time their
// thread was on a core, and the prices against that time, by class and decode band, in words;
// "" where the step logs have no CPU time.
std::string OnCpuText(const nlohmann::json& steps);
// The suffix of the files of a load's k-th live run (1-based): "" for the first (live/,
// steps.jsonl, ...), "-K" for the others (live-K/, steps-K.jsonl, ...).
std::string RunSuffix(int k);

// A run's summary.json (DIR/summary.json) with what validate derives from the run's requests.csv
// beside it: "tpot_after_kv_transfer_ms" {"p50", "p99"}, each request's time per output token
// once its KV reached the decode instance, (E2E - TTFT - KV transfer) / (output tokens - 1), over
// the completed requests of two tokens or more (PD: left out where a completed request has no
// KV transfer). Errors name the file.
Result<nlohmann::json> ReadRunSummary(const std::string& dir);

// One metric of a load: the live value (the median of the live runs' summary.json values), the
// simulated one and the error between them ("error_pct"). With several runs, also each run's
// value, their range, the spread (range over median, in percent) and whether the simulated value
// lies within the live range: an error the runs' own noise could make.
nlohmann::json Compare(const Metric& m, const std::vector<nlohmann::json>& live_runs,
                       const nlohmann::json& simulated);

// Where a load's percentiles of TTFT, TPOT and E2E fall among the live runs' requests (each
// run's requests.csv in `live_dirs`, pooled; the completed requests that summary.json counts):
// sets each such metric's "place_in_live" to {"quantile" (50 for a p50), "requests" (how many
// live values), "live_runs" (each run's own value's place), and for every simulated value the
// metric has ("simulated", "simulated_at_live_speed", ...) its place under the same key}, a place
// being the percent of those requests whose value lies below it (ties count half). Where few
// requests lie near a percentile (a TPOT p50 between requests whose decode met no long step and
// those whose decode met one), a value off by 13% can be the live p47: off by 3% of the requests,
// which the live runs' own places show the noise of. Errors name the file.
Status PlaceInLive(nlohmann::json& load, const std::vector<Metric>& metrics,
                   const std::vector<std::string>& live_dirs);
// A load's "place_in_live" of the p50s and p99s of TTFT, TPOT and E2E in words: the simulated
// value's place (and at the live runs' speed, where simulated) beside the live runs' own; "" where
// it has none.
std::string PlacesText(const nlohmann::json& load);

// Holds one of a metric's errors, entry[`key`] (a percentage: "error_pct", the plain
// simulation's, or a variant's such as "error_at_live_speed_pct"), to the metric's --tolerance
// where one names it (by metric, else by statistic): sets "tolerance_pct", "tolerance_at" (`key`)
// and "within", and *exceeded when over. An error that is not a number is not held.
void HoldTolerance(const Metric& m, const std::map<std::string, double>& tolerances,
                   const std::string& key, nlohmann::json& entry, bool* exceeded);

// A load's sensitivity to the step costs: each metric's change, in percent, from the plain
// simulation's summary (`plain`) to one that priced steps `scale` times slower (above 1;
// `slower`: "all" for every step, or a shape class's name for that class's alone, to its
// summary): {"scale", "change_pct": {"all" or class: {metric: change}}}. Near a worker's
// saturation a step's time grows the batches, or the queue, behind it, so a metric moves
// several times as much as the steps: a price error counts that many times over. Where the
// load's live runs are several, also "step_speed_spread_pct", how far apart in speed the runs'
// steps ran (their live passes over their price, `load`'s steps' "priced_error_pct_by_run":
// range over median), and "spread_from_step_speed_pct": {metric: the spread over the runs, in
// percent of the metric, that those speeds would make at "all"'s sensitivity, taken as linear:
// as if the runs differed only in their machine's speed, every step's alike}. And how far the
// machine's speed moved over the load, "drift_pct": the larger of that spread and the range of
// the reference shapes' readings beside the runs over their median time (`load`'s "machine",
// "machine_spread_pct"), with "error_from_drift_pct": {metric: the change a price that far off on
// every step would make, taken as linear}: the error this machine's drift alone can make at this
// load, which a tolerance below it cannot tell from the cost model's.
nlohmann::json Sensitivity(const nlohmann::json& load, const std::vector<Metric>& metrics,
                           const nlohmann::json& plain, double scale,
                           const std::map<std::string, nlohmann::json>& slower);

// A load's "sensitivity" (Sensitivity) in words; "" where it has none.
std::string SensitivityText(const nlohmann::json& load);

// Sets each held metric's (HoldTolerance) "tolerance_below_drift" where the load's sensitivity
// states the error the machine's drift makes at it: whether that error is beyond the tolerance.
void MarkToleranceBelowDrift(nlohmann::json& load);

// The load against its --tolerance as a goal: of the metrics a tolerance holds (HoldTolerance),
// how many are within it, and for each missed one whether the live runs' own spread
// ("live_spread_pct") is smaller than the tolerance (a miss the noise does not excuse) and which
// part of the request's time accounts for it: the first of the simulations that each change one
// part ("at_live_speed": the machine's speed while it served; "at_machine_speed"; "as_live": the
// step costs as they ran live; "at_live_send": the send times; "as_live_hand_over";
// "as_live_at_live_send") whose error is within the tolerance, or none, with the one nearest it.
// Sets load["goal"] = {"held", "within", "missed": [{"metric", "error_pct" (the held error),
// "live_spread_pct" (null with one run), "spread_below_tolerance", "within_live_range",
// "within_when" (the simulation's key, or null), "within_when_error_pct", "nearest",
// "nearest_error_pct"}]}; nothing where no metric is held.
void StateGoal(nlohmann::json& load);
// A load's "goal" in words; "" where it has none.
std::string GoalText(const nlohmann::json& load);

// Whether a metric's --tolerance holds its error under `key` (HoldTolerance) and that error is
// beyond it.
bool Missed(const nlohmann::json& entry, const std::string& key);

// Whether two paths name the same file (compared canonical, where they resolve).
bool SameFile(const std::string& a, const std::string& b);

// --again: what this invocation of `duet validate` wants of the live runs a previous one
// recorded in OUT.
struct RecordedRuns {
  std::string trace;                   // --trace
  std::vector<std::string> selection;  // the trace selection's flags
  std::optional<int> repeats;          // --repeats, where given
  std::int64_t kv_blocks = 0;          // what the cluster file plans per instance
  nlohmann::json layout;               // its instances and engine settings (validate.cpp)
};
// The previous report `previous` (read from `path`, which errors name), checked against
// `wanted`: the same trace file and selection, the KV blocks and layout (where recorded) and the
// repeats (where given) as recorded; 1 to 8 loads at distinct rate scales, each with 1 to 10 runs
// and what it measured beside them ("cpu", "machine") in the form the report prints.
Result<nlohmann::json> RecordedReport(const nlohmann::json& previous, const std::string& path,
                                      const RecordedRuns& wanted);

// What the report's "profile" says of the cost model's profile, in words: the traffic it was
// fitted to ("fitted to this trace and selection: ...", "the sweep's ladders, fitted to no
// trace") and, where its source has them (`duet calibrate`'s passes_pct), how far stretches of
// its calibration ran from its medians: the machine's drift while it was measured.
std::string ProfileText(const nlohmann::json& profile);

// The report (validation.json's form) on stdout: the table of metrics by load, then per load the
// live runs' spread, the steps' attribution, host time, the errors with steps priced as they ran
// live and without host time, and the CPU beside the engine.
void PrintValidation(const nlohmann::json& report, const std::vector<Metric>& metrics);

}  // namespace duet::cli
