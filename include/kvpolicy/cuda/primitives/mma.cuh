/// \file
/// kvpolicy/cuda/primitives/mma.cuh — the few sm_80+ instructions the tensor-core decode kernel is written in
/// (decode_mma.cuh): one warp's m16n8k16 matrix product with fp32 accumulation, ldmatrix from shared
/// memory, and cp.async copies from global into shared memory with their commit and wait. Each
/// wrapper is the PTX instruction of the same name (PTX ISA, "Warp-level matrix instructions" and
/// "Data movement: cp.async"); compiled below sm_80 they are never reached (the host selects the
/// kernel from the device's compute capability) and trap.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace kvpolicy::gpu::detail {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KVPOLICY_HAS_MMA 1
#else
#define KVPOLICY_HAS_MMA 0
#endif

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// d += a * b for one warp: a is m16 x k16 (4 registers of two 16-bit elements), b is k16 x n8 (2),
/// d is m16 x n8 in fp32 (4). T: __half or __nv_bfloat16, the element type of a and b.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
#if KVPOLICY_HAS_MMA
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

/// Four 8x8 matrices of 16-bit elements from shared memory: lanes 8j..8j+7 give the row addresses
/// of matrix j, and register j of lane l receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of
/// matrix j (transposed: row and column swapped).
template <bool Transposed>
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t row_address) {
#if KVPOLICY_HAS_MMA
  if constexpr (Transposed)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_address));
#else
  __trap();
#endif
}

/// 16 bytes from global to shared memory, asynchronously; with `bytes` = 0 the destination is
/// filled with zeros and nothing is read.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int bytes) {
#if KVPOLICY_HAS_MMA
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
#else
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if KVPOLICY_HAS_MMA
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

/// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
#if KVPOLICY_HAS_MMA
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}

/// Two fp32 values as one register of two 16-bit elements (x in the low half), rounded to nearest;
/// and the same for what rounding left over (x - hi, y - hi'), so hi + lo carries about twice the
/// element type's precision (the split that keeps the products near fp32 accuracy).
template <class T>
__device__ __forceinline__ void split_pack(float x, float y, std::uint32_t& hi, std::uint32_t& lo) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
    hi = *reinterpret_cast<const std::uint32_t*>(&h);
    lo = *reinterpret_cast<const std::uint32_t*>(&l);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
    hi = *reinterpret_cast<const std::uint32_t*>(&h);
    lo = *reinterpret_cast<const std::uint32_t*>(&l);
  }
}

}  // namespace kvpolicy::gpu::detail
