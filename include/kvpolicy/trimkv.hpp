/// \file
/// kvpolicy/trimkv.hpp — TRIM-KV presets (SPEC §1): learned retention log_beta per token and kv
/// head, score log_beta * (n + 1 - p), per-head budget M with buffer B, on a paged cache.
///
///   kvpolicy::TrimKVCache<> cache(shape, kvpolicy::memory::Paged<16>(pages),
///                                 kvpolicy::trimkv_evictor({.budget = 1024, .buffer = 128}));
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/cache.hpp"
#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/contiguous.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policy/admit.hpp"
#include "kvpolicy/policy/evict.hpp"
#include "kvpolicy/policy/score.hpp"

namespace kvpolicy {

/// The knobs of SPEC §1 with its defaults.
struct TrimKVConfig {
  std::int64_t budget = 1024;  // M per (layer, kv head)
  std::int64_t buffer = 128;   // B
  std::int64_t window = 0;     // sliding-window protection w
  double threshold = 0.0;      // alpha; > 0 selects the threshold variant
  std::int64_t sinks = 0;      // S: the S oldest entries of each head are protected (SPEC §5)
};

inline evict::PerHead<trigger::Buffered> trimkv_evictor(const TrimKVConfig& c = {}) {
  return evict::PerHead<trigger::Buffered>{trigger::Buffered{c.budget, c.buffer}, c.window, c.threshold, c.sinks};
}

template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using TrimKVCache = Cache<score::RetentionDecay, admit::All, evict::PerHead<trigger::Buffered>,
                          memory::Paged<PageSize, Storage>, Backend>;

/// SPEC §1 variant `knorm`: retention plus log ||k||.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using TrimKVKNormCache = Cache<score::KNormRetention, admit::All, evict::PerHead<trigger::Buffered>,
                               memory::Paged<PageSize, Storage>, Backend>;

/// Pages a paged pool needs so that `sequences` sequences each hold up to `entries_per_head` entries
/// in every (layer, kv head). Prefer the allocator's own `memory::Paged<P>::pages_for` (no page size
/// to repeat) or a preset's bound (trimkv_pages, dbtrimkv_pages, baseline_pages).
inline std::int64_t pages_for(const CacheShape& shape, std::int64_t entries_per_head, std::int64_t sequences,
                              std::int64_t page_size) {
  require(page_size >= 1 && entries_per_head >= 0 && sequences >= 0, "pages_for: page_size = ", page_size,
          " must be >= 1, entries_per_head = ", entries_per_head, " and sequences = ", sequences, " >= 0");
  return sequences * shape.heads_total() * ((entries_per_head + page_size - 1) / page_size);
}


/// Pages for `sequences` TRIM-KV sequences in the allocator `Paged` (memory::Paged<P, Storage>):
/// every head at its peak M + B - 1 + largest_chunk. `largest_chunk`: the most tokens one step
/// appends (the prefill chunk; 1 for decode). Bytes: Paged::bytes_for(shape, pages).
template <class Paged = memory::Paged<16>>
std::int64_t trimkv_pages(const CacheShape& shape, const TrimKVConfig& c, std::int64_t sequences,
                          std::int64_t largest_chunk = 1) {
  return Paged::pages_for(shape, evict::detail::per_head_peak("trimkv_pages", c.budget, c.buffer, c.threshold, largest_chunk),
                          sequences);
}

}  // namespace kvpolicy
