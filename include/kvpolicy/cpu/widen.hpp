/// \file
/// kvpolicy/cpu/widen.hpp — K/V rows from their storage dtype to fp32, many at a time (SPEC,
/// Notation: accumulation is fp32 whatever the storage). The vector route is Eigen's packet math,
/// the one SIMD layer the library uses (docs/architecture.md, "SIMD"): where Eigen vectorizes with
/// AVX (x86-64 built with -mavx or -march=native), eight values at once into one Packet8f — fp16 by
/// F16C's vcvtph2ps where compiled in (Eigen emulates it exactly otherwise), bf16 by a 16-bit shift.
/// Elsewhere the portable dtype::half_to_float and shift, one value at a time. Every route gives the
/// same bits: every binary16 and bfloat16 value is a float.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvpolicy/core/eigen.hpp"

#include "kvpolicy/core/dtype.hpp"

#if defined(EIGEN_VECTORIZE_AVX)
#define KVPOLICY_WIDEN_PACKET8 1
#else
#define KVPOLICY_WIDEN_PACKET8 0
#endif

// Eigen's packet functions are `inline`, not forced, under GCC and Clang, and GCC leaves some out of
// line (half2float among them: a call per 8 values, every register spilled around it, 8x slower).
// A kernel built on them inlines everything it calls.
#if defined(__GNUC__) || defined(__clang__)
#define KVPOLICY_PACKET_KERNEL [[gnu::flatten]]
#else
#define KVPOLICY_PACKET_KERNEL
#endif

namespace kvpolicy::cpu {

static_assert(sizeof(half) == sizeof(Eigen::half) && sizeof(bfloat16) == sizeof(Eigen::bfloat16),
              "kvpolicy's 16-bit dtypes are read as Eigen's: the same 16 bits, IEEE binary16 and bfloat16");

#if KVPOLICY_WIDEN_PACKET8
/// Eight fp32 lanes, Eigen's AVX packet.
using Packet8f = Eigen::internal::Packet8f;

// Eight values widened into one fp32 packet: the one place the vector conversions live (widen below
// and the decode kernels, cpu/decode_kernels.hpp, use them).
inline Packet8f widen8(const float* src) { return Eigen::internal::ploadu<Packet8f>(src); }
inline Packet8f widen8(const half* src) {
  using Eigen::internal::Packet8h;
  const Packet8h h = Eigen::internal::ploadu<Packet8h>(reinterpret_cast<const Eigen::half*>(src));
#if defined(__F16C__) && !defined(EIGEN_HAS_FP16_C)
  // Eigen 3.4.0 never defines EIGEN_HAS_FP16_C under GCC (its Clang-version test reads EIGEN_COMP_CLANG,
  // which is 0 there) and then widens Packet8h one value at a time, 8x slower: F16C's instruction here.
  return _mm256_cvtph_ps(h);
#else
  return Eigen::internal::pcast<Packet8h, Packet8f>(h);
#endif
}
inline Packet8f widen8(const bfloat16* src) {
  using Eigen::internal::Packet8bf;
  return Eigen::internal::pcast<Packet8bf, Packet8f>(
      Eigen::internal::ploadu<Packet8bf>(reinterpret_cast<const Eigen::bfloat16*>(src)));
}
#endif

/// dst[i] = to_float(src[i]) for i < n.
inline void widen(const float* src, float* dst, std::int64_t n) { std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float)); }

KVPOLICY_PACKET_KERNEL inline void widen(const half* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
#if KVPOLICY_WIDEN_PACKET8
  for (; i + 8 <= n; i += 8) Eigen::internal::pstoreu(dst + i, widen8(src + i));
#endif
  for (; i < n; ++i) dst[i] = dtype::half_to_float(src[i].bits);
}

KVPOLICY_PACKET_KERNEL inline void widen(const bfloat16* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
#if KVPOLICY_WIDEN_PACKET8
  for (; i + 8 <= n; i += 8) Eigen::internal::pstoreu(dst + i, widen8(src + i));
#endif
  for (; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(src[i].bits) << 16;
    std::memcpy(dst + i, &u, sizeof u);
  }
}

}  // namespace kvpolicy::cpu
