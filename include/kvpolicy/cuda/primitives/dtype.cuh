/// \file
/// kvpolicy/cuda/primitives/dtype.cuh — the device storage dtypes of K/V (float, __half, __nv_bfloat16) and
/// their conversions; scores and accumulation are fp32 whatever the storage (SPEC, Notation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace kvpolicy::gpu {

template <class T>
inline constexpr bool is_device_storage_v =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <class T>
inline constexpr const char* dtype_name = std::is_same_v<T, float> ? "float32"
                                          : std::is_same_v<T, __half> ? "float16"
                                                                      : "bfloat16";

namespace detail {

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__host__ __device__ inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return __float2bfloat16_rn(x);
}

}  // namespace detail

}  // namespace kvpolicy::gpu
