/// \file
/// kvpolicy/policies/h2o.hpp — H2O (SPEC §5): the attention mass each key has received, the
/// newest M/2 protected, per-head budget M with buffer B. Its steps must attend.
#pragma once

#include <tuple>

#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/policies/common/per_head_budget.hpp"
#include "kvpolicy/policies/common/token_level.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// H2O, SPEC §5: the recent half of the budget (w = M / 2) is protected, or the config's window
/// when it names one (w > 0); S may then be at most M - w (M - M / 2 by default).
inline evict::PerHead<trigger::Buffered> h2o_evictor(const BaselineConfig& c = {}) {
  return evict::PerHead<trigger::Buffered>{trigger::Buffered{c.budget, c.buffer}, c.window > 0 ? c.window : c.budget / 2,
                                           0.0, c.sinks};
}

/// H2O ranks by the attention mass its attend() calls accumulate, so its steps must attend.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using H2OCache = PerHeadBudgetCache<score::AttentionMass, Backend, Storage, PageSize>;

namespace policies {

/// H2O's registry entry (registry/policy.hpp): its name, help, options and make(), by which `--policy`,
/// registry::open and the Python package build it.
struct h2o {
  static constexpr std::string_view name = "h2o";
  static constexpr std::string_view help = "H2O: accumulated attention mass, the newest M/2 protected, per-head budget M";
  static constexpr std::tuple fields{
      registry::field::budget<BaselineConfig>, registry::field::buffer<BaselineConfig>, registry::field::sinks<BaselineConfig>,
      registry::field::window<BaselineConfig>.with_help("w, the newest entries protected (0: M/2)")};
  static constexpr auto options = registry::options_of(fields, registry::option::mode);
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::AttentionMass>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    return detail::make_in_mode<Backend>(v, shape, std::move(pool),
                                         h2o_evictor(registry::read<BaselineConfig>(v, fields)),
                                         score::AttentionMass{}, evict::Aggregate::mean, std::forward<F>(f));
  }
};

}  // namespace policies

}  // namespace kvpolicy
