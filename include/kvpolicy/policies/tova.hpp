/// \file
/// kvpolicy/policies/tova.hpp — TOVA (Oren et al. 2024, "Transformers are Multi-State RNNs", §3.3):
/// a head past its budget drops the entries the current query attends to least. The score of an
/// entry is the softmax attention the step's last query gives it, averaged over the kv head's
/// query group: score::ObservedAttention with an observation window of one query and no pooling.
/// Per-head budget M with buffer B = 1 by default (a strict budget: one eviction per decode step,
/// as the paper runs it); S sinks and the w newest protected (SPEC §5). The Cache records the last
/// query of every layer, so its steps must attend. kvpress's TOVAPress scores by the mean over every
/// query head of the layer and always keeps the newest token (w = 1); the paper and this file
/// score per kv head's group, which is what a per-head cache can evict by.
#pragma once

#include <tuple>

#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/policies/common/per_head_budget.hpp"
#include "kvpolicy/policies/common/token_level.hpp"
#include "kvpolicy/parts/score/observed_attention.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// TOVA's Cache: score::ObservedAttention{1, 1, avg, mean} (policies::tova::scorer) under the
/// per-head budget; its steps must attend.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using TOVACache = PerHeadBudgetCache<score::ObservedAttention, Backend, Storage, PageSize>;

namespace policies {

/// TOVA's registry entry (registry/policy.hpp): its name, help, options and make(), by which `--policy`,
/// registry::open and the Python package build it.
struct tova {
  static constexpr std::string_view name = "tova";
  static constexpr std::string_view help =
      "TOVA: per head, the M entries the step's last query attends to most (mean over its GQA group)";
  static constexpr std::tuple fields{registry::field::budget<BaselineConfig>,
                                     registry::field::buffer<BaselineConfig>.with_default(1),
                                     registry::field::sinks<BaselineConfig>, registry::field::window<BaselineConfig>};
  static constexpr auto options = registry::options_of(fields, registry::option::mode);
  using inputs = kvpolicy::inputs::None;
  using scorers = registry::scorers<score::ObservedAttention>;

  /// The attention of the last query alone, unpooled, averaged over the group.
  static constexpr score::ObservedAttention scorer{1, 1, score::Pooling::avg, score::GroupReduce::mean};

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    return detail::make_in_mode<Backend>(v, shape, std::move(pool),
                                         baseline_evictor(registry::read<BaselineConfig>(v, fields)),
                                         scorer, evict::Aggregate::mean, std::forward<F>(f));
  }
};

}  // namespace policies

}  // namespace kvpolicy
