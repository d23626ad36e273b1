// The fit behind `duet calibrate`: the simulator's max-affine step-cost model
// (models/step_profile.h) fitted to measured step times, with its error measured on shapes
// held out of the fit. Here rather than in models/ because it needs a linear-algebra library
// (Eigen), which the pure layers do not include.
#pragma once

#include <vector>

#include "common/status.h"
#include "models/step_profile.h"

namespace duet::backend {

struct FitOptions {
  int held_out_every = 4;  // of each class, the 4th, 8th, ... measurement is held out
  int max_pieces = 2;      // 1: one affine function; 2: the larger of two where it pays
};
// Marks the held-out measurements (of `tp`), fits prefill-only and decode-only steps on the
// rest of their own class and mixed steps on the rest of every class, and measures the error
// on both. Errors: a class with fewer than 8 training measurements or none held out.
Result<models::StepFit> FitSteps(std::vector<models::StepMeasurement>& measurements, int tp,
                                 const FitOptions& options = {});

}  // namespace duet::backend
