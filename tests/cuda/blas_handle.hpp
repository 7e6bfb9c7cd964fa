// A cuBLAS handle for the gate tests, owned for one case: created where the gates' products run on
// cuBLAS, null under KVPOLICY_CUDA_GEMM_KERNEL (the gpusim build: GPGPU-Sim cannot run cuBLAS, and
// the gates then need no handle).
#pragma once

#include <cublas_v2.h>

#include "kvpolicy/cuda/kernels/gemm.cuh"

namespace cudatest {

class BlasHandle {
 public:
  BlasHandle() {
    if constexpr (kvpolicy::gpu::gemm_uses_cublas)
      kvpolicy::gpu::check_cublas(cublasCreate(&handle_), "cublasCreate", "test");
  }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  ~BlasHandle() {
    if (handle_) cublasDestroy(handle_);
  }
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace cudatest
