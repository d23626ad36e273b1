// `duet validate`'s account of where its error comes from: the live steps of a load (the
// servers' step logs) priced by the cluster file's cost model, and the profile that prices
// steps as they ran live (cli/validate.cpp runs and compares the worlds).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "models/step_profile.h"
#include "sim/cluster_spec.h"

namespace duet::cli {

// The whole of a text file ("" when it cannot be read).
std::string ReadText(const std::string& path);

// The live steps of one load (the step logs of its live runs) beside the cost model's price for
// their shapes, by shape class, decode steps also by batch size (1, 2-3, 4-7, ...: backends
// change kernels with it), by quarter of each run (summed over the runs), by run, overall and
// per class ("priced_error_pct_by_run", in the logs' order), and the live iterations' time
// outside their forward passes. Where the logs have the passes' CPU time
// (policies::StepLogLine::forward_cpu_s), each of these sums has "on_cpu": the share of the
// passes' time their thread was on a core, and the price against that CPU time (a pass
// preempted by the machine's other threads took longer than it computed); where the cost model
// adds to the price of a step after an idle spell or right after another kind of step (below), or
// beside other instances' steps on its node (StepCostModel::Beside, for the time their live
// iterations overlapped, by the simulator's rule), each sum's "after_idle_s", "after_step_s"
// and "beside_s" are those parts of its price. Each decode band
// also has "calibration": the profile's own measurements of that band priced by their fit (the
// fit's error there, a part of the live steps'); prefill-only steps alike by their new tokens
// ("prefill_by_tokens": 1, 2-3, ..., 64-127, ...). And each class's steps by what their
// instance ran before them in the run ("after": "idle", where its previous iteration ended at
// least models::kIdleGap before theirs began, or they were its first; else that iteration's
// class): a CPU forward pass runs slower after an idle spell or another kind of step
// (docs/validation.md, bench/step_order.sh). A step after an idle spell is priced with what the
// cost model adds for it (StepCostModel::AfterIdle: a profile whose calibration timed it), a step
// right after another with what it adds after that one's shape (StepCostModel::AfterStep), as the
// simulator does. `simulated_summary`: the simulation's summary.json, for its step count.
Result<nlohmann::json> AttributeSteps(const std::vector<std::string>& step_logs,
                                      const sim::ClusterSpec& cluster,
                                      const nlohmann::json& simulated_summary);

// The cluster file's fitted profile with the pieces of each shape class scaled by what the live
// steps they priced took over their price (`steps`: AttributeSteps'; below and above a class's
// split apart; pieces that priced no live step are left as they are; what the cost model adds
// for what ran before and beside the steps, AddedBeyondShape, stays as it is and out of the
// ratio): a simulation from it prices steps as they ran live, so the error left in it is not the
// step costs'. Returns the profile and the scales: per class, and "<class> above split" where a
// class is split.
std::pair<models::StepProfile, nlohmann::json> ProfileAsLive(const sim::ClusterSpec& cluster,
                                                             const nlohmann::json& steps);

// The reference shapes among a profile's measurements that `duet validate` times beside the
// live runs (validate_machine.h gives the rules; tp 1, timed at least once), those found, as
// indices into profile.measurements: the prefill, the decode batch, the one-row decode step.
std::vector<std::size_t> ReferenceShapes(const models::StepProfile& profile);
// Their names: "prefill 256", "decode 8x256" (rows x context per row).
std::string ReferenceShapeName(const models::StepShape& shape);

// `profile` with each class's pieces (below and above a split apart) scaled by the machine's
// speed as the reference shapes they price read it (`machine`: a load's SummarizeReference,
// validate_machine.h: each shape's median against calibration, weighted by its calibrated time
// where two shapes are priced by the same pieces), and the pieces that price none of them by
// the readings together ("slower_pct"; all of them where `machine` has no shape's median, a
// record from before they were kept). A simulation from it prices each kind of step at the
// machine's speed for that kind: a one-row decode step, bound by memory bandwidth, drifts apart
// from a prefill pass. Returns the profile and {"scale" (the readings together), "scales"
// {"prefill", "decode", "decode above split" (where split), "mixed": k}, "by" {the same keys,
// where reference shapes read it: their names}}.
std::pair<models::StepProfile, nlohmann::json> ProfileAtMachineSpeed(
    const models::StepProfile& profile, const nlohmann::json& machine);

// `profile` with every step piece scaled by `k` (its host and frontend time as they are), or
// only those of the class `only`: a simulation from it prices steps at the live runs' speed
// (LiveSpeed below), or one class's slower (the load's sensitivity,
// validate_report.h).
models::StepProfile ProfileScaled(const models::StepProfile& profile, double k,
                                  std::optional<models::ShapeClass> only = std::nullopt);

// Of a sum of live steps' price (AttributeSteps' whole, a class's, ...), what the cost model adds
// for what ran before and beside them: "after_idle_s", "after_step_s" and "beside_s".
double AddedBeyondShape(const nlohmann::json& sum);

// The machine's speed during a load's live runs against its speed at calibration, from the live
// steps themselves: what they took over what the profile's fits price them at, both less what it
// adds after idle spells (`steps`:
// AttributeSteps'), times what those fits price the profile's own measurements at over what
// calibration measured (summed over every measured shape of a fitted tp). The second factor
// anchors the speed at calibration's measurements rather than at the fits, so that a fit off
// its own measurements (every coefficient times 1.3, say) stays that far off at this speed,
// while a machine that runs slower than when it was calibrated (the whole profile's
// measurements) does not. {"scale", "live_over_priced", "fits_over_measured"}; null without
// live steps or measurements to anchor at.
nlohmann::json LiveSpeed(const models::StepProfile& profile, const nlohmann::json& steps);

// The cluster file again with `profile` as its cost model, written to DIR/profile-NAME.json and
// DIR/cluster-NAME.json; returns the cluster file's path.
Result<std::string> WriteClusterWithProfile(const sim::ClusterSpec& cluster,
                                            const models::StepProfile& profile,
                                            const std::string& dir, const std::string& name);

}  // namespace duet::cli
