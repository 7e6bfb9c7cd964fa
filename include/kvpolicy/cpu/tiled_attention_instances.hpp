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

template void attend_tiled<float>(const memory::EntryPool<float>&, const memory::HeadLayout&, int, int,
                                  View<const float, 3>, std::span<const std::int32_t>, View<float, 3>, std::span<float>,
                                  AttentionMask);
template void attend_tiled<half>(const memory::EntryPool<half>&, const memory::HeadLayout&, int, int,
                                 View<const float, 3>, std::span<const std::int32_t>, View<float, 3>, std::span<float>,
                                 AttentionMask);
template void attend_tiled<bfloat16>(const memory::EntryPool<bfloat16>&, const memory::HeadLayout&, int, int,
                                     View<const float, 3>, std::span<const std::int32_t>, View<float, 3>,
                                     std::span<float>, AttentionMask);

}  // namespace kvpolicy::cpu
