// Step profiles: measured step times and the cost model fitted to them. `duet calibrate`
// measures a backend's steps (or reads measurements another tool made), fits, and writes a
// profile (the fit: step_fit.h); a cluster file's `"cost_model": {"kind":
// "fitted", "profile": FILE}` makes the simulator price steps with it. Pure C++.
//
// The fitted model is, for each shape class (prefill only, decode only, mixed), max-affine: a
// step costs the largest of at most two affine functions of its features (models/
// cost_model.h's StepFeatures), each with non-negative coefficients; a class may be split in
// two at a row count, each side max-affine (StepFit::split_rows). One piece is an affine
// cost model with a fitted per-step overhead; two capture a roofline's two regimes (a
// memory-bound piece whose intercept is the weight read, a compute-bound piece that grows with
// tokens) without naming either. Non-negative coefficients keep the cost monotone within a
// class: more work never costs less.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "models/cost_model.h"
#include "models/host_time.h"
#include "models/model_spec.h"

namespace duet::models {

// The columns a fit uses, in this order; names as they appear in profile files.
inline constexpr std::size_t kFitColumns = 7;
inline constexpr std::array<std::string_view, kFitColumns> kFitColumnNames = {
    "step",                   // 1 for every step: the overhead
    "prefill_chunk",          // per chunk (each also emits a logit row)
    "prefill_token",          // per new prompt token
    "prefill_context_token",  // per cached token a chunk attends to
    "prefill_pair",           // per causal (query, key) pair of the chunks
    "decode_row",             // per decoding request
    "decode_context_token",   // per cached token a decode row attends to
};
std::array<double, kFitColumns> FitColumns(const StepFeatures& f);

// The step shape as profile files and step-timing logs write it:
// {"prefill": [[tokens, context], ...], "decode_tokens": N, "decode_context_tokens": N, "tp": N}
nlohmann::json StepShapeToJson(const StepShape& shape);
Result<StepShape> ParseStepShape(const nlohmann::json& obj, const std::string& where);

enum class ShapeClass { kPrefill, kDecode, kMixed };
inline constexpr std::size_t kShapeClasses = 3;
const char* ToString(ShapeClass c);
ShapeClass ClassOf(const StepFeatures& f);  // of a non-empty step

// One executed step: its shape and how long its forward pass took (sampling excluded, as is
// everything else the loop does between passes).
struct StepTiming {
  StepShape shape;
  Seconds seconds = 0;
  // StepShapeToJson(shape) and "seconds": a line ParseStepMeasurements reads.
  nlohmann::json ToJson() const;
};

// One step shape timed `seconds.size()` times.
struct StepMeasurement {
  StepShape shape;
  std::vector<Seconds> seconds;  // every repeat, in order
  bool held_out = false;         // kept out of the fit to measure its error
  Seconds Median() const;
};

struct AffinePiece {
  std::array<double, kFitColumns> seconds_per{};  // seconds per unit of each column
  Seconds At(const std::array<double, kFitColumns>& columns) const;
};
// The largest piece's time (the max-affine model); *argmax, when given, is that piece's index.
Seconds MaxOfPieces(const std::vector<AffinePiece>& pieces,
                    const std::array<double, kFitColumns>& columns, std::size_t* argmax = nullptr);

// Relative error of a fit's predictions over some measurements of one class, in percent.
struct FitError {
  int shapes = 0;
  double mean_pct = 0;
  double p90_pct = 0;
  double max_pct = 0;
};

using ClassErrors = std::array<FitError, kShapeClasses>;

struct StepFit {
  int tp = 1;
  // Per shape class (prefill, decode, mixed): 1 or 2 pieces each. Prefill-only and decode-only
  // steps have their own pieces because backends run them on their own paths (a decode-only
  // step never enters the prefill attention kernel); the fit gives mixed steps pieces fitted
  // on every class's measurements (step_fit.h).
  std::array<std::vector<AffinePiece>, kShapeClasses> pieces;
  // Where a class is split (split_rows > 0): steps with at least that many rows in their matrix
  // multiplies (prefill tokens plus decode rows, StepFeatures::tokens) are priced by
  // pieces_above instead, 1 or 2 pieces. Backends change kernels with the row count, and a
  // change to a faster kernel makes the cost concave in rows, which no max-affine function is:
  // the CPU backend's decode steps run a weight-streaming GEMV below 12 rows and oneDNN from 12.
  std::array<Tokens, kShapeClasses> split_rows{};
  std::array<std::vector<AffinePiece>, kShapeClasses> pieces_above;
  const std::vector<AffinePiece>& PiecesFor(ShapeClass c, double rows) const;
  ClassErrors training{};
  ClassErrors held_out{};
  // The roofline's error on the same held-out shapes, where calibrate was asked to compare
  // (shapes == 0 otherwise).
  ClassErrors roofline_held_out{};
  // How the fit extrapolates: the error, on each class's largest shapes (the quarter that took
  // longest) that lie beyond the rest of its sweep, of a fit made without them (step_fit.h).
  // Zero shapes where too few were measured to leave them out.
  ClassErrors extrapolation{};
  Seconds Predict(const StepFeatures& f) const;  // 0 for an empty step
};

// One transfer size moved `seconds.size()` times through a KV transport.
struct TransferMeasurement {
  Bytes bytes = 0;
  std::vector<Seconds> seconds;  // every repeat, in order
  bool held_out = false;         // kept out of the fit to measure its error
  Seconds Median() const;
};

// A KV transport between two instances on one machine (`duet calibrate --transport`), fitted
// as the simulator's links are described: latency plus bytes over bandwidth. A cluster file's
// node gives it to the path between its devices: "nvlink": {"fitted": "<transport>"}.
struct LinkFit {
  std::string transport;  // what cluster files name it by: "loopback", "ucx"
  // How it moved the bytes: "loopback", "ucx:posix,cma", "ucx:auto" (UCX's own choice).
  std::string path;
  Seconds latency = 0;
  BytesPerSecond bandwidth = 0;
  FitError training;  // relative error on the sizes fitted
  FitError held_out;  // and on those held out of the fit
  std::vector<TransferMeasurement> measurements;
  Seconds Time(Bytes bytes) const { return latency + static_cast<double>(bytes) / bandwidth; }
};

// Host time (models/host_time.h) as one affine function of a step's counts, coefficients
// non-negative, fitted to a live server's step log (`duet calibrate --host-steps`).
struct HostFit {
  std::array<double, kHostColumns> seconds_per{};  // seconds per unit of each column
  int steps = 0;                                   // iterations the fit saw, held-out ones included
  FitError training;                               // per-iteration relative error
  FitError held_out;
  // The held-out iterations' priced host time against their measured sum, percent (signed):
  // what the simulator's timeline sees, where per-iteration noise averages out.
  double held_out_total_pct = 0;
  // An idle engine's wake-up: the median time from the message that woke it to the iteration
  // that followed (the step log's "woke_s"), over `wakes` iterations; requests handed over
  // meanwhile join that iteration's step. 0 where the log measured none.
  Seconds wake_s = 0;
  int wakes = 0;
  Seconds Predict(const HostCounts& c) const;
};

// The frontend's time per request (RequestSpec::frontend_s: from its arrival to the hand-over to
// the engines) as an affine function of its prompt's tokens, coefficients non-negative: `duet
// calibrate` times the server's own path from a request's body of token ids (as `duet replay`
// sends them) to the engines' request. The simulator delays each request's hand-over by it.
struct FrontendFit {
  Seconds request_s = 0;       // per request
  Seconds prompt_token_s = 0;  // per prompt token
  int requests = 0;            // requests timed for the fit
  FitError training;           // relative error on the prompt lengths timed (their medians)
  Seconds Predict(Tokens prompt_tokens) const {
    return request_s + prompt_token_s * static_cast<double>(prompt_tokens);
  }
};

// A forward pass after its engine sat idle runs longer than in a run of steps: on the development
// VM a one-row decode step 1.1x after 50 ms asleep and 1.9x after a second, a prefill pass some
// 13-20 ms longer (docs/validation.md, bench/step_order.sh): caches and the core's speed come
// back from the idle spell. `duet calibrate` times a prefill and a decode step right after
// sleeping each of `idle_s` against the same step in a run of itself; the simulator adds the
// difference to a step that follows an idle spell of its instance, interpolated (linear in the
// logarithm of the spell between the spells timed, from nothing at none, the longest's beyond
// it). A mixed step is priced as a prefill.
struct AfterIdleFit {
  std::vector<Seconds> idle_s;     // the spells timed, ascending, each at least kIdleGap
  std::vector<Seconds> prefill_s;  // a prefill pass's extra time after each (FitAfterIdle's)
  std::vector<Seconds> decode_s;   // a decode step's
  int repeats = 0;                 // times each was timed
  // The extra time of a step of class `c` after `idle` seconds idle (0 below kIdleGap).
  Seconds Extra(ShapeClass c, Seconds idle) const;
};

// A forward pass runs longer in two cases `duet calibrate` times against the same pass in a run of
// itself, each as a matrix over a few reference shapes (decode steps by rows at one context per
// row, one-chunk prefills by new tokens at no context), a step standing as the reference shape of
// its class nearest in the logarithm of its rows or new tokens (a mixed step as a prefill of its
// new tokens):
// - right after a step of another shape (the profile's `after_step`; 0 on the diagonal): on one
//   development VM a one-row decode step x1.5 after a 1,024-token prefill, a 256-token prefill
//   x1.03-1.09 after any other step; on another x1.19 and x1.01-1.05 (docs/validation.md,
//   bench/step_order.sh). The simulator adds it to a step whose instance ran a step of another
//   reference shape just before it (no idle spell between them).
// - beside a step of another instance on the same machine (`beside`, `duet calibrate --beside`):
//   two CPU instances share the memory bandwidth and the last-level cache, and a one-row decode
//   step, bound by the bandwidth, lost 17.7% beside a prefill loop on the AVX2 VM of 2026-12-02
//   where an 8-row one lost 0.7% (docs/validation.md). Calibrate times each reference shape while
//   a second copy of the model runs each one over and over on its own thread; the simulator runs
//   a step of an instance at alone / (alone + extra) of its pace while a step of another instance
//   on its node runs. A shape between two reference sizes (or beside a neighbour between two)
//   takes the extra's share of the time alone interpolated between theirs in the logarithm of
//   the size, and beyond the largest (smallest) the share of that one: a 600-token prefill
//   beside a one-row decode step is priced between the 256- and the 1,024-token ones, a
//   2,048-token prefill the 1,024-token one's share of its own, longer, time.
struct ShapePairFit {
  std::vector<Tokens> decode_rows;     // the decode steps timed, ascending
  std::vector<Tokens> prefill_tokens;  // the prefill chunks timed, ascending
  // extra_s[i][j]: reference shape i's extra time after (beside) shape j (the decode steps, then
  // the prefills, each in order), each at least 0; after_step's is 0 where i == j.
  std::vector<std::vector<Seconds>> extra_s;
  int repeats = 0;  // times each was timed
  // beside's: each reference shape's median time alone, in the same order (the denominator of
  // its share); after_step has none.
  std::vector<Seconds> alone_s;
  // The reference shape standing for `shape` (an index into extra_s); nullopt for an empty step.
  std::optional<std::size_t> Nearest(const StepShape& shape) const;
  // after_step's rule: the extra time of `shape` after `other`, the nearest reference shapes'.
  // A step switching from one reference shape to another refills what the other left in the
  // caches, a cost of the switch: a step after one of its own reference shape pays nothing.
  Seconds Extra(const StepShape& shape, const StepShape& other) const;
  // beside's rule: the extra time of `shape`, `shape_alone` long alone, beside `other`: the
  // reference shapes' shares of their time alone interpolated on both sizes (above), times
  // shape_alone. Needs alone_s.
  Seconds ShareBeside(const StepShape& shape, const StepShape& other, Seconds shape_alone) const;
};

struct StepProfile {
  std::string device;         // what ran the steps: "cpu", "cuda", "h100-sxm (aiconfigurator)"
  nlohmann::json source;      // provenance: tool, version, command, date, host (an object)
  ModelSpec model;            // the model the steps ran
  std::vector<StepFit> fits;  // one per TP degree
  std::vector<StepMeasurement> measurements;
  std::vector<LinkFit> links;              // one per transport timed; none when none was
  std::optional<HostFit> host;             // the engine's host time, when calibrated on a step log
  std::optional<FrontendFit> frontend;     // the server's frontend time, when calibrate timed it
  std::optional<AfterIdleFit> after_idle;  // a step after an idle spell, when calibrate timed it
  std::optional<ShapePairFit> after_step;  // a step after another kind, when calibrate timed it
  std::optional<ShapePairFit> beside;      // a step beside another instance's, when timed
  const StepFit* FitFor(int tp) const;     // nullptr when none
  const LinkFit* LinkFor(std::string_view transport) const;  // nullptr when none
  // source's field `key`, null where it has none (a profile need not say where it comes from).
  nlohmann::json SourceField(const char* key) const;
};

// The median of some times (interpolated between the middle two of an even count; 0 for none),
// as StepMeasurement::Median takes it.
Seconds MedianOf(std::vector<Seconds> seconds);

// Relative errors (percent) summarised: their count, mean, p90 and max.
FitError SummarizeErrors(const std::vector<double>& pct);

// How the machine's speed moved during a sweep that `duet calibrate` timed in passes over every
// shape, in sweep order: each pass cut into `parts` runs of consecutive measurements (its
// stretches of time), and for each, the median over its measurements of that pass's time over
// the measurement's median time, less one, in percent ([pass][part]). A machine whose speed
// drifts shows here as stretches that ran slower or faster as a whole; the profile's medians
// price the middle of them. Empty unless there are at least `parts` measurements, all with the
// same number of repeats, at least 2.
std::vector<std::vector<double>> PassDeviationsPct(const std::vector<StepMeasurement>& measurements,
                                                   std::size_t parts);

// Each of `measurements`' shapes with `other`'s times of the same shape after its own: the same
// sweep timed at another time (a calibration before a validation's live runs and one after), so
// that a fit prices the machine over both rather than at one moment of a machine whose speed
// drifts. Held-out marks are cleared (the fit marks its own). Errors, naming `where`: a shape one
// of them has and the other has not (not the same sweep), or more step times than a profile holds;
// `measurements` may then be pooled in part, for the caller to drop.
Status PoolMeasurements(std::vector<StepMeasurement>& measurements,
                        const std::vector<StepMeasurement>& other, const std::string& where);

// The relative error of `model` on the measurements of `tp`: the held-out ones, or the others.
ClassErrors ErrorOf(const StepCostModel& model, const std::vector<StepMeasurement>& measurements,
                    int tp, bool held_out);

nlohmann::json StepProfileToJson(const StepProfile& profile);
// The profile as a file: indented, with one measurement per line (diffs stay readable).
std::string FormatStepProfile(const StepProfile& profile);
// Every field bounded; errors name `where` and the field.
Result<StepProfile> ParseStepProfile(const nlohmann::json& doc, const std::string& where);
Result<StepProfile> LoadStepProfile(const std::string& path);
// One measurement: a step shape with "seconds" one number or an array of repeats, and
// optionally "held_out"; other fields are ignored.
Result<StepMeasurement> ParseStepMeasurement(const nlohmann::json& obj, const std::string& where);
// Measurements as JSON lines (`duet generate --timings`, `duet serve --step-log`, scripts/), one
// ParseStepMeasurement object a line. Blank lines are skipped.
Result<std::vector<StepMeasurement>> ParseStepMeasurements(std::string_view text,
                                                           const std::string& where);

// The first architecture field where `measured` and `used` differ, as "field: A vs B";
// nullopt when a profile measured on `measured` prices `used` faithfully.
std::optional<std::string> ArchitectureMismatch(const ModelSpec& measured, const ModelSpec& used);

// A StepCostModel from one fit: the fit of the instance's TP degree (a shape's tp is not
// consulted), and the host fit when the profile has one. Pure and allocation-free per call.
class FittedCostModel : public StepCostModel {
 public:
  explicit FittedCostModel(StepFit fit, std::optional<HostFit> host = std::nullopt,
                           std::optional<AfterIdleFit> after_idle = std::nullopt,
                           std::optional<ShapePairFit> after_step = std::nullopt,
                           std::optional<ShapePairFit> beside = std::nullopt);
  Seconds StepTime(const StepShape& shape) const override;
  void AppendDecodeRunEnds(StepShape shape, int steps, Seconds start,
                           std::vector<Seconds>* ends) const override;
  bool PricesHost() const override { return host_.has_value(); }
  Seconds HostTime(const HostCounts& counts) const override;
  Seconds WakeTime() const override { return host_ ? host_->wake_s : 0; }
  Seconds AfterIdle(const StepShape& shape, Seconds idle_s) const override;
  Seconds AfterStep(const StepShape& shape, const StepShape& previous) const override;
  bool PricesBeside() const override { return beside_.has_value(); }
  Seconds Beside(const StepShape& shape, const StepShape& neighbour) const override;
  const StepFit& fit() const { return fit_; }

 private:
  StepFit fit_;
  std::optional<HostFit> host_;
  std::optional<AfterIdleFit> after_idle_;
  std::optional<ShapePairFit> after_step_;
  std::optional<ShapePairFit> beside_;
};

}  // namespace duet::models
