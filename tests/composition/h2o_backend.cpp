// A composition that cannot work must fail to compile with a one-line reason (issue: composition):
// H2O ranks by attention mass, and this backend's attention does not emit it. Compiled by the
// ctest entries composition_* with -fsyntax-only; KVPOLICY_BACKEND_EMITS_MASS=1 is the control
// that the same file compiles when the backend does emit it.
#include "kvpolicy/baselines.hpp"

struct backend_without_mass {
  static constexpr const char* name = "no-mass";
  struct Options {};
  template <class S, class A, class E, class Alloc>
  using Executor = kvpolicy::cpu::Executor<backend_without_mass, S, A, E, Alloc>;
#if KVPOLICY_BACKEND_EMITS_MASS
  static constexpr bool emits_attention_mass = true;
#endif
  template <class Storage>
  static void attend(const kvpolicy::memory::EntryPool<Storage>& pool, const kvpolicy::memory::HeadLayout& head,
                     int kv_head, int group, kvpolicy::View<const float, 3> queries,
                     std::span<const std::int32_t> q_pos, kvpolicy::View<float, 3> out,
                     std::span<float> key_mass = {}, kvpolicy::AttentionMask mask = {}) {
    kvpolicy::cpu::attend_paged(pool, head, kv_head, group, queries, q_pos, out, key_mass, mask);
  }
};

int main() {
  kvpolicy::H2OCache<backend_without_mass> cache(kvpolicy::CacheShape{1, 1, 1, 4}, kvpolicy::memory::Paged<16>(4),
                                                 kvpolicy::h2o_evictor({.budget = 8, .buffer = 1}));
  return cache.has_sequence(0) ? 1 : 0;
}
