/// \file
/// kvpolicy/policies/trimkv.hpp — TRIM-KV (SPEC §1): learned retention log beta per token and kv
/// head from the gate on the layer's normed input, score log beta * (n + 1 - p), per-head budget M
/// with buffer B, or the threshold variant. The preset a C++ program names and the registry entry
/// the tools build by name. kvpolicy/trimkv.hpp includes this file with the CPU backend.
///
///   kvpolicy::TrimKVCache<> cache(shape, kvpolicy::memory::Paged<16>(pages),
///                                 kvpolicy::trimkv_evictor({.budget = 1024, .buffer = 128}));
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

/// The knobs of SPEC §1 with its defaults.
struct TrimKVConfig {
  [[no_unique_address]] ByName by_name{};
  std::int64_t budget = evict::default_budget;  ///< M per (layer, kv head)
  std::int64_t buffer = evict::default_buffer;  ///< B
  std::int64_t sinks = 0;      ///< S: the S oldest entries of each head are protected (SPEC §5)
  std::int64_t window = 0;     ///< w: the w newest entries of each head are protected
  double threshold = 0.0;      ///< alpha; > 0 selects the threshold variant
  std::int64_t min_tokens = 0; ///< the threshold variant's floor: each head keeps at least its best this many
};

/// Built without checks; the Cache constructor validates it and throws unless M >= 1, B >= 1,
/// M + B <= 2^31 - 1, w is in [0, M], S is in [0, M - w], alpha is 0 or finite and above 0, and
/// min_tokens is 0 or (with alpha > 0) above 0.
inline evict::PerHead<trigger::Buffered> trimkv_evictor(const TrimKVConfig& c = {}) {
  return evict::PerHead<trigger::Buffered>{trigger::Buffered{c.budget, c.buffer}, c.window, c.threshold, c.sinks,
                                           c.min_tokens};
}

/// TRIM-KV's Cache: the retention score (score::RetentionDecay) under a per-head budget M with buffer B
/// (evict::PerHead, trigger::Buffered), on a paged pool. append's log_beta comes from gate::RetentionGate
/// (gpu::retention_gate_forward on the device).
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using TrimKVCache = Cache<score::RetentionDecay, admit::All, evict::PerHead<trigger::Buffered>,
                          memory::Paged<PageSize, Storage>, Backend>;

/// SPEC §1 variant `knorm`: retention plus log ||k||, the norm of the fp32 key as handed to append.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using TrimKVKNormCache = Cache<score::KNormRetention, admit::All, evict::PerHead<trigger::Buffered>,
                               memory::Paged<PageSize, Storage>, Backend>;

/// Pages for `sequences` TRIM-KV sequences in the allocator `Paged` (memory::Paged<P, Storage>):
/// every head at its peak M + B - 1 + largest_chunk. `largest_chunk`: the most tokens one step
/// appends (the prefill chunk; 1 for decode). Bytes: Paged::bytes_for(shape, pages). Throws for the
/// threshold variant (no budget bounds a head), for M, B or largest_chunk below 1, and for sequences < 0.
template <class Paged = memory::Paged<16>>
std::int64_t trimkv_pages(const CacheShape& shape, const TrimKVConfig& c, std::int64_t sequences,
                          std::int64_t largest_chunk = 1) {
  return Paged::pages_for(shape, evict::detail::per_head_peak("trimkv_pages", c.budget, c.buffer, c.threshold, largest_chunk),
                          sequences);
}

namespace policies {

/// TRIM-KV's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct trimkv {
  static constexpr std::string_view name = "trimkv";
  static constexpr std::string_view help = "TRIM-KV: score log_beta*(n+1-p), per-head budget M, evict when a head reaches M+B";
  static constexpr std::tuple fields{registry::field::budget<TrimKVConfig>,     registry::field::buffer<TrimKVConfig>,
                                     registry::field::window<TrimKVConfig>,     registry::field::threshold<TrimKVConfig>,
                                     registry::field::min_tokens<TrimKVConfig>, registry::field::sinks<TrimKVConfig>};
  static constexpr auto options = registry::options_of(fields, registry::option::gate, registry::option::mode);
  using inputs = kvpolicy::inputs::RetentionGate;
  using scorers = registry::scorers<score::RetentionDecay>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    // log(beta) * age <= 0 (SPEC §1): an alpha above 1 would keep nothing
    const TrimKVConfig c = registry::read<TrimKVConfig>(v, fields);
    const double alpha = c.threshold;
    require(alpha >= 0.0 && alpha <= 1.0, "--threshold alpha = ", alpha,
            " must be in (0, 1] for trimkv (its scores are <= log 1: a larger alpha keeps nothing; 0 = off)");
    // union (SPEC §8): a token stays while any head's retention would keep it (the max)
    return detail::make_in_mode<Backend>(v, shape, std::move(pool), trimkv_evictor(c), score::RetentionDecay{}, evict::Aggregate::max, std::forward<F>(f));
  }
};

}  // namespace policies

}  // namespace kvpolicy
