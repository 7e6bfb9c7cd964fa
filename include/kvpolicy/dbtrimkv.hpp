/// \file
/// kvpolicy/dbtrimkv.hpp — DBTrimKV presets (SPEC §2): weight-tied retention gates, lookahead score
/// (Eq. 9) and one global budget L * Hkv * M per sequence shared by every layer and kv head, on a
/// ragged paged cache (heads end up with different lengths). The log_beta come from the authors'
/// `rg10` gate (gate/rg10_gate.hpp, gpu::rg10_gate_forward on the device), which loads their
/// released checkpoints; gate::TiedGate is the paper's literal form.
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/cache.hpp"
#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policy/admit.hpp"
#include "kvpolicy/policy/evict.hpp"
#include "kvpolicy/policy/score.hpp"

namespace kvpolicy {

struct DBTrimKVConfig {
  std::int64_t budget = 1024;  // M per (layer, kv head); the sequence keeps L * Hkv * M
  std::int64_t buffer = 128;   // B
  int horizon = 2;             // h of the lookahead score
  double floor_ratio = 0.0;    // f
  std::int64_t window = 0;     // sliding-window protection w
  double threshold = 0.0;      // alpha; > 0 selects the threshold variant
  std::int64_t sinks = 0;      // S: the S oldest entries of each head are protected (SPEC §5)
};

inline evict::Global dbtrimkv_evictor(const DBTrimKVConfig& c = {}) {
  return evict::Global{c.budget, c.buffer, c.floor_ratio, c.window, c.threshold, c.sinks, c.horizon};
}
inline evict::LayerWise dbtrimkv_layerwise_evictor(const DBTrimKVConfig& c = {}) {
  return evict::LayerWise{c.budget, c.buffer, c.floor_ratio, c.window, c.threshold, c.sinks, c.horizon};
}
/// The scorer holds the config's horizon; the Cache refuses an evictor from a config whose horizon
/// its scorer does not have (pass both: `DBTrimKVCache<>(shape, pool, dbtrimkv_evictor(c), dbtrimkv_scorer(c))`).
inline score::Lookahead dbtrimkv_scorer(const DBTrimKVConfig& c = {}) { return score::Lookahead{c.horizon}; }

/// Pages for `sequences` DBTrimKV sequences (global or layer-wise, any floor_ratio) in the allocator
/// `Paged` (memory::Paged<P, Storage>). The budget bounds each sequence's total, not a head. Pages are
/// taken at append and given back at commit, so a step's peak follows its appends: at most
/// L * Hkv * (M + B + largest_chunk) entries in ragged heads (global, f = 0: L * Hkv * (M + B - 1 +
/// largest_chunk)), each head's last page partly empty, and one page per head over
/// ceil(L * Hkv * (M + B - 1 + largest_chunk) / P) covers all of these.
template <class Paged = memory::Paged<16>>
std::int64_t dbtrimkv_pages(const CacheShape& shape, const DBTrimKVConfig& c, std::int64_t sequences,
                            std::int64_t largest_chunk = 1) {
  const std::int64_t heads = shape.heads_total();
  const std::int64_t total = heads * evict::detail::per_head_peak("dbtrimkv_pages", c.budget, c.buffer, c.threshold, largest_chunk);
  require(sequences >= 0, "dbtrimkv_pages: sequences = ", sequences, " must be >= 0");
  return sequences * ((total + Paged::page_size - 1) / Paged::page_size + heads);
}

template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using DBTrimKVCache =
    Cache<score::Lookahead, admit::All, evict::Global, memory::Paged<PageSize, Storage>, Backend>;

template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using DBTrimKVLayerWiseCache =
    Cache<score::Lookahead, admit::All, evict::LayerWise, memory::Paged<PageSize, Storage>, Backend>;

}  // namespace kvpolicy
