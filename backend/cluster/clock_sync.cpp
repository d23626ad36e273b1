// A worker's clock on its frontend's time (see clock_sync.h).
#include "backend/cluster/clock_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

namespace duet::backend::cluster {

std::int64_t ClockSample::ErrorAt(std::int64_t now_ns) const {
  const double since = static_cast<double>(std::max<std::int64_t>(0, now_ns - taken_ns));
  return error_ns + static_cast<std::int64_t>(std::ceil(since * kMaxClockDrift));
}

Result<ClockSample> SampleOfProbe(std::int64_t t0_ns, std::int64_t t1_ns, std::int64_t t2_ns,
                                  std::int64_t t3_ns) {
  if (t3_ns < t0_ns) return Status::Error("a clock reply that arrived before its probe left");
  if (t2_ns < t1_ns) return Status::Error("a clock reply sent before its probe arrived");
  // In 128 bits: the times are any int64 the peer sent, and their differences need not fit.
  const __int128 round_trip = static_cast<__int128>(t3_ns) - t0_ns;
  const __int128 held = static_cast<__int128>(t2_ns) - t1_ns;
  if (held > round_trip)
    return Status::Error("a clock reply held longer (" + std::to_string(static_cast<double>(held)) +
                         " ns) than its round trip took (" +
                         std::to_string(static_cast<double>(round_trip)) + " ns)");
  const __int128 offset2 =
      (static_cast<__int128>(t1_ns) - t0_ns) + (static_cast<__int128>(t2_ns) - t3_ns);
  const __int128 offset = offset2 / 2;
  constexpr __int128 kMost = std::int64_t{1} << 62;  // far past any run
  if (offset > kMost || offset < -kMost)
    return Status::Error("a clock offset of more than 146 years");
  ClockSample s;
  s.offset_ns = static_cast<std::int64_t>(offset);
  // Rounded up: the bound must hold.
  s.error_ns = static_cast<std::int64_t>((round_trip - held + 1) / 2);
  s.taken_ns = t3_ns;
  return s;
}

std::int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::int64_t SyncedClock::OffsetAt(std::int64_t steady_ns) const {
  if (!sample_) return 0;
  const std::int64_t to = sample_->offset_ns;
  const double moved =
      static_cast<double>(std::max<std::int64_t>(0, steady_ns - since_ns_)) * kMaxClockSlew;
  const double left = std::abs(static_cast<double>(to) - static_cast<double>(from_ns_));
  if (moved >= left) return to;
  const auto step = static_cast<std::int64_t>(moved);
  return to > from_ns_ ? from_ns_ + step : from_ns_ - step;
}

Seconds SyncedClock::Now() const {
  std::lock_guard lock(mu_);
  const std::int64_t steady = SteadyNowNs();
  last_ns_ = std::max(last_ns_, steady + OffsetAt(steady));
  return static_cast<double>(last_ns_) * 1e-9;
}

bool SyncedClock::Offer(const ClockSample& sample) {
  std::lock_guard lock(mu_);
  if (sample_ && sample.error_ns > sample_->ErrorAt(sample.taken_ns)) return false;
  const std::int64_t now = SteadyNowNs();
  if (!sample_) {
    from_ns_ = sample.offset_ns;
    last_ns_ = std::numeric_limits<std::int64_t>::min();  // the times before were raw
  } else {
    const std::int64_t current = OffsetAt(now);
    const bool step = std::abs(static_cast<double>(sample.offset_ns) -
                               static_cast<double>(current)) > kClockStepNs;
    from_ns_ = step ? sample.offset_ns : current;
  }
  since_ns_ = now;
  sample_ = sample;
  return true;
}

std::optional<ClockSample> SyncedClock::Current() const {
  std::lock_guard lock(mu_);
  if (!sample_) return std::nullopt;
  const std::int64_t now = SteadyNowNs();
  ClockSample current = *sample_;
  current.offset_ns = OffsetAt(now);
  current.error_ns = sample_->ErrorAt(now) +
                     static_cast<std::int64_t>(std::abs(static_cast<double>(current.offset_ns) -
                                                        static_cast<double>(sample_->offset_ns)));
  return current;
}

}  // namespace duet::backend::cluster
