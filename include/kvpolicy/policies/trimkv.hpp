/// \file
/// kvpolicy/policies/trimkv.hpp — TRIM-KV (SPEC §1): learned retention log beta per token and kv
/// head from the gate on the layer's normed input, score log beta * (n + 1 - p), per-head budget M
/// with buffer B, or the threshold variant.
#pragma once

#include <array>

#include "kvpolicy/registry/policy.hpp"
#include "kvpolicy/trimkv.hpp"

namespace kvpolicy::policies {

struct trimkv {
  static constexpr std::string_view name = "trimkv";
  static constexpr std::string_view help = "TRIM-KV: score log_beta*(n+1-p), per-head budget M, evict when a head reaches M+B";
  static constexpr std::array options{registry::option::budget,    registry::option::buffer, registry::option::window,
                                      registry::option::threshold, registry::option::sinks,  registry::option::gate};
  static constexpr registry::Inputs inputs = registry::Inputs::retention_gate;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    // log(beta) * age <= 0 (SPEC §1): an alpha above 1 would keep nothing
    const double alpha = v.real("threshold");
    require(alpha >= 0.0 && alpha <= 1.0, "--threshold alpha = ", alpha,
            " must be in (0, 1] for trimkv (its scores are <= log 1: a larger alpha keeps nothing; 0 = off)");
    Cache<score::RetentionDecay, admit::All, evict::PerHead<trigger::Buffered>, Alloc, Backend> cache(
        shape, std::move(pool),
        trimkv_evictor({v.integer("budget"), v.integer("buffer"), v.integer("window"), alpha, v.integer("sinks")}));
    return f(cache);
  }
};

}  // namespace kvpolicy::policies
