/// \file
/// kvpolicy/policies/snapkv.hpp — SnapKV (SPEC §5): once, when the prompt ends, each head keeps
/// its M best entries by the attention of the prompt's last W_obs queries, pooled along positions
/// and reduced over the GQA group; decode tokens stay. The engine declares the prompt length.
#pragma once

#include <algorithm>
#include <tuple>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/by_name.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"
#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/score/observed_attention.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// SnapKV, SPEC §5: compress the prompt to M per head once, by the attention of the last W_obs
/// queries, pooled along positions and reduced over the GQA group. Defaults as the original SnapKV
/// code: W_obs = 32, avg-pool, kernel 5, GQA mean (kvpress's reduction; docs/policies.md).
struct SnapKVConfig {
  [[no_unique_address]] ByName by_name{};
  std::int64_t budget = evict::default_budget;  ///< M per (layer, kv head), after the prompt
  std::int64_t sinks = 0;      ///< S: the S oldest entries of each head are protected (SPEC §5)
  std::int64_t window = 32;    ///< W_obs: the observation window, also the protected newest entries
  int pool_kernel = 5;         ///< odd; 1 = no pooling
  score::Pooling pooling = score::Pooling::avg;
  score::GroupReduce group_reduce = score::GroupReduce::mean;
};
/// Pass both to the Cache, built from one config. Its constructor throws unless M is in
/// [1, 2^31 - 1], W_obs is in [0, M] for the evictor and in [1, 2^20] for the scorer, S is in
/// [0, M - W_obs], and the pool kernel is odd and at least 1.
inline evict::PromptEnd snapkv_evictor(const SnapKVConfig& c = {}) {
  return evict::PromptEnd{c.budget, c.window, c.sinks};
}
inline score::ObservedAttention snapkv_scorer(const SnapKVConfig& c = {}) {
  return score::ObservedAttention{c.window, c.pool_kernel, c.pooling, c.group_reduce};
}

/// SnapKV: declare the prompt length at add_sequence(seq, prompt_tokens) (without it the prompt is
/// never compressed), and attend every step.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using SnapKVCache =
    Cache<score::ObservedAttention, admit::All, evict::PromptEnd, memory::Paged<PageSize, Storage>, Backend>;

namespace policies {

/// SnapKV's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct snapkv {
  static constexpr std::string_view name = "snapkv";
  static constexpr std::string_view help =
      "SnapKV: compress the prompt once to M per head by the attention of its last W_obs queries";
  static constexpr std::tuple fields{
      registry::field::budget<SnapKVConfig>, registry::field::sinks<SnapKVConfig>,
      registry::field::window<SnapKVConfig>.with_default(0).with_help(
          "W_obs, the observation window, also protected (0: min(32, M))"),
      registry::bind(&SnapKVConfig::pooling,
                     registry::Option{"pool", registry::Kind::choice, 0, "pooling along positions", {"avg", "max"}}
                         .recorded_as("pooling")),
      registry::bind(&SnapKVConfig::pool_kernel,
                     {"pool-kernel", registry::Kind::integer, 0, "the pooling kernel, odd (1: none)"}),
      registry::bind(&SnapKVConfig::group_reduce,
                     {"gqa", registry::Kind::choice, 0, "reduction over a kv head's query heads", {"mean", "max"}})};
  static constexpr auto options = registry::options_of(fields);
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::ObservedAttention>;
  /// It compresses the prompt the engine declares (Cache::add_sequence's prompt_tokens).
  static constexpr bool needs_prompt_length = true;

  static SnapKVConfig config(const registry::Values& v) {
    SnapKVConfig c = registry::read<SnapKVConfig>(v, fields);
    if (c.window == 0) c.window = std::min(SnapKVConfig{}.window, c.budget);
    return c;
  }

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    const SnapKVConfig c = config(v);
    Cache<score::ObservedAttention, admit::All, evict::PromptEnd, Alloc, Backend> cache(
        shape, std::move(pool), snapkv_evictor(c), snapkv_scorer(c));
    return f(cache);
  }
};

}  // namespace policies

}  // namespace kvpolicy
