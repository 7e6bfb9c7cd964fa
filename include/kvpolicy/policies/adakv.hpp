/// \file
/// kvpolicy/policies/adakv.hpp — AdaKV (Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by
/// Adaptive Budget Allocation", Algorithm 1) over SnapKV's score: once, when the declared prompt
/// ends, each layer keeps Hkv * M entries chosen across its heads together, so a head whose
/// attention is concentrated gives budget to one whose attention is spread. As kvpress's AdaKVPress
/// runs it (alpha_safeguard 0.2): every head first keeps its top floor(alpha * M) (the safeguard),
/// then the layer's best of the rest fill Hkv * M. SnapKV's observation window (W_obs newest) and
/// the S oldest rank above every score, as SnapKV protects them (SPEC §5). Scores: SnapKV's
/// defaults (avg-pool 5, GQA mean). Ties: the larger position, then the lower head (SPEC, Ties).
#pragma once

#include <algorithm>
#include <tuple>
#include <cmath>

#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/policies/snapkv.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy::policies {

/// AdaKV's rule: per layer, at the step that ends the declared prompt. At namespace scope, not in
/// `adakv`: its `fields` read `AdaKVEvictor{}`'s defaults, which a class nested in one still being
/// defined does not have yet.
struct AdaKVEvictor {
  std::int64_t budget = evict::default_budget;  // M per head on average
  std::int64_t window = 32;    // W_obs, protected
  std::int64_t sinks = 0;      // S, protected
  double safeguard = 0.2;      // alpha

  void validate(const CacheShape& shape) const {
    evict::PromptEnd{budget, window, sinks}.validate(shape);
    require(safeguard >= 0.0 && safeguard <= 1.0, "adakv: safeguard alpha = ", safeguard, " must be in [0, 1]");
  }
  std::int64_t group_heads(const CacheShape& shape) const { return shape.kv_heads; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t heads, StepContext c) const {
    return c.prompt_ends && length > heads * budget;
  }
  /// The prompt is compressed once; decode tokens stay.
  std::optional<evict::MemoryBound> memory_bound(const CacheShape&) const { return std::nullopt; }
  /// The layer's pooled top Hkv * M over SnapKV's protections, each head's best floor(alpha M) first.
  evict::PoolSelection selection() const {
    evict::PoolSelection sel;
    sel.budget = budget;
    sel.window = window;
    sel.sinks = sinks;
    sel.guaranteed = static_cast<std::int64_t>(std::floor(safeguard * static_cast<double>(budget)));
    return sel;
  }
};

/// AdaKV's registry entry (registry/policy.hpp): its name, help, options and make(), by which `--policy`,
/// registry::open and the Python package build it.
struct adakv {
  static constexpr std::string_view name = "adakv";
  static constexpr std::string_view help =
      "AdaKV: compress the prompt once to Hkv*M per layer across its heads by SnapKV's score, each head >= alpha*M";
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::ObservedAttention>;
  /// It compresses the prompt the engine declares (Cache::add_sequence's prompt_tokens).
  static constexpr bool needs_prompt_length = true;

  /// The rule (AdaKVEvictor).
  using Evictor = AdaKVEvictor;

  static constexpr std::tuple fields{
      registry::field::budget<Evictor>.with_help("M, the average entries kept per (layer, kv head); a layer keeps Hkv*M"),
      registry::field::sinks<Evictor>,
      registry::field::window<Evictor>.with_default(0).with_help(
          "W_obs, the observation window, also protected (0: min(32, M))"),
      registry::bind(&Evictor::safeguard, {"safeguard", registry::Kind::real, 0,
                                           "alpha in [0, 1]: each head keeps at least its floor(alpha*M) best"})};
  static constexpr auto options = registry::options_of(fields);

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    Evictor e = registry::read<Evictor>(v, fields);
    if (e.window == 0) e.window = std::min(Evictor{}.window, e.budget);
    // SnapKV's score with its defaults
    const SnapKVConfig c{.budget = e.budget, .sinks = e.sinks, .window = e.window};
    Cache<score::ObservedAttention, admit::All, Evictor, Alloc, Backend> cache(shape, std::move(pool), e, snapkv_scorer(c));
    return f(cache);
  }
};

}  // namespace kvpolicy::policies

namespace kvpolicy {

/// AdaKV's Cache: SnapKV's scorer (snapkv_scorer) and policies::adakv::Evictor; declare the prompt
/// length at add_sequence(seq, prompt_tokens), and attend every step.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using AdaKVCache =
    Cache<score::ObservedAttention, admit::All, policies::adakv::Evictor, memory::Paged<PageSize, Storage>, Backend>;

}  // namespace kvpolicy
