/// \file
/// kvpolicy/policies/common/generated_budget.hpp — the budget SPEC §4's policies share (EpiKV,
/// HS-var, kv-key, kv-val, lag-kv): one frozen score per entry, a budget K over the generated tokens,
/// the prompt and the R = min(128, K / 4) newest tokens protected. No attention matrix anywhere:
/// the scores come from what the engine already has. Not a policy itself: hidden_states.hpp and
/// kv_statistics.hpp beside it register the families that use it.
///
///   EpiKV / HS-var: one score per token from the hidden states (epiphany::Signal), the same in
///     every layer and head (broadcast_token_scores), so every head keeps the same tokens.
///   kv-key / kv-val / lag-kv: a score per (layer, kv head, token) from the keys and values
///     (kvstats::Tracker), straight into the layout append() takes.
///
///   kvpolicy::EpiKVCache<> cache(shape, kvpolicy::memory::Paged<16>(pages),
///                                kvpolicy::epikv_evictor({.budget = 2048}));
///   cache.add_sequence(seq, prompt_length);
///   kvpolicy::epiphany::Signal signal({}, hidden_size);          // one per sequence
///   signal.push_hidden(hidden_states /* [L+1, T, D] */, token_scores);
///   kvpolicy::broadcast_token_scores(cache.shape(), token_scores, scores /* [L, Hkv, T] */);
///   cache.step(seq, keys, values, scores);                          // scores in place of log_beta
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include <tuple>
#include <cstdint>
#include <span>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/by_name.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/score/retention.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// The settings SPEC §4's policies share, written with designated initialisers (core/by_name.hpp).
struct EpiKVConfig {
  [[no_unique_address]] ByName by_name{};
  std::int64_t budget = evict::default_budget;  ///< K, generated tokens kept per (layer, kv head)
  std::int64_t sinks = 0;      ///< S: the S oldest entries of each head are protected (SPEC §5)
  std::int64_t window = 0;     ///< w: the w newest entries of each head are protected (SPEC §5)
  std::int64_t recency = -1;   ///< R; -1 = min(128, K / 4)
};

/// Built without checks; the Cache constructor throws unless K is in [1, 2^31 - 1], R is -1 or in
/// [0, K], w is in [0, K], and S is in [0, K - max(R, w)]. evict::Generated composes only with
/// admit::All (a compile-time error otherwise).
inline evict::Generated epikv_evictor(const EpiKVConfig& c = {}) {
  return evict::Generated{c.budget, c.recency, c.sinks, c.window};
}

/// Every EpiKV-family policy: the frozen score in the entry's metadata, evict::Generated.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using EpiKVCache = Cache<score::Frozen, admit::All, evict::Generated, memory::Paged<PageSize, Storage>, Backend>;

/// One score per token [T] -> the [L, Hkv, T] layout of Cache::step (SPEC §4: one score per token,
/// shared by every layer and head). Throws if out has another shape.
inline void broadcast_token_scores(const CacheShape& shape, std::span<const float> token_scores, View<float, 3> out) {
  const auto T = static_cast<std::int64_t>(token_scores.size());
  require_shape(View<const float, 3>(out), {shape.layers, shape.kv_heads, T}, "broadcast_token_scores: out");
  for (std::int64_t l = 0; l < shape.layers; ++l)
    for (std::int64_t h = 0; h < shape.kv_heads; ++h)
      for (std::int64_t t = 0; t < T; ++t) out(l, h, t) = token_scores[static_cast<std::size_t>(t)];
}

namespace policies::detail {

/// The options and the cache every registered policy of SPEC §4 shares.
struct generated_budget {
  static constexpr std::tuple fields{
      registry::field::budget<EpiKVConfig>.with_help("K, generated tokens kept per (layer, kv head)"),
      registry::bind(&EpiKVConfig::recency,
                     {"recency", registry::Kind::integer, 0, "R, the newest generated tokens kept (-1: min(128, K/4))"}),
      registry::field::sinks<EpiKVConfig>, registry::field::window<EpiKVConfig>};
  static constexpr auto options = registry::options_of(fields);
  using scorers = registry::scorers<score::Frozen>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    Cache<score::Frozen, admit::All, evict::Generated, Alloc, Backend> cache(
        shape, std::move(pool),
        epikv_evictor(registry::read<EpiKVConfig>(v, fields)));
    return f(cache);
  }
};

}  // namespace policies::detail

}  // namespace kvpolicy
