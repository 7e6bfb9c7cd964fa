/// \file
/// kvpolicy/cpu/backend_fwd.hpp — the name cpu_backend, declared without its definition, so that a
/// preset (kvpolicy/policies/*.hpp) can default its Cache's Backend to it without pulling the CPU
/// attention in: a device-only program names `TrimKVCache<cuda_backend>` and never completes it.
/// kvpolicy/cpu/backend.hpp defines it; this header also decides which attention kernel the
/// translation unit's definition uses, and names it by an inline namespace (see there).
#pragma once

#if !defined(KVPOLICY_PORTABLE_ATTENTION) && !defined(__CUDACC__) && __has_include(<Eigen/Core>)
#define KVPOLICY_TILED_ATTENTION 1
#else
#define KVPOLICY_TILED_ATTENTION 0
#endif

namespace kvpolicy {

#if KVPOLICY_TILED_ATTENTION
inline namespace tiled_attention {
#else
inline namespace portable_attention {
#endif

struct cpu_backend;

}  // namespace tiled_attention / portable_attention

}  // namespace kvpolicy
