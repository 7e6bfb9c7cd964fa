/// \file
/// kvpolicy/policies/streamingllm.hpp — StreamingLLM (SPEC §5): the S oldest tokens (attention
/// sinks) and the newest, per-head budget M with buffer B.
#pragma once

#include <tuple>
#include <utility>

#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/policies/common/per_head_budget.hpp"
#include "kvpolicy/policies/common/token_level.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// StreamingLLM (Xiao et al. 2024): score::Recency{.sinks = S} ranks the S first tokens and then
/// the newest; the per-head budget of SPEC §5. Its sinks come from the scorer (S = 4 by default);
/// any evictor can also protect sinks through its config's `sinks`.
///   kvpolicy::StreamingLLMCache<> cache(shape, kvpolicy::memory::Paged<16>(pages),
///                                       kvpolicy::baseline_evictor({.budget = 1024}),
///                                       kvpolicy::score::Recency{.sinks = 4});
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using StreamingLLMCache = PerHeadBudgetCache<score::Recency, Backend, Storage, PageSize>;

namespace policies {

/// StreamingLLM's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it.
struct streamingllm {
  static constexpr std::string_view name = "streamingllm";
  static constexpr std::string_view help = "StreamingLLM: the S first tokens (sinks) and the newest, per-head budget M";
  static constexpr std::tuple fields{registry::field::budget<BaselineConfig>, registry::field::buffer<BaselineConfig>,
                                     registry::field::sinks<BaselineConfig>.with_default(4),
                                     registry::field::window<BaselineConfig>};
  static constexpr auto options = registry::options_of(fields, registry::option::mode);
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::Recency>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    // the sinks rank first by the score itself (score::Recency), so the evictor protects none
    BaselineConfig c = registry::read<BaselineConfig>(v, fields);
    const score::Recency recency{std::exchange(c.sinks, 0)};
    return detail::make_in_mode<Backend>(v, shape, std::move(pool), baseline_evictor(c), recency, evict::Aggregate::max,
                                         std::forward<F>(f));
  }
};

}  // namespace policies

}  // namespace kvpolicy
