/// \file
/// kvpolicy/cpu/backend.hpp — the CPU reference backend: how a Cache attends over its entries.
#pragma once

#include "kvpolicy/cpu/attention.hpp"

namespace kvpolicy {

struct cpu_backend {
  static constexpr const char* name = "cpu";
  /// attend() can add each key's attention mass to key_mass (H2O, SPEC §5).
  static constexpr bool emits_attention_mass = true;

  template <class Storage>
  static void attend(const memory::EntryPool<Storage>& pool, const memory::HeadLayout& head, int kv_head, int group,
                     View<const float, 3> queries, std::span<const std::int32_t> q_pos, View<float, 3> out,
                     std::span<float> key_mass = {}, AttentionMask mask = {}) {
    cpu::attend_paged(pool, head, kv_head, group, queries, q_pos, out, key_mass, mask);
  }
};

}  // namespace kvpolicy
