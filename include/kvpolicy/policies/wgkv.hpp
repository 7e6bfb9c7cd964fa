/// \file
/// kvpolicy/policies/wgkv.hpp — WG-KV, write-gated admission (SPEC §3): a learned gate g per (layer, kv
/// head, token) from the pre- and post-RoPE keys; every head keeps its W_local = 256 newest tokens
/// (the local ring) and, of the older ones, those with g >= tau = 0.1 (the global cache, which grows
/// only by promotion); attention applies the vertical-slash mask.
///
///   auto gate = kvpolicy::gate::WriteGate::load(file, {.layers = L, .kv_heads = Hkv, .head_dim = d});
///   kvpolicy::WGKVCache<> cache(shape, kvpolicy::memory::Paged<16>(pages), kvpolicy::wgkv_evictor());
///   per layer l:  gate.forward(l, k_pre, k_post, g);             // [Hkv, T, d] x2 -> [Hkv, T]
///                 cache.append(seq, l, k_post, values, g);      // g in place of log_beta
///                 cache.attend(seq, l, queries, out);
///   cache.commit(seq);                                           // tokens that left the ring with g < tau go
///
/// With a hard budget (SPEC §3 "Admission with eviction", paper appendix K): WGKVBudgetCache, whose
/// scorer keeps the last W_obs = 256 queries of every layer and, once the sequence's global caches
/// (the rings not counted) hold more than L * Hkv * M_avg entries, drops floor(10%) of each head's
/// global cache by the attention its keys alone draw (as the authors' code does).
///
/// WG-KV admission composed with TRIM-KV retention eviction (any Admitter with any Evictor): the
/// gate decides at write time (admit::WriteGate: g >= tau is admitted, any other token lives in the
/// ring only), the engine's log_beta ranks what is admitted under a per-head budget M:
///   kvpolicy::WGKVRetentionCache<> cache(shape, memory::Paged<16>(pages), trimkv_evictor({.budget = 1024}),
///                                        {}, wgkv_admitter());
///   cache.append(seq, l, k_post, values, log_beta, g);   // both per (kv head, token)
/// Each commit first drops the tokens that left their ring unadmitted, then TRIM-KV evicts among
/// what stays (its budget counts the ring's tokens too).
///
/// The ring is not a physically separate buffer: the paged allocator holds both parts, the rule
/// above keeps exactly the ring's survivors, and compaction moves O(dropped) entries per step.
///
/// The preset a C++ program names and the registry entry the tools build by name (with
/// --avg-budget, the hard budget of appendix K). kvpolicy/wgkv.hpp includes this file with the CPU
/// backend.
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
#include "kvpolicy/parts/admit/write_gate.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/score/observed_attention.hpp"
#include "kvpolicy/parts/score/retention.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// WG-KV's settings (SPEC §3's defaults), written with designated initialisers (core/by_name.hpp).
struct WGKVConfig {
  [[no_unique_address]] ByName by_name{};
  std::int64_t sinks = 0;    ///< S: positions 0..S-1 stay, whatever their g (SPEC §5)
  std::int64_t local = 256;  ///< W_local (the ring: WG-KV's protected window)
  double tau = 0.1;          ///< admitted iff g >= tau
};

/// Built without checks; the Cache constructor throws unless W_local is in [1, 2^31 - 1], tau is
/// in (0, 1], and S is in [0, 2^31 - 1].
inline evict::WriteGated wgkv_evictor(const WGKVConfig& c = {}) { return evict::WriteGated{c.local, c.tau, c.sinks}; }
inline admit::WriteGate wgkv_admitter(const WGKVConfig& c = {}) { return admit::WriteGate{c.local, c.tau}; }

/// WG-KV's own Cache: the write gate's g as a frozen score (score::Frozen); evict::WriteGated keeps the ring
/// and the tokens admitted from it, with no budget. g ([Hkv, T] from gate::WriteGate::forward) goes in
/// append's log_beta; score::Frozen takes any value there but NaN and +inf, so g's [0, 1] is not checked.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using WGKVCache = Cache<score::Frozen, admit::All, evict::WriteGated, memory::Paged<PageSize, Storage>, Backend>;

/// WG-KV admission + TRIM-KV retention eviction (see above); g in [0, 1] goes to append's `gate`
/// (required: append throws without it), log_beta in [-inf, 0] to its log_beta.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using WGKVRetentionCache = Cache<score::RetentionDecay, admit::WriteGate, evict::PerHead<trigger::Buffered>,
                                 memory::Paged<PageSize, Storage>, Backend>;

/// SPEC §3 "Admission with eviction": M_avg = 4096 entries per (layer, kv head) on average.
struct WGKVBudgetConfig {
  [[no_unique_address]] ByName by_name{};
  std::int64_t sinks = 0;                 ///< S: positions 0..S-1 stay, whatever their g (SPEC §5)
  std::int64_t local = 256;               ///< W_local
  double tau = 0.1;                       ///< admitted iff g >= tau
  std::int64_t average_budget = 4096;     ///< M_avg
  std::int64_t observation_window = 256;  ///< W_obs
  int pool_kernel = 5;
  double fraction = 0.1;                  ///< of each head's global cache, per eviction
};

/// Give the evictor and the scorer the same shape and config: the Cache constructor checks they
/// agree. It throws for WGKVConfig's checks (wgkv_evictor), for a budget below 0, for fraction
/// outside (0, 1], for W_obs outside [1, 2^20], and for an even or non-positive pool_kernel.
inline evict::WriteGatedBudget wgkv_budget_evictor(const CacheShape& shape, const WGKVBudgetConfig& c = {}) {
  return evict::WriteGatedBudget{c.local, c.tau, shape.heads_total() * c.average_budget, c.fraction, c.sinks};
}
inline score::GatedObservedAttention wgkv_budget_scorer(const CacheShape& shape, const WGKVBudgetConfig& c = {}) {
  return score::GatedObservedAttention{c.tau, c.local, shape.heads_total() * c.average_budget, c.observation_window,
                                       c.pool_kernel, c.sinks};
}

/// WG-KV admission under a hard budget: attend every step (the scorer observes the queries). g goes
/// in append's log_beta slot.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using WGKVBudgetCache = Cache<score::GatedObservedAttention, admit::All, evict::WriteGatedBudget,
                              memory::Paged<PageSize, Storage>, Backend>;

namespace policies {

/// WG-KV's registry entry (registry/policy.hpp): its name, help, options and make(), by which `--policy`,
/// registry::open and the Python package build it.
struct wgkv {
  static constexpr std::string_view name = "wgkv";
  static constexpr std::string_view help =
      "WG-KV: the W_local newest tokens of every head and the older ones with write gate g >= tau";
  // WGKVBudgetConfig's members; without --avg-budget (0) the Cache has no budget and takes WGKVConfig's
  static constexpr std::tuple fields{
      registry::bind(&WGKVBudgetConfig::local,
                     {"local", registry::Kind::integer, 0, "W_local, the ring of newest tokens (its protected window)"}),
      registry::bind(&WGKVBudgetConfig::tau, {"tau", registry::Kind::real, 0, "admission threshold on g"}),
      registry::field::sinks<WGKVBudgetConfig>,
      registry::bind(&WGKVBudgetConfig::average_budget,
                     registry::Option{"avg-budget", registry::Kind::integer, 0,
                                      "M_avg: a hard budget of L*Hkv*M_avg global entries, by observed attention (0: none)"}
                         .recorded_as("average_budget"))
          .with_default(0)};
  static constexpr auto options = registry::options_of(fields, registry::option::gate);
  static_assert(WGKVConfig{}.local == WGKVBudgetConfig{}.local && WGKVConfig{}.tau == WGKVBudgetConfig{}.tau,
                "WG-KV's defaults are WGKVBudgetConfig's, with or without a budget");
  using inputs = kvpolicy::inputs::WriteGate;
  using scorers = registry::scorers<score::Frozen, score::GatedObservedAttention>;
  /// Its ring masks the attention and its gate drops tokens at write time (SPEC §3), which an
  /// engine attending over its own K/V would not apply (SPEC §9).
  static constexpr bool over_engine_storage = false;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    const WGKVBudgetConfig c = registry::read<WGKVBudgetConfig>(v, fields);
    const std::int64_t average = c.average_budget;
    require(average >= 0, "--avg-budget M = ", average, " must be >= 0 (0: no hard budget)");
    if (average > 0) {  // SPEC §3 "Admission with eviction", the authors' W_obs, kernel and fraction
      Cache<score::GatedObservedAttention, admit::All, evict::WriteGatedBudget, Alloc, Backend> cache(
          shape, std::move(pool), wgkv_budget_evictor(shape, c), wgkv_budget_scorer(shape, c));
      return f(cache);
    }
    Cache<score::Frozen, admit::All, evict::WriteGated, Alloc, Backend> cache(
        shape, std::move(pool), wgkv_evictor({.sinks = c.sinks, .local = c.local, .tau = c.tau}));
    return f(cache);
  }
};

}  // namespace policies

}  // namespace kvpolicy
