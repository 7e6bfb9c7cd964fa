/// \file
/// kvpolicy/policies/wgkv.hpp — WG-KV (SPEC §3): the W_local newest tokens of every head (the
/// ring) and the older ones whose write gate g >= tau; with --avg-budget, the hard budget of
/// appendix K over the heads' global caches.
#pragma once

#include <array>

#include "kvpolicy/registry/policy.hpp"
#include "kvpolicy/wgkv.hpp"

namespace kvpolicy::policies {

struct wgkv {
  static constexpr std::string_view name = "wgkv";
  static constexpr std::string_view help =
      "WG-KV: the W_local newest tokens of every head and the older ones with write gate g >= tau";
  static constexpr std::array options{
      registry::Option{"local", registry::Kind::integer, 256, "W_local, the ring of newest tokens (its protected window)"},
      registry::Option{"tau", registry::Kind::real, 0.1, "admission threshold on g"},
      registry::option::sinks,
      registry::option::gate,
      registry::Option{"avg-budget", registry::Kind::integer, 0,
                       "M_avg: a hard budget of L*Hkv*M_avg global entries, by observed attention (0: none)"}
          .recorded_as("average_budget")};
  static constexpr registry::Inputs inputs = registry::Inputs::write_gate;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    const std::int64_t local = v.integer("local"), sinks = v.integer("sinks"), average = v.integer("avg-budget");
    const double tau = v.real("tau");
    require(average >= 0, "--avg-budget M = ", average, " must be >= 0 (0: no hard budget)");
    if (average > 0) {  // SPEC §3 "Admission with eviction"
      const WGKVBudgetConfig c{local, tau, average, 256, 5, 0.1, sinks};
      Cache<score::GatedObservedAttention, admit::All, evict::WriteGatedBudget, Alloc, Backend> cache(
          shape, std::move(pool), wgkv_budget_evictor(shape, c), wgkv_budget_scorer(shape, c));
      return f(cache);
    }
    Cache<score::Frozen, admit::All, evict::WriteGated, Alloc, Backend> cache(shape, std::move(pool),
                                                                              wgkv_evictor({local, tau, sinks}));
    return f(cache);
  }
};

}  // namespace kvpolicy::policies
