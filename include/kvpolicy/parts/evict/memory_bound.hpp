/// \file
/// kvpolicy/parts/evict/memory_bound.hpp — what an evictor lets one sequence hold: every built-in
/// evictor says, through `memory_bound(shape)`, the most entries a sequence holds after any commit
/// when it decodes one token per step (added without a declared prompt, so its first step is its
/// prompt, SPEC §4), or that no budget bounds it (std::nullopt: the full cache, a prompt-only
/// compression, WG-KV without a budget, the threshold variants). The soak reads it. The evictors of
/// parts/evict/ and of the policy files give it; the sharded wrappers of dist/ do not.
#pragma once

#include <cstdint>
#include <optional>

namespace kvpolicy::evict {

/// The most entries one sequence holds after a commit: per (layer, kv head) and in all.
struct MemoryBound {
  std::int64_t per_head = 0;
  std::int64_t per_sequence = 0;
};

/// The evictor `e`'s bound on `shape`; a compile error names an evictor that does not say.
template <class E, class Shape>
std::optional<MemoryBound> memory_bound(const E& e, const Shape& shape) {
  static_assert(requires { e.memory_bound(shape); },
                "kvpolicy: this evictor does not say what a sequence holds under it: give it "
                "std::optional<evict::MemoryBound> memory_bound(const CacheShape&) const (parts/evict/memory_bound.hpp)");
  return e.memory_bound(shape);
}

}  // namespace kvpolicy::evict
