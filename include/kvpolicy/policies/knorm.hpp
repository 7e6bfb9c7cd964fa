/// \file
/// kvpolicy/policies/knorm.hpp — KNorm (SPEC §5): keep the keys of smallest L2 norm, per-head budget M.
#pragma once

#include <array>

#include "kvpolicy/baselines.hpp"
#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy::policies {

struct knorm {
  static constexpr std::string_view name = "knorm";
  static constexpr std::string_view help = "KNorm: keep the keys of smallest L2 norm, per-head budget M";
  static constexpr std::array options{registry::option::budget, registry::option::buffer, registry::option::sinks,
                                      registry::option::window};
  static constexpr registry::Inputs inputs = registry::Inputs::none;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    Cache<score::NegKeyNorm, admit::All, evict::PerHead<trigger::Buffered>, Alloc, Backend> cache(
        shape, std::move(pool),
        baseline_evictor({v.integer("budget"), v.integer("buffer"), v.integer("sinks"), v.integer("window")}));
    return f(cache);
  }
};

}  // namespace kvpolicy::policies
