// A worker's clock on its frontend's time, with no clock shared between hosts: the worker's
// own steady clock plus an offset measured with NTP's four timestamps over the worker link,
// and a bound on that offset's error that holds whatever the two directions' delays are.
//
// A probe leaves the worker at t0 (its steady clock) and reaches the frontend at t1; the
// frontend's reply leaves at t2 and reaches the worker at t3 (t1 and t2 on the frontend's run
// clock: seconds since the run's start). Delays are never negative, so the true offset
// (frontend time minus worker time) lies in [t2 - t3, t1 - t0]: its midpoint is the offset,
// its half-width the error. Between probes the two clocks may drift apart: a sample's error
// grows at kMaxClockDrift from when it was taken, and a later probe replaces it only when its
// own error is no greater.
#pragma once

#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>

#include "common/status.h"
#include "common/units.h"
#include "policies/ports.h"

namespace duet::backend::cluster {

// How fast two hosts' steady clocks may drift apart: 100 ppm, ten times what NTP assumes of a
// quartz clock.
inline constexpr double kMaxClockDrift = 100e-6;

struct ClockSample {
  std::int64_t offset_ns = 0;  // frontend run time minus worker steady time
  std::int64_t error_ns = 0;   // the true offset is within offset_ns +- error_ns
  std::int64_t taken_ns = 0;   // the worker's steady time when the reply arrived (t3)
  // The error at worker steady time `now_ns`, grown by the drift since the sample was taken.
  std::int64_t ErrorAt(std::int64_t now_ns) const;
};

// The sample of one probe (see above); an error when the four times cannot come from one
// probe and its reply (the reply arrived before the probe left, or the frontend held it longer
// than the round trip took).
Result<ClockSample> SampleOfProbe(std::int64_t t0_ns, std::int64_t t1_ns, std::int64_t t2_ns,
                                  std::int64_t t3_ns);

// This process's steady clock in nanoseconds.
std::int64_t SteadyNowNs();

// How a worker's clock follows a new offset: it slews toward it at kMaxClockSlew, so that no
// duration measured on it is off by more than that fraction, unless the change is more than
// kClockStepNs, which it steps (not moving back: it holds until its steady time caught up).
inline constexpr double kMaxClockSlew = 500e-6;
inline constexpr std::int64_t kClockStepNs = 10'000'000;

// The run's clock in a worker: its steady clock plus an offset that follows the best sample
// (above). Never goes back. Thread-safe.
class SyncedClock final : public policies::Clock {
 public:
  // Before the first sample: the worker's steady clock, raw (nothing should read it then).
  Seconds Now() const override;
  // Takes `sample` when none is held or its error is no greater than the held one's error
  // now; returns whether it did.
  bool Offer(const ClockSample& sample);
  // The offset in use now and the bound on its error (the sample's, grown by drift, plus how
  // far the offset has yet to slew to it); nullopt before the first sample.
  std::optional<ClockSample> Current() const;

 private:
  std::int64_t OffsetAt(std::int64_t steady_ns) const;  // caller holds mu_

  mutable std::mutex mu_;  // guards what follows
  std::optional<ClockSample> sample_;
  std::int64_t from_ns_ = 0;   // the offset when sample_ was taken up, slewing toward it since
  std::int64_t since_ns_ = 0;  // that steady time
  mutable std::int64_t last_ns_ = std::numeric_limits<std::int64_t>::min();  // Now's latest
};

}  // namespace duet::backend::cluster
