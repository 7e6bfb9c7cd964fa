/// \file
/// kvpolicy/policies/full.hpp — the full cache: every token stays (the reference row of every
/// quality table). A per-head budget past any sequence, so it never evicts.
#pragma once

#include <array>
#include <limits>

#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/policies/common/per_head_budget.hpp"
#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy {

/// The full cache, as a policy: a budget no sequence reaches.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using FullCache = PerHeadBudgetCache<score::Recency, Backend, Storage, PageSize>;

namespace policies {

/// The full cache's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct full {
  static constexpr std::string_view name = "full";
  static constexpr std::string_view help = "the full cache: every token stays";
  static constexpr std::array<registry::Option, 0> options{};
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::Recency>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values&, const CacheShape& shape, Alloc pool, F&& f) {
    Cache<score::Recency, admit::All, evict::PerHead<trigger::Buffered>, Alloc, Backend> cache(
        shape, std::move(pool), baseline_evictor({.budget = std::numeric_limits<std::int32_t>::max() - 1, .buffer = 1}), score::Recency{0});
    return f(cache);
  }
};

}  // namespace policies

}  // namespace kvpolicy
