// The fit behind `duet calibrate`: the simulator's max-affine step-cost model
// (step_profile.h) fitted to measured step times, with its error measured on shapes held out of
// the fit; likewise links, the engine's host time and the frontend's. Beside the cost models it
// fits, since it needs no backend: only measurements. The least squares are Eigen's, which
// models/ includes in its .cpp files only (tests/common/layering_test.cpp), so this header and
// every user of it stay free of it; its own library (duet_step_fit) keeps Eigen's code out of
// every other user of models/.
#pragma once

#include <vector>

#include "common/status.h"
#include "models/step_profile.h"

namespace duet::models {

struct FitOptions {
  // Of each class, one measurement in each whole run of `held_out_every` is held out, at a place
  // that moves back by one from one run to the next (the 4th, 7th, 10th, 13th, 20th, ...), so
  // that a sweep's shapes are held out across its grid.
  int held_out_every = 4;
  int max_pieces = 2;  // 1: one affine function; 2: the larger of two where it pays
  // Decode steps split in two at a batch size where it pays (StepFit::split_rows): backends
  // change kernels at small row counts (a GEMV, then a GEMM), and only decode batches are that
  // small; prefill and mixed steps, with their 16 or more rows, are never split.
  bool split_decode = true;
};
// Marks the held-out measurements (of `tp`), fits prefill-only and decode-only steps on the
// rest of their own class and mixed steps on the rest of every class, and measures the error
// on both, and how it extrapolates beyond its sweep (StepFit::extrapolation). Errors: a class
// with fewer than 8 training measurements or none held out.
Result<StepFit> FitSteps(std::vector<StepMeasurement>& measurements, int tp,
                         const FitOptions& options = {});

// A KV transport's transfer times (the median of each size) fitted as latency plus bytes over
// bandwidth, the relative error minimised by least squares (small transfers count as much as
// large ones), latency at least 0. The sizes are held out as FitSteps holds out a class's shapes
// (by position, so pass them sorted by size: the smallest and the largest are never held out).
// Returns the fit with its measurements, held-out ones marked, and its error on both; the
// caller names the transport. Errors: fewer than 5 sizes, or times that do not grow with size.
Result<LinkFit> FitLink(std::vector<TransferMeasurement> measurements,
                        const FitOptions& options = {});

// One live iteration for the host-time fit: its counts and its time outside the forward pass.
struct HostSample {
  HostCounts counts;
  Seconds seconds = 0;
};
// The engine's host time (models/host_time.h) fitted to live iterations (a step log's): one
// affine function of the counts, coefficients non-negative, by least squares on the seconds
// themselves (the simulator's timeline adds them up, so the sum must come out right, not each
// iteration's ratio). One in each `held_out_every` is held out as FitSteps holds out a class's
// shapes. Errors: fewer than 20 iterations, or no time outside the forward passes at all.
Result<HostFit> FitHost(const std::vector<HostSample>& samples, const FitOptions& options = {});

// One prompt length's frontend times (FrontendFit): every repeat, in seconds.
struct FrontendSample {
  Tokens prompt_tokens = 0;
  std::vector<Seconds> seconds;
};
// The frontend's time fitted to the median of each prompt length as FitLink fits transfers
// (the relative error minimised, both coefficients at least 0). Errors: fewer than 2 lengths.
Result<FrontendFit> FitFrontend(const std::vector<FrontendSample>& samples);

// A step's extra time after each idle spell (AfterIdleFit), from its timings after each
// (ascending spells, every repeat): the medians made the closest non-decreasing sequence by
// least squares (pooling adjacent violators), each at least 0. A longer spell leaves caches and
// the core at least as cold, so a shorter spell's median above a longer one's is the timing's
// noise (with 3 repeats on the development VM, a prefill read +2.2 ms after 10 ms and +0.0 ms
// after 100 ms).
std::vector<Seconds> FitAfterIdle(const std::vector<std::vector<Seconds>>& extras);

}  // namespace duet::models
