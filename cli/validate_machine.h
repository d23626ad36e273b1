// `duet validate`'s yardstick for the machine itself: two of the profile's own step shapes (the
// one-chunk prefill at no cached context with the most tokens up to 256, and the decode-only step
// with the most rows up to 8 and, among those, the least context per row of at least 256, else
// the most), timed alone on the device and threads the profile was calibrated with, before and
// after every live run, against what calibration measured for them. A machine that runs slower
// now than when it was calibrated (a shared VM drifts by 5-20% within minutes,
// docs/validation.md) makes the live steps slower than priced whatever the simulator does: this
// tells that drift apart from what the server itself adds (validate_steps.h prices the live
// steps).
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
  // device this build or machine cannot run, a model that does not load.
  static Result<MachineReference> Create(const std::string& model_dir,
                                         const models::StepProfile& profile);

  // Times each reference shape `repeats` times after one untimed pass: {"shapes": [{"name"
  // ("prefill 256", "decode 8x256": rows x context per row), "shape",
  // "calibrated_ms" (the profile's median), "now_ms" (the median now), "slower_pct"}],
  // "slower_pct": the shapes' summed time now over their summed calibrated time, less 1, in
  // percent (positive: the machine runs slower than when it was calibrated)}.
  nlohmann::json Time(int repeats);

 private:
  MachineReference(std::unique_ptr<backend::ForwardModel> model,
                   std::vector<models::StepMeasurement> shapes)
      : model_(std::move(model)), shapes_(std::move(shapes)) {}
  std::unique_ptr<backend::ForwardModel> model_;
  std::vector<models::StepMeasurement> shapes_;  // the calibration's measurements of them
};

// The median of a load's reference timings (each Time()'s "slower_pct", before and after every
// live run) with their range: {"slower_pct", "min_pct", "max_pct", "timings"}; null when none.
nlohmann::json SummarizeReference(const std::vector<nlohmann::json>& timings);

}  // namespace duet::cli
