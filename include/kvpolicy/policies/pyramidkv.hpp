/// \file
/// kvpolicy/policies/pyramidkv.hpp — PyramidKV (Cai et al. 2024, "PyramidKV: Dynamic KV Cache
/// Compression based on Pyramidal Information Funneling", §3.3): SnapKV's compression of the
/// prompt with a budget per layer that shrinks with depth, the total fixed at L * Hkv * M. As
/// kvpress's PyramidKVPress computes it (its get_layer_budget, from the authors' KVCache-Factory
/// pyramidkv_utils.py), for a head holding q entries when the declared prompt ends, with
/// observation window W and steepness beta:
///   min = M / beta,  max = 2M - min;  if max >= q - W: max = q - W, min = 2M - max;
///   M_l = round(max - l * (max - min) / (L - 1))      (round half to even, as Python's round)
/// so the layers' budgets fall linearly from the first layer to the last and average M; unless
/// q >= max >= min >= W fails (a budget too small for the window at depth: M < beta * W, or a
/// prompt too short), when every layer keeps M, SnapKV's uniform budget. Each head of layer l
/// keeps its W newest entries (the observation window), its S oldest (sinks, SPEC §5) and its best
/// others up to M_l by SnapKV's score (avg-pool 5, GQA mean); ties: the larger position (SPEC,
/// Ties). kvpress ranks the window by the maximum score instead of +inf and counts it in M_l, as
/// here. The original code keeps M_l besides the window; kvpress's total is the fixed one.
///
///   kvpolicy::PyramidKVCache<> cache(shape, kvpolicy::memory::Paged<16>(pages),
///                                    kvpolicy::pyramidkv_evictor(shape, {.budget = 256}),
///                                    kvpolicy::pyramidkv_scorer({.budget = 256}));
///   cache.add_sequence(seq, prompt_tokens);   // and attend every step (the scorer observes the queries)
///
/// Its selection depends on the layer, which no HeadSelection states: its own trigger() and
/// select() (core/concepts.hpp), which run on the host. A device Cache runs it too: the device
/// scores, and the executor hands the scores to select() on the host (cuda/executor.cuh).
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include <algorithm>
#include <tuple>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/by_name.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"
#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/evict/rank.hpp"
#include "kvpolicy/parts/score/observed_attention.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// PyramidKV's settings, written with designated initialisers (core/by_name.hpp).
struct PyramidKVConfig {
  [[no_unique_address]] ByName by_name{};
  std::int64_t budget = evict::default_budget;  ///< M: the layers' budgets average M per (layer, kv head)
  std::int64_t sinks = 0;      ///< S: the S oldest entries of each head are protected (SPEC §5)
  std::int64_t window = 32;    ///< W_obs: the observation window, also the protected newest entries
  std::int64_t beta = 20;      ///< the pyramid's steepness: the last layer keeps about M / beta, the first 2M - M / beta
};

namespace evict {

/// PyramidKV's rule (see the file's comment): at the step that ends the declared prompt, each head
/// longer than its layer's budget M_l keeps its top M_l.
struct Pyramid {
  std::int64_t budget = evict::default_budget;  // M, the layers' mean budget
  std::int64_t window = PyramidKVConfig{}.window;  // W_obs, protected
  std::int64_t sinks = 0;      // S, protected
  std::int64_t beta = PyramidKVConfig{}.beta;
  int layers = 1;              // L of the shape it was built for
  /// Each head triggers and keeps by its own length and entries (core/concepts.hpp): a rank of a
  /// sharded Cache runs it as it is, its heads in the same layer-major order.
  static constexpr bool selects_heads_alone = true;

  void validate(const CacheShape& shape) const {
    PromptEnd{budget, window, sinks}.validate(shape);
    require(beta >= 1 && beta <= INT32_MAX, "evict::Pyramid: beta = ", beta, " must be in [1, 2^31 - 1]");
    require(layers == shape.layers, "evict::Pyramid: built for ", layers, " layers, composed with a shape of ",
            shape.layers, " (pyramidkv_evictor(shape, config) takes the Cache's shape)");
  }

  /// M_l for layer `layer` of a head holding `length` entries (kvpress's get_layer_budget with
  /// compression_ratio 1 - M / length; its floor of 1 is M's own).
  std::int64_t layer_budget(std::int64_t length, int layer) const {
    const double mean = static_cast<double>(budget), w = static_cast<double>(window), q = static_cast<double>(length);
    double least = mean / static_cast<double>(beta);
    double most = mean * 2 - least;
    if (most >= q - w) {
      most = q - w;
      least = mean * 2 - most;
    }
    if (!(q >= most && most >= least && least >= w)) return budget;
    const double step = layers > 1 ? (most - least) / static_cast<double>(layers - 1) : 0.0;
    return static_cast<std::int64_t>(std::nearbyint(most - static_cast<double>(layer) * step));
  }

  // the rule: per head, at the step that ends the declared prompt
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  /// Whether a head may evict at this step; trigger() below decides with its layer's budget.
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext c) const { return c.prompt_ends && length > 0; }
  /// The prompt is compressed once; decode tokens stay.
  std::optional<MemoryBound> memory_bound(const CacheShape&) const { return std::nullopt; }
  bool trigger(const CacheShape& shape, StepContext c, std::span<const std::int64_t> lengths,
               std::span<std::uint8_t> active) const {
    bool any = false;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const int layer = static_cast<int>(static_cast<std::int64_t>(i) / shape.kv_heads);
      active[i] = c.prompt_ends && lengths[i] > layer_budget(lengths[i], layer);
      any = any || active[i];
    }
    return any;
  }
  void select(const CacheShape& shape, StepContext, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    std::vector<float> score;
    for (std::int64_t h = 0; h < s.segments(); ++h) {
      const auto b = static_cast<std::size_t>(s.offsets[h]);
      const auto n = static_cast<std::size_t>(s.length(h));
      if (n == 0) continue;  // a head that did not trigger
      score.assign(s.score.begin() + static_cast<std::ptrdiff_t>(b), s.score.begin() + static_cast<std::ptrdiff_t>(b + n));
      const auto position = s.position.subspan(b, n);
      rank::protect_window(position, window, score);
      rank::protect_sinks(position, sinks, score);
      const int layer = static_cast<int>(h / shape.kv_heads);
      rank::keep_top_k(score, position, layer_budget(static_cast<std::int64_t>(n), layer), keep.subspan(b, n));
    }
  }
};

static_assert(Evictor<Pyramid> && evictor_triggers_itself<Pyramid>, "evict::Pyramid must model kvpolicy::Evictor");

}  // namespace evict

inline evict::Pyramid pyramidkv_evictor(const CacheShape& shape, const PyramidKVConfig& c = {}) {
  return evict::Pyramid{c.budget, c.window, c.sinks, c.beta, static_cast<int>(shape.layers)};
}
/// SnapKV's score with its defaults (kvpress's PyramidKVPress is a SnapKVPress).
inline score::ObservedAttention pyramidkv_scorer(const PyramidKVConfig& c = {}) {
  return score::ObservedAttention{c.window, 5, score::Pooling::avg, score::GroupReduce::mean};
}

/// PyramidKV: declare the prompt length at add_sequence(seq, prompt_tokens), and attend every step.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using PyramidKVCache =
    Cache<score::ObservedAttention, admit::All, evict::Pyramid, memory::Paged<PageSize, Storage>, Backend>;

namespace policies {

/// PyramidKV's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct pyramidkv {
  static constexpr std::string_view name = "pyramidkv";
  static constexpr std::string_view help =
      "PyramidKV: SnapKV's prompt compression with per-layer budgets shrinking with depth, averaging M";
  static constexpr std::tuple fields{
      registry::field::budget<PyramidKVConfig>.with_help("M, the layers' mean entries kept per (layer, kv head)"),
      registry::field::sinks<PyramidKVConfig>,
      registry::field::window<PyramidKVConfig>.with_default(0).with_help(
          "W_obs, the observation window, also protected (0: min(32, M))"),
      registry::bind(&PyramidKVConfig::beta,
                     registry::Option{"beta", registry::Kind::integer, 0,
                                      "the pyramid's steepness: the last layer keeps about M/beta, the first 2M - M/beta"}
                         .at_least(1, "beta"))};
  static constexpr auto options = registry::options_of(fields);
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::ObservedAttention>;
  /// It compresses the prompt the engine declares (Cache::add_sequence's prompt_tokens).
  static constexpr bool needs_prompt_length = true;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    PyramidKVConfig c = registry::read<PyramidKVConfig>(v, fields);
    if (c.window == 0) c.window = std::min(PyramidKVConfig{}.window, c.budget);
    Cache<score::ObservedAttention, admit::All, evict::Pyramid, Alloc, Backend> cache(
        shape, std::move(pool), pyramidkv_evictor(shape, c), pyramidkv_scorer(c));
    return f(cache);
  }
};

}  // namespace policies

}  // namespace kvpolicy
