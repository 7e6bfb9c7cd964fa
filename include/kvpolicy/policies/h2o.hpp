/// \file
/// kvpolicy/policies/h2o.hpp — H2O (SPEC §5): the attention mass each key has received, the
/// newest M/2 protected, per-head budget M with buffer B. Its steps must attend.
#pragma once

#include <array>

#include "kvpolicy/baselines.hpp"
#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy::policies {

struct h2o {
  static constexpr std::string_view name = "h2o";
  static constexpr std::string_view help = "H2O: accumulated attention mass, the newest M/2 protected, per-head budget M";
  static constexpr std::array options{registry::option::budget, registry::option::buffer, registry::option::sinks,
                                      registry::option::window.with_help("w, the newest entries protected (0: M/2)")};
  static constexpr registry::Inputs inputs = registry::Inputs::none;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    Cache<score::AttentionMass, admit::All, evict::PerHead<trigger::Buffered>, Alloc, Backend> cache(
        shape, std::move(pool),
        h2o_evictor({v.integer("budget"), v.integer("buffer"), v.integer("sinks"), v.integer("window")}));
    return f(cache);
  }
};

}  // namespace kvpolicy::policies
