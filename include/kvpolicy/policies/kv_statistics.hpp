/// \file
/// kvpolicy/policies/kv_statistics.hpp — kv-key, kv-val and lag-kv (SPEC §4): a rolling statistic
/// of each entry's key or value (kvstats::Tracker, kvpolicy/parts/score/kvstats.hpp) as its frozen
/// score, under the generated-token budget K (policies/common/generated_budget.hpp).
#pragma once

#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/parts/score/kvstats.hpp"
#include "kvpolicy/policies/common/generated_budget.hpp"

namespace kvpolicy::policies {

namespace detail {

template <kvstats::Statistic S>
struct kv_statistic : generated_budget {
  using inputs = kvpolicy::inputs::KeyValueStatistic;
  static constexpr kvstats::Statistic statistic = S;
};

}  // namespace detail

/// kv-key's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct kv_key : detail::kv_statistic<kvstats::Statistic::key> {
  static constexpr std::string_view name = "kv-key";
  static constexpr std::string_view help = "rolling mean of the key's variance over its components; budget K generated";
};
/// kv-val's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct kv_val : detail::kv_statistic<kvstats::Statistic::value> {
  static constexpr std::string_view name = "kv-val";
  static constexpr std::string_view help = "the same on values";
};
/// lag-kv's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct lag_kv : detail::kv_statistic<kvstats::Statistic::lag> {
  static constexpr std::string_view name = "lag-kv";
  static constexpr std::string_view help = "kv-key + kv-val after lag-relative min-max normalisation per channel";
};

/// The policies that score by the keys' and values' statistics, registered together (registry::family).
using kv_statistics = registry::family<kv_key, kv_val, lag_kv>;

}  // namespace kvpolicy::policies
