// A device allocation that owns its memory (cudaMalloc / cudaFree), with copies to and from host
// vectors. Move-only. For the CUDA model and the GPU tests.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

namespace duet::kernels::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n_) DUET_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (n_) DUET_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), n_(other.n_) {
    other.ptr_ = nullptr;
    other.n_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(n_, other.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  std::size_t size() const { return n_; }
  // Grows (discarding the contents) to hold at least n elements.
  void Reserve(std::size_t n) {
    if (n <= n_) return;
    *this = DeviceBuffer(n);
  }
  // Asynchronous copy of host[0 .. n) to the start of the buffer (grown first if needed).
  void Upload(const T* host, std::size_t n, cudaStream_t stream) {
    Reserve(n);
    if (n)
      DUET_CUDA_CHECK(cudaMemcpyAsync(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
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

}  // namespace duet::kernels::cuda
