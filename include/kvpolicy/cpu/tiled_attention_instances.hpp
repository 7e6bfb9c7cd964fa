/// \file
/// kvpolicy/cpu/tiled_attention_instances.hpp — the tiled CPU attention (cpu/tiled_attention.hpp)
/// compiled for every storage type (float, half, bfloat16). Include it in exactly one translation
/// unit of a program whose other translation units define KVPOLICY_EXTERN_TILED_ATTENTION: they then
/// declare the kernel and do not compile it, which takes a large part of each one's compile time.
/// That TU needs Eigen on the include path and the same code-generation flags (-march, -ffp-contract)
/// as the rest. Without KVPOLICY_EXTERN_TILED_ATTENTION nothing changes: the library stays header-only.
#pragma once

#include "kvpolicy/cpu/tiled_attention.hpp"

namespace kvpolicy::cpu {

#define KVPOLICY_TILED_ATTENTION_DEFINE(Storage)                                                                      \
  template void detail::attend_tiled_range<Storage>(                                                                  \
      const memory::EntryPool<Storage>&, const memory::HeadLayout&, int, int, View<const float, 3>,                   \
      std::span<const std::int32_t>, View<float, 3>, std::span<float>, AttentionMask, std::int64_t, std::int64_t,     \
      const SoftmaxPartial*);
KVPOLICY_TILED_ATTENTION_DEFINE(float)
KVPOLICY_TILED_ATTENTION_DEFINE(half)
KVPOLICY_TILED_ATTENTION_DEFINE(bfloat16)
#undef KVPOLICY_TILED_ATTENTION_DEFINE

}  // namespace kvpolicy::cpu
