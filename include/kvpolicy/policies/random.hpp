/// \file
/// kvpolicy/policies/random.hpp — Random (SPEC §5): seeded uniform scores per (layer, head,
/// position), per-head budget M with buffer B.
#pragma once

#include <cstdint>

#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/policies/common/per_head_budget.hpp"
#include "kvpolicy/policies/common/token_level.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// Random: seeded uniform scores under the per-head budget of SPEC §5 (the floor every policy must beat).
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using RandomCache = PerHeadBudgetCache<score::SeededRandom, Backend, Storage, PageSize>;

namespace policies {

/// Random's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct random {
  static constexpr std::string_view name = "random";
  static constexpr std::string_view help = "Random: seeded uniform scores, per-head budget M";
  static constexpr auto fields = detail::baseline_fields;
  static constexpr auto options = registry::options_of(
      fields, registry::Option{"seed", registry::Kind::integer, 0, "the seed of the scores"},
      registry::option::mode);
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::SeededRandom>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    return detail::make_in_mode<Backend>(v, shape, std::move(pool),
                                         baseline_evictor(registry::read<BaselineConfig>(v, fields)),
                                         score::SeededRandom{static_cast<std::uint64_t>(v.integer("seed"))}, evict::Aggregate::max, std::forward<F>(f));
  }
};

}  // namespace policies

}  // namespace kvpolicy
