// Helpers of the CUDA tests: skip (with the reason) where no device is present, and
// comparisons within bf16 tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_buffer.h"

namespace duet::kernels::cuda::testing {

// Every GPU test starts with this: it skips, saying why, on a machine without a device.
#define DUET_REQUIRE_CUDA_DEVICE()                                                        \
  do {                                                                                    \
    if (::duet::kernels::cuda::DeviceCount() == 0)                                        \
      GTEST_SKIP() << "needs a CUDA device: " << ::duet::kernels::cuda::DescribeDevice(); \
  } while (0)

// |a - b| <= atol + rtol * |b| element-wise; the failure names the first few offenders.
inline ::testing::AssertionResult AllClose(const std::vector<float>& actual,
                                           const std::vector<float>& expected, double rtol,
                                           double atol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure()
           << "sizes differ: " << actual.size() << " vs " << expected.size();
  std::size_t bad = 0;
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], b = expected[i];
    if (std::abs(a - b) <= atol + rtol * std::abs(b)) continue;
    if (bad++ < 5) failure << "[" << i << "] " << a << " vs " << b << "; ";
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return failure << bad << " of " << actual.size() << " outside tolerance";
}

}  // namespace duet::kernels::cuda::testing
