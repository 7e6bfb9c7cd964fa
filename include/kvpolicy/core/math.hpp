/// \file
/// kvpolicy/core/math.hpp — the numerics every backend shares (SPEC §1–2).
/// Everything here is KVPOLICY_HD: __host__ __device__ under nvcc, plain inline functions otherwise,
/// so the CPU path and the CUDA kernels call the very same code.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define KVPOLICY_HD __host__ __device__ __forceinline__
#else
#define KVPOLICY_HD inline
#endif

namespace kvpolicy::math {

/// +inf for KVPOLICY_HD code (std::numeric_limits<float>::infinity() is a host function to nvcc).
inline constexpr float kInfinity = __builtin_huge_valf();

/// a * b and a + b, each rounded once, on every backend. nvcc contracts a * b + c into one fused
/// multiply-add (rounded once) where the host rounds twice; the scores the CPU and the CUDA kernels
/// rank must agree bit for bit, so the scorers compose these instead of writing a * b + c.
KVPOLICY_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVPOLICY_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
/// log(x) in fp32 through a double log: fp32 logf differs between libm and CUDA in the last bit,
/// the double logs agree to well within what the rounding to fp32 keeps.
KVPOLICY_HD float log_via_double(float x) { return static_cast<float>(log(static_cast<double>(x))); }

/// log(sigmoid(z)) = -softplus(-z), stable for every finite z and for ±inf (SPEC §1):
/// for z >= 0 it is -log1p(exp(-z)); for z < 0 it is z - log1p(exp(z)). exp never overflows.
KVPOLICY_HD float logsigmoid(float z) {
  if (z >= 0.0f) return -log1pf(expf(-z));
  return z - log1pf(expf(z));
}

KVPOLICY_HD float sigmoid(float z) {
  if (z >= 0.0f) return 1.0f / (1.0f + expf(-z));
  const float e = expf(z);
  return e / (1.0f + e);
}

KVPOLICY_HD float silu(float x) { return x * sigmoid(x); }

/// GELU, exact (erf) form, as torch.nn.GELU() by default.
KVPOLICY_HD float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

/// log( (1 - beta^h) / (1 - beta) ) with beta = exp(log_beta), log_beta in [-inf, 0], h >= 1.
/// SPEC §2, Eq. 9: written as expm1(h*log_beta) / expm1(log_beta) so that beta near 1 never forms
/// 1 - beta in fp32; the limit log_beta -> 0 is log(h). Computed in double: the ratio of two
/// expm1 values loses nothing there, and fp32 keeps the result's precision.
KVPOLICY_HD float lookahead_log_ratio(float log_beta, int horizon) {
  if (horizon == 1) return 0.0f;
  const double lb = static_cast<double>(log_beta);
  if (lb == 0.0) return static_cast<float>(log(static_cast<double>(horizon)));
  const double num = expm1(static_cast<double>(horizon) * lb);  // in [-1, 0)
  const double den = expm1(lb);                                 // in [-1, 0)
  return static_cast<float>(log(num / den));
}

/// A score computed in double, as fp32: finite values beyond fp32's range saturate at +-FLT_MAX
/// instead of becoming +-inf (a frozen score may not be +inf, and +-inf would tie with protection).
KVPOLICY_HD float saturate_to_float(double x) {
  constexpr double kMax = 3.4028234663852886e38;  // FLT_MAX
  return static_cast<float>(x > kMax ? kMax : x < -kMax ? -kMax : x);
}

}  // namespace kvpolicy::math
