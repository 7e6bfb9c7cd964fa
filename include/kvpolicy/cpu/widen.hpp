/// \file
/// kvpolicy/cpu/widen.hpp — K/V rows from their storage dtype to fp32, many at a time (SPEC,
/// Notation: accumulation is fp32 whatever the storage). fp16 uses the F16C instruction
/// (_mm256_cvtph_ps, 8 per instruction) when the translation unit is compiled for it (-mf16c or
/// -march=native on x86-64); elsewhere the portable dtype::half_to_float, which gives the same bits
/// (F16C is exact: every binary16 value is a float). bf16 is a 16-bit shift: 8 per AVX2
/// instruction pair where compiled in, one at a time elsewhere.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvpolicy/core/dtype.hpp"

#if (defined(__F16C__) || defined(__AVX2__)) && (defined(__x86_64__) || defined(_M_X64))
#include <immintrin.h>
#endif
#if defined(__F16C__) && (defined(__x86_64__) || defined(_M_X64))
#define KVPOLICY_WIDEN_F16C 1
#else
#define KVPOLICY_WIDEN_F16C 0
#endif
#if defined(__AVX2__) && (defined(__x86_64__) || defined(_M_X64))
#define KVPOLICY_WIDEN_AVX2 1
#else
#define KVPOLICY_WIDEN_AVX2 0
#endif

namespace kvpolicy::cpu {

// Eight values widened into one fp32 vector register: the one place the vector conversions live
// (widen below and the decode kernels, cpu/decode_kernels.hpp, use them).
#if KVPOLICY_WIDEN_F16C
inline __m256 widen8(const half* src) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))); }
#endif
#if KVPOLICY_WIDEN_AVX2
inline __m256 widen8(const float* src) { return _mm256_loadu_ps(src); }
inline __m256 widen8(const bfloat16* src) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))), 16));
}
#endif

/// dst[i] = to_float(src[i]) for i < n.
inline void widen(const float* src, float* dst, std::int64_t n) { std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float)); }

inline void widen(const half* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
#if KVPOLICY_WIDEN_F16C
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, widen8(src + i));
#endif
  for (; i < n; ++i) dst[i] = dtype::half_to_float(src[i].bits);
}

inline void widen(const bfloat16* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
#if KVPOLICY_WIDEN_AVX2
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, widen8(src + i));
#endif
  for (; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(src[i].bits) << 16;
    std::memcpy(dst + i, &u, sizeof u);
  }
}

}  // namespace kvpolicy::cpu
