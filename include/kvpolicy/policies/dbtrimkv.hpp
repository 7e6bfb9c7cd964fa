/// \file
/// kvpolicy/policies/dbtrimkv.hpp — DBTrimKV (SPEC §2): the tied retention gate's log beta, the
/// lookahead score over horizon h (Eq. 9), one global budget L * Hkv * M per sequence, optional
/// floor_ratio quotas or the threshold variant.
#pragma once

#include <array>

#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy::policies {

struct dbtrimkv {
  static constexpr std::string_view name = "dbtrimkv";
  static constexpr std::string_view help =
      "DBTrimKV: lookahead score over horizon h, one global budget L*Hkv*M per sequence, optional floor f";
  static constexpr std::array options{
      registry::option::budget,
      registry::option::buffer,
      registry::Option{"horizon", registry::Kind::integer, 2, "h, the lookahead horizon"},
      registry::Option{"floor", registry::Kind::real, 0, "f in [0, 1): each head keeps floor(f*M) of its own best"}
          .recorded_as("floor_ratio"),
      registry::option::window,
      registry::option::threshold,
      registry::option::sinks,
      registry::option::gate};
  static constexpr registry::Inputs inputs = registry::Inputs::tied_retention_gate;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    const std::int64_t h = v.integer("horizon");
    require(h >= 1 && h <= 1 << 20, "--horizon h = ", h, " must be in [1, 2^20]");
    // the lookahead score is <= log h (SPEC §2): an alpha above h would keep nothing
    const double alpha = v.real("threshold");
    require(alpha >= 0.0 && alpha <= static_cast<double>(h), "--threshold alpha = ", alpha, " must be in (0, ", h,
            "] for dbtrimkv (its scores are <= log ", h, ": a larger alpha keeps nothing; 0 = off)");
    const DBTrimKVConfig c{v.integer("budget"), v.integer("buffer"), static_cast<int>(h), v.real("floor"),
                           v.integer("window"), alpha, v.integer("sinks")};
    Cache<score::Lookahead, admit::All, evict::Global, Alloc, Backend> cache(shape, std::move(pool), dbtrimkv_evictor(c),
                                                                             dbtrimkv_scorer(c));
    return f(cache);
  }
};

}  // namespace kvpolicy::policies
