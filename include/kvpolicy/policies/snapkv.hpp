/// \file
/// kvpolicy/policies/snapkv.hpp — SnapKV (SPEC §5): once, when the prompt ends, each head keeps
/// its M best entries by the attention of the prompt's last W_obs queries, pooled along positions
/// and reduced over the GQA group; decode tokens stay. The engine declares the prompt length.
#pragma once

#include <algorithm>
#include <array>

#include "kvpolicy/baselines.hpp"
#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy::policies {

struct snapkv {
  static constexpr std::string_view name = "snapkv";
  static constexpr std::string_view help =
      "SnapKV: compress the prompt once to M per head by the attention of its last W_obs queries";
  static constexpr std::array options{
      registry::option::budget, registry::option::sinks,
      registry::option::window.with_help("W_obs, the observation window, also protected (0: min(32, M))"),
      registry::Option{"pool", registry::Kind::choice, 0, "pooling along positions", {"avg", "max"}}.recorded_as("pooling"),
      registry::Option{"pool-kernel", registry::Kind::integer, 5, "the pooling kernel, odd (1: none)"},
      registry::Option{"gqa", registry::Kind::choice, 0, "reduction over a kv head's query heads", {"mean", "max"}}};
  static constexpr registry::Inputs inputs = registry::Inputs::none;
  /// It compresses the prompt the engine declares (Cache::add_sequence's prompt_tokens).
  static constexpr bool needs_prompt_length = true;

  static SnapKVConfig config(const registry::Values& v) {
    const std::int64_t M = v.integer("budget"), w = v.integer("window");
    return {M,
            w > 0 ? w : std::min<std::int64_t>(32, M),
            static_cast<int>(v.integer("pool-kernel")),
            v.choice("pool") == 0 ? score::Pooling::avg : score::Pooling::max,
            v.choice("gqa") == 0 ? score::GroupReduce::mean : score::GroupReduce::max,
            v.integer("sinks")};
  }

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    const SnapKVConfig c = config(v);
    Cache<score::ObservedAttention, admit::All, evict::PromptEnd, Alloc, Backend> cache(
        shape, std::move(pool), snapkv_evictor(c), snapkv_scorer(c));
    return f(cache);
  }
};

}  // namespace kvpolicy::policies
