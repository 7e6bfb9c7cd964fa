/// \file
/// kvpolicy/cuda/primitives/dispatch.cuh — the one place a runtime shape becomes a template parameter (docs/architecture.md,
/// Device path: "dispatched once at the host boundary, one switch per parameter"). An unsupported
/// value throws before anything is launched, naming the value and what is supported.
#pragma once

#include <type_traits>

#include "kvpolicy/core/error.hpp"

namespace kvpolicy::gpu {

inline constexpr int kHeadDims[] = {64, 128, 256};
inline constexpr int kPageSizes[] = {16, 32, 64};

template <class F>
void dispatch_head_dim(int head_dim, const char* who, F&& f) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: fail(who, ": head_dim = ", head_dim, " has no kernel (64, 128 or 256)");
  }
}

template <class F>
void dispatch_page_size(int page_size, const char* who, F&& f) {
  switch (page_size) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    default: fail(who, ": page_size = ", page_size, " has no kernel (16, 32 or 64)");
  }
}

}  // namespace kvpolicy::gpu
