/// \file
/// kvpolicy/policies/knorm.hpp — KNorm (SPEC §5): keep the keys of smallest L2 norm, per-head budget M.
#pragma once


#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/policies/common/per_head_budget.hpp"
#include "kvpolicy/policies/common/token_level.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// KNorm (Devoto et al. 2024): the keys of smallest L2 norm stay; the per-head budget of SPEC §5.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using KNormCache = PerHeadBudgetCache<score::NegKeyNorm, Backend, Storage, PageSize>;

namespace policies {

/// KNorm's registry entry (registry/policy.hpp): its name, help, options and make(), by which `--policy`,
/// registry::open and the Python package build it.
struct knorm {
  static constexpr std::string_view name = "knorm";
  static constexpr std::string_view help = "KNorm: keep the keys of smallest L2 norm, per-head budget M";
  static constexpr auto fields = detail::baseline_fields;
  static constexpr auto options = registry::options_of(fields, registry::option::mode);
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::NegKeyNorm>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    return detail::make_in_mode<Backend>(v, shape, std::move(pool),
                                         baseline_evictor(registry::read<BaselineConfig>(v, fields)),
                                         score::NegKeyNorm{}, evict::Aggregate::mean, std::forward<F>(f));
  }
};

}  // namespace policies

}  // namespace kvpolicy
