// Device memory for the CUDA tests: an owning buffer with upload/download, every call checked.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvpolicy/cuda/primitives/check.cuh"

namespace cudatest {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// A buffer of 0 elements still owns one element, so that get() is a real device pointer as an
  /// engine's pool always is (the kernels refuse null pointers: they cannot see on the host that
  /// every segment is empty).
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    KVPOLICY_CUDA_CHECK(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T)), "test buffer of ", n, " elements");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    if (!host.empty())
      KVPOLICY_CUDA_CHECK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) KVPOLICY_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }
  /// Fills every byte with `byte` (poisons an output before a run).
  void poison(unsigned char byte = 0xA5) {
    if (n_) KVPOLICY_CUDA_CHECK(cudaMemset(p_, byte, n_ * sizeof(T)), "poison");
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

inline void sync() { KVPOLICY_CUDA_CHECK(cudaDeviceSynchronize(), "synchronising after the kernels under test"); }

}  // namespace cudatest
