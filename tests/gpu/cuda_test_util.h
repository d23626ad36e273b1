// Helpers of the CUDA tests: skip (with the reason) where no device is present, device buffers
// that copy to and from host vectors, and comparisons within bf16 tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

namespace duet::kernels::cuda::testing {

// Every GPU test starts with this: it skips, saying why, on a machine without a device.
#define DUET_REQUIRE_CUDA_DEVICE()                                                        \
  do {                                                                                    \
    if (::duet::kernels::cuda::DeviceCount() == 0)                                        \
      GTEST_SKIP() << "needs a CUDA device: " << ::duet::kernels::cuda::DescribeDevice(); \
  } while (0)

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n_) DUET_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (n_) DUET_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    DUET_CUDA_CHECK(cudaDeviceSynchronize());
    if (n_) DUET_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
};

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
