/// \file
/// kvpolicy/policies/expected_attention.hpp — Expected Attention (not in SPEC: NVIDIA kvpress's
/// ExpectedAttentionPress): once, when the prompt ends, each head keeps its M best entries by the
/// attention that future queries are expected to pay them, from the mean and covariance of the
/// prompt's queries before RoPE, rotated by RoPE averaged over the next F positions, times each
/// value's norm; the S oldest entries stay. Decode tokens stay. The engine declares the prompt
/// length and describes its RoPE (the rope-theta and rope-layout options).
#pragma once

#include <tuple>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/by_name.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"
#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/score/expected_attention.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// Expected Attention (docs/policies.md). Defaults as kvpress's press: S = 4 sinks, F = 512 future
/// positions, covariance and value norm on, ε = 0; no protected window.
struct ExpectedAttentionConfig {
  [[no_unique_address]] ByName by_name{};
  std::int64_t budget = evict::default_budget;  ///< M per (layer, kv head), after the prompt
  std::int64_t sinks = 4;               ///< S: kept, left out of the softmax and of the query statistics
  std::int64_t window = 0;              ///< w: the newest entries of every head, protected (kvpress: none)
  std::int64_t future_positions = 512;  ///< F
  Rope rope{};                          ///< the model's RoPE
  bool covariance = true;
  bool value_norm = true;
  double epsilon = 0.0;
};
inline evict::PromptEnd expected_attention_evictor(const ExpectedAttentionConfig& c = {}) {
  return evict::PromptEnd{c.budget, c.window, c.sinks};
}
inline score::ExpectedAttention expected_attention_scorer(const ExpectedAttentionConfig& c = {}) {
  return score::ExpectedAttention{c.sinks, c.future_positions, c.rope, c.covariance, c.value_norm, c.epsilon};
}

/// Expected Attention: declare the prompt length at add_sequence(seq, prompt_tokens), and attend every step.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using ExpectedAttentionCache =
    Cache<score::ExpectedAttention, admit::All, evict::PromptEnd, memory::Paged<PageSize, Storage>, Backend>;

namespace policies {

/// Expected Attention's registry entry (registry/policy.hpp): its name, help, options and make(), by
/// which `--policy`, registry::open and the Python package build it.
struct expected_attention {
  static constexpr std::string_view name = "expected-attention";
  static constexpr std::string_view help =
      "Expected Attention: compress the prompt once to M per head by the attention future queries are expected to pay";
  using Config = ExpectedAttentionConfig;
  static constexpr std::tuple fields{
      registry::field::budget<Config>, registry::field::sinks<Config>,
      registry::field::window<Config>.with_help("w, the newest entries of every head, protected (kvpress: 0)"),
      registry::bind(&Config::future_positions,
                     registry::Option{"future", registry::Kind::integer, 0,
                                      "F, the positions after the prompt RoPE is averaged over"}
                         .at_least(1, "F")),
      registry::bind(&Config::covariance, {"covariance", registry::Kind::choice, 0, "the query covariance term", {"off", "on"}}),
      registry::bind(&Config::value_norm, {"vnorm", registry::Kind::choice, 0, "scale by the value's norm", {"off", "on"}}),
      registry::bind(&Config::epsilon, registry::Option{"epsilon", registry::Kind::real, 0,
                                                        "added to the score before the value norm"}
                                           .at_least(0, "epsilon"))};
  static constexpr auto options = registry::options_of(fields, registry::option::rope_theta, registry::option::rope_layout);
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::ExpectedAttention>;
  /// It compresses the prompt the engine declares (Cache::add_sequence's prompt_tokens).
  static constexpr bool needs_prompt_length = true;

  static ExpectedAttentionConfig config(const registry::Values& v) {
    Config c = registry::read<Config>(v, fields);
    c.rope = {.theta = v.real("rope-theta"), .layout = v.choice("rope-layout") == 0 ? RopeLayout::half : RopeLayout::adjacent};
    return c;
  }

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    const ExpectedAttentionConfig c = config(v);
    Cache<score::ExpectedAttention, admit::All, evict::PromptEnd, Alloc, Backend> cache(
        shape, std::move(pool), expected_attention_evictor(c), expected_attention_scorer(c));
    return f(cache);
  }
};

}  // namespace policies

}  // namespace kvpolicy
