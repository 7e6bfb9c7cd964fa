/// \file
/// kvpolicy/policies/common/token_level.hpp — the token-level (union) mode a policy offers beside
/// its per-head one (SPEC §8): `--mode union` builds the policy's scorer over evict::Union, with its
/// budget M read as tokens per sequence (L * Hkv * M entries, the memory of a per-head M), its
/// buffer, sinks and window over positions, and its per-head scores aggregated as the policy
/// states (evict::Aggregate). For engines whose cache cell holds a token for every kv head
/// (llama.cpp, vLLM's blocks). Not a policy itself: the policies that take registry::option::mode
/// call make_in_mode; registry::takers("mode") lists them.
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include <utility>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/evict/union.hpp"
#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy {

namespace policies::detail {

/// A per-head rule's token-level form: the same M, B, S and w, over positions (SPEC §8).
inline evict::Union as_union(const registry::Values& v, const evict::PerHead<trigger::Buffered>& e, evict::Aggregate a) {
  require(e.threshold == 0.0, "--mode union: ", v.policy(), "'s threshold variant (alpha = ", e.threshold,
          ") keeps entries per head, not whole tokens (SPEC §8); drop --threshold");
  require(e.min_tokens == 0, "--mode union: ", v.policy(), "'s min_tokens = ", e.min_tokens,
          " is a floor per head; a token-level cache has none (SPEC §8); drop --min-tokens");
  return evict::Union{.budget = e.rule.budget, .buffer = e.rule.buffer, .window = e.window, .sinks = e.sinks, .aggregate = a};
}
/// The global rule's: the sequence's one ranking becomes a ranking of its positions.
inline evict::Union as_union(const registry::Values& v, const evict::Global& e, evict::Aggregate a) {
  require(e.threshold == 0.0, "--mode union: ", v.policy(), "'s threshold variant (alpha = ", e.threshold,
          ") keeps entries per head, not whole tokens (SPEC §8); drop --threshold");
  require(e.min_tokens == 0, "--mode union: ", v.policy(), "'s min_tokens = ", e.min_tokens,
          " is a floor per head; a token-level cache has none (SPEC §8); drop --min-tokens");
  require(e.floor_ratio == 0.0, "--mode union: ", v.policy(), "'s floor f = ", e.floor_ratio,
          " gives each head its own quota; a token-level cache has none (SPEC §8); drop --floor");
  return evict::Union{.budget = e.budget, .buffer = e.buffer, .window = e.window, .sinks = e.sinks, .aggregate = a};
}

/// Builds the policy's Cache with the evictor `per_head`, or with `--mode union` its token-level
/// form (aggregate `a`), and returns f(cache).
template <class Backend, class Alloc, class S, class E, class F>
decltype(auto) make_in_mode(const registry::Values& v, const CacheShape& shape, Alloc pool, E per_head, S scorer,
                            evict::Aggregate a, F&& f) {
  if (registry::token_level(v)) {
    Cache<S, admit::All, evict::Union, Alloc, Backend> cache(shape, std::move(pool), as_union(v, per_head, a),
                                                             std::move(scorer));
    return f(cache);
  }
  Cache<S, admit::All, E, Alloc, Backend> cache(shape, std::move(pool), std::move(per_head), std::move(scorer));
  return f(cache);
}

}  // namespace policies::detail

}  // namespace kvpolicy
