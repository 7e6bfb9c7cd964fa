/// \file
/// kvpolicy/baselines.hpp — presets for SPEC §5's training-free baselines: StreamingLLM, H2O, KNorm,
/// KeyDiff and Random, each with a per-(layer, kv head) budget M and buffer B (the trigger of
/// SPEC §1: a head that reaches M + B keeps its top M; B = 1 evicts one entry per decode step, as
/// H2O does). H2O protects the recent half of the budget (h2o_evictor). They take log_beta like
/// every cache and ignore it: pass zeros. H2O ranks by the attention mass its attend() calls
/// accumulate, so its steps must attend.
///
///   kvpolicy::StreamingLLMCache<> cache(shape, kvpolicy::memory::Paged<16>(pages),
///                                       kvpolicy::baseline_evictor({.budget = 1024}),
///                                       kvpolicy::score::Recency{.sinks = 4});
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/cache.hpp"
#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policy/admit.hpp"
#include "kvpolicy/policy/baseline.hpp"
#include "kvpolicy/policy/evict.hpp"
#include "kvpolicy/policy/observed_attention.hpp"

namespace kvpolicy {

struct BaselineConfig {
  std::int64_t budget = 1024;  ///< M per (layer, kv head)
  std::int64_t buffer = 128;   ///< B
  std::int64_t sinks = 0;      ///< S: the S oldest entries of each head are protected (SPEC §5)
  std::int64_t window = 0;     ///< w: the w newest entries of each head are protected (SPEC §5); H2O: 0 = M / 2
};

inline evict::PerHead<trigger::Buffered> baseline_evictor(const BaselineConfig& c = {}) {
  return evict::PerHead<trigger::Buffered>{trigger::Buffered{c.budget, c.buffer}, c.window, 0.0, c.sinks};
}

/// Pages for `sequences` sequences under a per-head baseline (StreamingLLM, H2O, KNorm, KeyDiff,
/// Random) in the allocator `Paged`: every head at its peak M + B - 1 + largest_chunk.
template <class Paged = memory::Paged<16>>
std::int64_t baseline_pages(const CacheShape& shape, const BaselineConfig& c, std::int64_t sequences,
                            std::int64_t largest_chunk = 1) {
  return Paged::pages_for(shape, evict::detail::per_head_peak("baseline_pages", c.budget, c.buffer, 0.0, largest_chunk),
                          sequences);
}

/// H2O, SPEC §5: the recent half of the budget (w = M / 2) is protected, or the config's window
/// when it names one (w > 0).
inline evict::PerHead<trigger::Buffered> h2o_evictor(const BaselineConfig& c = {}) {
  return evict::PerHead<trigger::Buffered>{trigger::Buffered{c.budget, c.buffer}, c.window > 0 ? c.window : c.budget / 2,
                                           0.0, c.sinks};
}

/// SnapKV, SPEC §5: compress the prompt to M per head once, by the attention of the last W_obs
/// queries, pooled along positions and reduced over the GQA group. Defaults as the original SnapKV
/// code: W_obs = 32, avg-pool, kernel 5, GQA mean (kvpress's reduction; docs/policies.md).
struct SnapKVConfig {
  std::int64_t budget = 1024;  ///< M per (layer, kv head), after the prompt
  std::int64_t window = 32;    ///< W_obs: the observation window, also the protected newest entries
  int pool_kernel = 5;         ///< odd; 1 = no pooling
  score::Pooling pooling = score::Pooling::avg;
  score::GroupReduce group_reduce = score::GroupReduce::mean;
  std::int64_t sinks = 0;      ///< S: the S oldest entries of each head are protected (SPEC §5)
};
inline evict::PromptEnd snapkv_evictor(const SnapKVConfig& c = {}) {
  return evict::PromptEnd{c.budget, c.window, c.sinks};
}
inline score::ObservedAttention snapkv_scorer(const SnapKVConfig& c = {}) {
  return score::ObservedAttention{c.window, c.pool_kernel, c.pooling, c.group_reduce};
}

template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using StreamingLLMCache =
    Cache<score::Recency, admit::All, evict::PerHead<trigger::Buffered>, memory::Paged<PageSize, Storage>, Backend>;

template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using KNormCache =
    Cache<score::NegKeyNorm, admit::All, evict::PerHead<trigger::Buffered>, memory::Paged<PageSize, Storage>, Backend>;

template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using RandomCache =
    Cache<score::SeededRandom, admit::All, evict::PerHead<trigger::Buffered>, memory::Paged<PageSize, Storage>, Backend>;

template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using H2OCache = Cache<score::AttentionMass, admit::All, evict::PerHead<trigger::Buffered>,
                       memory::Paged<PageSize, Storage>, Backend>;

template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using KeyDiffCache =
    Cache<score::KeyDiff, admit::All, evict::PerHead<trigger::Buffered>, memory::Paged<PageSize, Storage>, Backend>;

/// SnapKV: declare the prompt length at add_sequence(seq, prompt_tokens), and attend every step.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using SnapKVCache =
    Cache<score::ObservedAttention, admit::All, evict::PromptEnd, memory::Paged<PageSize, Storage>, Backend>;

}  // namespace kvpolicy
