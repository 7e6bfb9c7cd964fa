/// \file
/// kvpolicy/policies/kv_statistics.hpp — the KV statistics (SPEC §4): a rolling statistic of each
/// head's keys (kv-key), values (kv-val) or both after lag-relative normalisation (lag-kv) as the
/// frozen score, a budget K over the generated tokens, the prompt and the R newest protected.
/// The engine computes the score (kvstats::Tracker, Inputs::key_value_statistic).
#pragma once

#include <array>

#include "kvpolicy/epikv.hpp"
#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy::policies {

namespace detail {

/// The options and the cache every policy of SPEC §4 shares.
struct generated_budget {
  static constexpr std::array options{
      registry::option::budget.with_help("K, generated tokens kept per (layer, kv head)"),
      registry::Option{"recency", registry::Kind::integer, -1, "R, the newest generated tokens kept (-1: min(128, K/4))"},
      registry::option::sinks, registry::option::window};

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    Cache<score::Frozen, admit::All, evict::Generated, Alloc, Backend> cache(
        shape, std::move(pool),
        epikv_evictor({v.integer("budget"), v.integer("recency"), v.integer("sinks"), v.integer("window")}));
    return f(cache);
  }
};

template <kvstats::Statistic S>
struct kv_statistic : generated_budget {
  static constexpr registry::Inputs inputs = registry::Inputs::key_value_statistic;
  static constexpr kvstats::Statistic statistic = S;
};

}  // namespace detail

struct kv_key : detail::kv_statistic<kvstats::Statistic::key> {
  static constexpr std::string_view name = "kv-key";
  static constexpr std::string_view help = "rolling mean of the key's variance over its components; budget K generated";
};
struct kv_val : detail::kv_statistic<kvstats::Statistic::value> {
  static constexpr std::string_view name = "kv-val";
  static constexpr std::string_view help = "the same on values";
};
struct lag_kv : detail::kv_statistic<kvstats::Statistic::lag> {
  static constexpr std::string_view name = "lag-kv";
  static constexpr std::string_view help = "kv-key + kv-val after lag-relative min-max normalisation per channel";
};

using kv_statistics = registry::family<kv_key, kv_val, lag_kv>;

}  // namespace kvpolicy::policies
