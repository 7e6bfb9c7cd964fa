/// \file
/// kvpolicy/core/eigen.hpp — Eigen/Core, as every kvpolicy header includes it (before Eigen/Dense
/// where a header needs more). GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512
/// intrinsics headers (`__m512 __Y = __Y;`, GCC bug 105593), or -Wuninitialized at lower
/// optimisation (the sanitizer builds), wherever Eigen's packets are inlined;
/// the warning is about the compiler's header, not the caller's code, so it is silenced for those
/// headers only, here at their first inclusion (not under nvcc, whose translation units include
/// Eigen as before).
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
#else
#include <Eigen/Core>
#endif
