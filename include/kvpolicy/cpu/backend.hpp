/// \file
/// kvpolicy/cpu/backend.hpp — the CPU backend: a Cache's entries in the Allocator's host pool, its
/// steps run by cpu::Executor (cpu/executor.hpp), its attention over the entries on the host.
///
/// Two kernels, one answer (SPEC §6, up to fp32 rounding):
///   - cpu::attend_tiled (cpu/tiled_attention.hpp): Eigen matrix products on tiles, the online
///     softmax across them; used when Eigen's headers are on the include path (a target linked to
///     kvpolicy::cpu) and the translation unit is not compiled by nvcc;
///   - cpu::attend_paged (cpu/attention.hpp): plain loops, no dependency; used otherwise, or
///     everywhere with -DKVPOLICY_PORTABLE_ATTENTION.
/// Each choice puts cpu_backend in its own inline namespace, so one program may hold translation
/// units of both kinds without two definitions of one name. Compile time: define
/// KVPOLICY_EXTERN_TILED_ATTENTION in every translation unit and include
/// kvpolicy/cpu/tiled_attention_instances.hpp in one, and the tiled kernel is compiled once for float,
/// half and bfloat16 (docs/integration.md, "Compile time").
#pragma once

#include "kvpolicy/cpu/attention.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"  // KVPOLICY_TILED_ATTENTION: which kernel, which inline namespace
#include "kvpolicy/cpu/executor.hpp"

#if KVPOLICY_TILED_ATTENTION
#include "kvpolicy/cpu/tiled_attention.hpp"
#endif

namespace kvpolicy {

#if KVPOLICY_TILED_ATTENTION
inline namespace tiled_attention {
#else
inline namespace portable_attention {
#endif

/// The CPU Backend: the attention on the host (Eigen or the portable loops, OpenMP across heads), and the
/// eviction planned and applied there (cpu/executor.hpp).
struct cpu_backend {
  static constexpr const char* name = "cpu";
  /// attend() can add each key's attention mass to key_mass (H2O, SPEC §5).
  static constexpr bool emits_attention_mass = true;
  /// attend() may run for different kv heads at once (core/parallel.hpp): each call writes only its
  /// group's rows of `out` and its own key_mass, and each thread has its own scratch.
  static constexpr bool parallel_heads = true;
  /// The kernel this translation unit uses: "tiled" or "portable".
  static constexpr const char* kernel = KVPOLICY_TILED_ATTENTION ? "tiled" : "portable";
  /// Nothing beside the policies: the Allocator is the host memory.
  struct Options {};
  /// How a Cache's steps run here: on the host, over the Allocator's pool (cpu/executor.hpp).
  template <Scorer S, Admitter A, Evictor E, Allocator Alloc>
  using Executor = cpu::Executor<cpu_backend, S, A, E, Alloc>;

  /// One kv head's attention, with cpu::attend_paged's arguments (cpu/attention.hpp; call that over
  /// allocator().layout(...) to attend a head yourself): q_pos [T], and a key is seen iff its position
  /// is <= q_pos. It checks nothing and throws no kvpolicy::Error: the Cache checks before it calls
  /// it, and a direct caller passes consistent shapes. The Cache runs it for different kv heads at
  /// once on OpenMP threads (OMP_NUM_THREADS) when the translation unit uses OpenMP.
  template <class Storage>
  static void attend(const memory::EntryPool<Storage>& pool, const memory::HeadLayout& head, int kv_head, int group,
                     View<const float, 3> queries, std::span<const std::int32_t> q_pos, View<float, 3> out,
                     std::span<float> key_mass = {}, AttentionMask mask = {}) {
#if KVPOLICY_TILED_ATTENTION
    cpu::attend_tiled(pool, head, kv_head, group, queries, q_pos, out, key_mass, mask);
#else
    cpu::attend_paged(pool, head, kv_head, group, queries, q_pos, out, key_mass, mask);
#endif
  }

#if KVPOLICY_TILED_ATTENTION
  /// Flash-decoding (cpu/tiled_attention.hpp): a step of at most decode_rows query rows per kv head
  /// splits each head into ranges of decode_range entries, each range's state from
  /// attend_partial() on any thread, merged per head by merge_partials() in range order. Not with H2O's
  /// mass. The ranges do not depend on the thread count, so neither does the answer, bit for bit.
  static constexpr std::int64_t decode_rows = cpu::kPartialMaxRows;
  static constexpr std::int64_t decode_range = cpu::TiledAttentionTuning::kDecodeRange;
  template <class Storage>
  static void attend_partial(const memory::EntryPool<Storage>& pool, const memory::HeadLayout& head, int kv_head,
                             int group, View<const float, 3> queries, std::span<const std::int32_t> q_pos,
                             std::int64_t first, std::int64_t last, cpu::SoftmaxPartial partial, AttentionMask mask) {
    cpu::attend_tiled_partial(pool, head, kv_head, group, queries, q_pos, first, last, partial, mask);
  }
  static void merge_partials(std::span<const cpu::SoftmaxPartial> parts, std::int64_t rows, std::int64_t d, float* out) {
    cpu::merge_softmax_partials(parts, rows, d, out);
  }
#endif
};

}  // namespace tiled_attention / portable_attention

}  // namespace kvpolicy
