/// \file
/// kvpolicy/cuda/memory/device_array.cuh — a device allocation that frees itself: what Cache<cuda_backend>
/// owns its pool, tables and scratch in.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kvpolicy/cuda/primitives/check.cuh"

namespace kvpolicy::gpu::detail {

/// A device allocation that frees itself.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n) : n_(n) {
    if (n) KVPOLICY_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)), "cudaMalloc: allocating ", n * sizeof(T), " bytes");
  }
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace kvpolicy::gpu::detail
