/// \file
/// kvpolicy/policies/common/per_head_budget.hpp — the budget SPEC §5's per-head baselines share
/// (StreamingLLM, H2O, KNorm, KeyDiff, Random, TOVA, the full cache): M entries per (layer, kv head)
/// with buffer B (the trigger of SPEC §1: a head that reaches M + B keeps its top M; B = 1 evicts
/// one entry per decode step), S sinks and w newest protected. Not a policy itself: the files
/// beside it compose it with their scorers.
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include <cstdint>
#include <tuple>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/by_name.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/score/baseline.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// The settings the per-head baselines share, written with designated initialisers (core/by_name.hpp).
struct BaselineConfig {
  [[no_unique_address]] ByName by_name{};
  std::int64_t budget = evict::default_budget;  ///< M per (layer, kv head)
  std::int64_t buffer = evict::default_buffer;  ///< B
  std::int64_t sinks = 0;      ///< S: the S oldest entries of each head are protected (SPEC §5)
  std::int64_t window = 0;     ///< w: the w newest entries of each head are protected (SPEC §5); H2O: 0 = M / 2
};

/// Built without checks; the Cache constructor throws for trimkv_evictor's checks of M, B, w and S.
inline evict::PerHead<trigger::Buffered> baseline_evictor(const BaselineConfig& c = {}) {
  return evict::PerHead<trigger::Buffered>{trigger::Buffered{c.budget, c.buffer}, c.window, 0.0, c.sinks};
}

/// Pages for `sequences` sequences under a per-head baseline in the allocator `Paged`
/// (memory::Paged<P, Storage>): every head at its peak M + B - 1 + largest_chunk. Throws for M, B or
/// largest_chunk below 1, and for sequences < 0.
template <class Paged = memory::Paged<16>>
std::int64_t baseline_pages(const CacheShape& shape, const BaselineConfig& c, std::int64_t sequences,
                            std::int64_t largest_chunk = 1) {
  return Paged::pages_for(shape, evict::detail::per_head_peak("baseline_pages", c.budget, c.buffer, 0.0, largest_chunk),
                          sequences);
}

namespace policies::detail {
/// A per-head baseline's fields (registry/fields.hpp): M, B, S and w of its BaselineConfig.
inline constexpr std::tuple baseline_fields{registry::field::budget<BaselineConfig>, registry::field::buffer<BaselineConfig>,
                                            registry::field::sinks<BaselineConfig>, registry::field::window<BaselineConfig>};
}  // namespace policies::detail

/// A per-head baseline's Cache: the scorer `S` under the per-head budget, on a paged cache.
template <class S, class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using PerHeadBudgetCache = Cache<S, admit::All, evict::PerHead<trigger::Buffered>, memory::Paged<PageSize, Storage>, Backend>;

}  // namespace kvpolicy
