/// \file
/// kvpolicy/cuda/kernels/gemm.cuh — the gates' fp32 matrix products, in one place:
///   C[b] = A[b] B[b]^T, row-major, A [M, K], B [N, K], C [M, N], for b < batch (strided),
/// by cuBLAS (SGEMM, or strided-batched SGEMM for batch > 1). With KVPOLICY_CUDA_GEMM_KERNEL
/// defined (CMake option KVPOLICY_CUDA_GEMM_KERNEL, on in the `gpusim` preset) a plain CUDA kernel
/// computes them instead: GPU simulators such as GPGPU-Sim cannot run cuBLAS (closed-source SASS),
/// and with this path every kernel of the gates around the products still runs there. The kernel
/// sums in fp32 in index order: exact fp32 products like cuBLAS's default math mode, though not
/// necessarily in cuBLAS's order. The handle is then unused and may be null.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kvpolicy/cuda/primitives/check.cuh"

namespace kvpolicy::gpu {

inline void check_cublas(cublasStatus_t status, const char* what, const std::string& shapes) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail("cuda: ", what, " failed: cuBLAS status ", static_cast<int>(status), " (", cublasGetStatusString(status), ") (",
       shapes, ")");
}

/// True where the gates' products run on cuBLAS (a handle is needed), false with
/// KVPOLICY_CUDA_GEMM_KERNEL.
inline constexpr bool gemm_uses_cublas =
#ifdef KVPOLICY_CUDA_GEMM_KERNEL
    false;
#else
    true;
#endif

namespace detail {

/// One thread per element of C; grid (ceil(M N / 256), batch).
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void gemm_nt_kernel(int M, int N, int K, const float* A, long long stride_a, const float* B,
                               long long stride_b, float* C, long long stride_c) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= std::int64_t{M} * N) return;
  const std::int64_t m = i / N, n = i % N, b = blockIdx.y;
  const float* a = A + b * stride_a + m * K;
  const float* w = B + b * stride_b + n * K;
  float s = 0.0f;
  for (int k = 0; k < K; ++k) s = __fadd_rn(s, __fmul_rn(a[k], w[k]));
  C[b * stride_c + m * N + n] = s;
}

/// C[b] = A[b] B[b]^T (row-major; strides in elements) on `stream`; `what` and `shapes` name the
/// call in an error.
inline void gemm_nt(cublasHandle_t handle, int M, int N, int K, const float* A, long long stride_a, const float* B,
                    long long stride_b, float* C, long long stride_c, int batch, cudaStream_t stream, const char* what,
                    const std::string& shapes) {
  if constexpr (!gemm_uses_cublas) {
    (void)handle;
    const std::int64_t n = std::int64_t{M} * N;
    require(batch <= 65535, "cuda: ", what, ": batch = ", batch, " exceeds the fallback GEMM's grid (", shapes, ")");
    gemm_nt_kernel<><<<dim3(blocks_for(n, 256, "gemm_nt_kernel"), static_cast<unsigned>(batch)), 256, 0, stream>>>(
        M, N, K, A, stride_a, B, stride_b, C, stride_c);
    check_launch("gemm_nt_kernel", shapes);
  } else {
    const float one = 1.0f, zero = 0.0f;
    check_cublas(cublasSetStream(handle, stream), "cublasSetStream", shapes);
    check_cublas(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode", shapes);  // alpha, beta
    // row-major C[M, N] = A[M, K] B[N, K]^T is column-major C^T[N, M] = op_T(B) A: B and A are read
    // as column-major [K, N] and [K, M] with leading dimension K
    if (batch == 1)
      check_cublas(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, K, A, K, &zero, C, N), what, shapes);
    else
      check_cublas(cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, K, stride_b, A, K,
                                             stride_a, &zero, C, N, stride_c, batch),
                   what, shapes);
  }
}

}  // namespace detail

}  // namespace kvpolicy::gpu
