// `duet validate`'s yardstick for the machine itself: the profile's own step shapes of three
// kinds (the one-chunk prefill at no cached context with the most tokens up to 256; the
// decode-only step with the most rows up to 8 and, among those, the least context per row of at
// least 256, else the most; and the one-row decode step of that context rule), timed alone on
// the device and threads the profile was calibrated with, before and after every live run,
// against what calibration measured for them. A machine that runs slower now than when it was
// calibrated (a shared VM drifts by 5-20% within minutes, docs/validation.md) makes the live
// steps slower than priced whatever the simulator does: this tells that drift apart from what
// the server itself adds (validate_steps.h prices the live steps). The kinds drift apart: a
// one-row decode step streams every weight for one token and is bound by memory bandwidth,
// which other guests of a host share, while a prefill pass and a batch of rows compute; on
// 2026-12-02 one VM ran its one-to-three-row decode steps 11-25% slower than at its calibration
// half an hour before, its prefill and 4-8-row decode steps within 0-5%.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/engine/forward_model.h"
#include "common/status.h"
#include "models/step_profile.h"

namespace duet::cli {

class MachineReference {
 public:
  // The model in `model_dir` on the profile's device with its threads (source "threads"; all
  // cores when it names none), with KV blocks for the reference shapes. Errors say why there is
  // no reference: a profile without those shapes (fitted to measurements from elsewhere), a
  // device this build or machine cannot run, a model that does not load. `neighbour`: also a
  // second copy of the model, alike, for timing each shape beside another instance (below),
  // where the cluster places instances side by side on one machine.
  static Result<MachineReference> Create(const std::string& model_dir,
                                         const models::StepProfile& profile, bool neighbour);

  // Times each reference shape `repeats` times as calibrate does (StepTimer::TimeInARun, in
  // passes over the shapes): {"shapes": [{"name"
  // ("prefill 256", "decode 8x256", "decode 1x256": rows x context per row), "shape",
  // "calibrated_ms" (the profile's median), "now_ms" (the median now), "slower_pct"}],
  // "slower_pct": the shapes' summed time now over their summed calibrated time, less 1, in
  // percent (positive: the machine runs slower than when it was calibrated)}. With a neighbour,
  // also "beside": each shape timed alike again while the neighbour runs the first reference
  // shape of the other kind (prefill beside decode, decode beside prefill) over and over on its
  // own thread, as a prefill and a decode instance run beside each other on one machine's
  // cores, memory and caches: {"shapes": [{"name", "neighbour" (the shape it ran), "alone_ms"
  // (now_ms above), "beside_ms", "slower_pct"}], "slower_pct" (summed beside over summed alone,
  // less 1)}: what `duet calibrate`, timing each shape alone, cannot price.
  nlohmann::json Time(int repeats);

 private:
  MachineReference(std::unique_ptr<backend::ForwardModel> model,
                   std::unique_ptr<backend::ForwardModel> neighbour,
                   std::vector<models::StepMeasurement> shapes)
      : model_(std::move(model)), neighbour_(std::move(neighbour)), shapes_(std::move(shapes)) {}
  nlohmann::json TimeBeside(int repeats, const std::vector<models::StepMeasurement>& alone);
  std::unique_ptr<backend::ForwardModel> model_;
  std::unique_ptr<backend::ForwardModel> neighbour_;  // null without one
  std::vector<models::StepMeasurement> shapes_;       // the calibration's measurements of them
};

// The median of a load's reference timings (each Time()'s "slower_pct", before and after every
// live run) with their range and each shape's median: {"slower_pct", "min_pct", "max_pct",
// "shapes": {name: slower_pct}, "timings"}, and where they were timed beside a neighbour,
// "beside" alike of their "beside" readings; null when none.
nlohmann::json SummarizeReference(const std::vector<nlohmann::json>& timings);

// `duet validate --again` with another profile: a load's reference timings (SummarizeReference's
// summary, recorded beside the live runs against the profile whose source is `timed_source`)
// read against `profile`'s own measurements of the same shapes, as if the runs had been
// validated with it: each shape's now_ms over its median in `profile`. A profile pooled from
// sweeps before and after the live runs (calibrate --pool) reads them against its pooled times.
// The readings beside a neighbour (both timed live) are kept. Errors say why they cannot be:
// `profile` was measured on another device or threads, or has no measurement of a timed shape.
Result<nlohmann::json> RereadReference(const nlohmann::json& machine,
                                       const nlohmann::json& timed_source,
                                       const models::StepProfile& profile);

}  // namespace duet::cli
