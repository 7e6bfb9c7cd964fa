/// \file
/// kvpolicy/policies/dbtrimkv.hpp — DBTrimKV (SPEC §2): weight-tied retention gates, the lookahead
/// score over horizon h (Eq. 9) and one global budget L * Hkv * M per sequence shared by every layer
/// and kv head, on a ragged paged cache (heads end up with different lengths); optional floor_ratio
/// quotas, the threshold variant, or the layer-wise pool. The log_beta come from the authors' `rg10`
/// gate (gate/rg10_gate.hpp, gpu::rg10_gate_forward on the device), which loads their released
/// checkpoints; gate::TiedGate is the paper's literal form. kvpolicy/dbtrimkv.hpp includes this
/// file with the CPU backend.
///
///   const kvpolicy::DBTrimKVConfig c{.budget = 1024, .buffer = 128, .horizon = 2};
///   kvpolicy::DBTrimKVCache<> cache(shape, kvpolicy::memory::Paged<16>(pages), kvpolicy::dbtrimkv_evictor(c),
///                                   kvpolicy::dbtrimkv_scorer(c));
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include <tuple>
#include <cstdint>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/by_name.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"
#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/score/retention.hpp"
#include "kvpolicy/policies/common/token_level.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// DBTrimKV's settings (SPEC §2's defaults), written with designated initialisers (core/by_name.hpp).
struct DBTrimKVConfig {
  [[no_unique_address]] ByName by_name{};
  std::int64_t budget = evict::default_budget;  ///< M per (layer, kv head); the sequence keeps L * Hkv * M
  std::int64_t buffer = evict::default_buffer;  ///< B
  std::int64_t sinks = 0;      ///< S: the S oldest entries of each head are protected (SPEC §5)
  std::int64_t window = 0;     ///< w: the w newest entries of each head are protected
  double threshold = 0.0;      ///< alpha; > 0 selects the threshold variant
  int horizon = 2;             ///< h of the lookahead score
  double floor_ratio = 0.0;    ///< f: each head keeps floor(f * M) of its own best
  std::int64_t min_tokens = 0; ///< the threshold variant's floor: each head keeps at least its best this many
};

/// Built without checks; the Cache constructor throws for TRIM-KV's per-head checks
/// (trimkv_evictor, min_tokens among them), for f outside [0, 1), and for f > 0 together with a
/// threshold. The global pool triggers when the sequence's total reaches L * Hkv * (M + B); the
/// layer-wise one when a layer's total exceeds Hkv * (M + B); the threshold variant after every step.
inline evict::Global dbtrimkv_evictor(const DBTrimKVConfig& c = {}) {
  return evict::Global{c.budget, c.buffer, c.floor_ratio, c.window, c.threshold, c.sinks, c.horizon, c.min_tokens};
}
inline evict::LayerWise dbtrimkv_layerwise_evictor(const DBTrimKVConfig& c = {}) {
  return evict::LayerWise{c.budget, c.buffer, c.floor_ratio, c.window, c.threshold, c.sinks, c.horizon, c.min_tokens};
}
/// The scorer holds the config's horizon; the Cache refuses an evictor from a config whose horizon
/// its scorer does not have (pass both: `DBTrimKVCache<>(shape, pool, dbtrimkv_evictor(c), dbtrimkv_scorer(c))`).
/// It does so on the CPU and the GPU alike, and refuses a horizon h below 1.
inline score::Lookahead dbtrimkv_scorer(const DBTrimKVConfig& c = {}) { return score::Lookahead{c.horizon}; }

/// Pages for `sequences` DBTrimKV sequences (global or layer-wise, any floor_ratio) in the allocator
/// `Paged` (memory::Paged<P, Storage>). The budget bounds each sequence's total, not a head. Pages are
/// taken at append and given back at commit, so a step's peak follows its appends: at most
/// L * Hkv * (M + B + largest_chunk) entries in ragged heads (global, f = 0: L * Hkv * (M + B - 1 +
/// largest_chunk)), each head's last page partly empty, and one page per head over
/// ceil(L * Hkv * (M + B - 1 + largest_chunk) / P) covers all of these. Throws for the threshold
/// variant, for M, B or largest_chunk below 1, and for sequences < 0.
template <class Paged = memory::Paged<16>>
std::int64_t dbtrimkv_pages(const CacheShape& shape, const DBTrimKVConfig& c, std::int64_t sequences,
                            std::int64_t largest_chunk = 1) {
  const std::int64_t heads = shape.heads_total();
  const std::int64_t total = heads * evict::detail::per_head_peak("dbtrimkv_pages", c.budget, c.buffer, c.threshold, largest_chunk);
  require(sequences >= 0, "dbtrimkv_pages: sequences = ", sequences, " must be >= 0");
  return sequences * ((total + Paged::page_size - 1) / Paged::page_size + heads);
}

/// DBTrimKV's Cache: the lookahead score (score::Lookahead) under one budget per sequence shared by every
/// layer and kv head (evict::Global), on a paged pool.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using DBTrimKVCache =
    Cache<score::Lookahead, admit::All, evict::Global, memory::Paged<PageSize, Storage>, Backend>;

/// DBTrimKV with one pool per layer (evict::LayerWise): each layer's kv heads share Hkv * M.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using DBTrimKVLayerWiseCache =
    Cache<score::Lookahead, admit::All, evict::LayerWise, memory::Paged<PageSize, Storage>, Backend>;

namespace policies {

/// DBTrimKV's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct dbtrimkv {
  static constexpr std::string_view name = "dbtrimkv";
  static constexpr std::string_view help =
      "DBTrimKV: lookahead score over horizon h, one global budget L*Hkv*M per sequence, optional floor f";
  static constexpr std::tuple fields{
      registry::field::budget<DBTrimKVConfig>,
      registry::field::buffer<DBTrimKVConfig>,
      registry::bind(&DBTrimKVConfig::horizon, {"horizon", registry::Kind::integer, 0, "h, the lookahead horizon"}),
      registry::bind(&DBTrimKVConfig::floor_ratio,
                     registry::Option{"floor", registry::Kind::real, 0, "f in [0, 1): each head keeps floor(f*M) of its own best"}
                         .recorded_as("floor_ratio")),
      registry::field::window<DBTrimKVConfig>,
      registry::field::threshold<DBTrimKVConfig>,
      registry::field::min_tokens<DBTrimKVConfig>,
      registry::field::sinks<DBTrimKVConfig>};
  static constexpr auto options = registry::options_of(fields, registry::option::gate, registry::option::mode);
  using inputs = kvpolicy::inputs::TiedRetentionGate;
  using scorers = registry::scorers<score::Lookahead>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    const DBTrimKVConfig c = registry::read<DBTrimKVConfig>(v, fields);
    const std::int64_t h = c.horizon;
    require(h >= 1 && h <= 1 << 20, "--horizon h = ", h, " must be in [1, 2^20]");
    // the lookahead score is <= log h (SPEC §2): an alpha above h would keep nothing
    const double alpha = c.threshold;
    require(alpha >= 0.0 && alpha <= static_cast<double>(h), "--threshold alpha = ", alpha, " must be in (0, ", h,
            "] for dbtrimkv (its scores are <= log ", h, ": a larger alpha keeps nothing; 0 = off)");
    // union (SPEC §8): the global ranking of entries becomes one of positions, each at its best
    // head's lookahead score (the max: the tied readout makes scores comparable across heads)
    return detail::make_in_mode<Backend>(v, shape, std::move(pool), dbtrimkv_evictor(c), dbtrimkv_scorer(c),
                                         evict::Aggregate::max, std::forward<F>(f));
  }
};

}  // namespace policies

}  // namespace kvpolicy
