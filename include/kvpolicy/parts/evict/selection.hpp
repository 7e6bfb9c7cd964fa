/// \file
/// kvpolicy/parts/evict/selection.hpp — the host executor of an Evictor's rule (core/rule.hpp), the
/// reference the device's evict_step must match: evict::trigger_heads runs the rule's trigger over the
/// groups of group_heads(shape) heads, evict::select_survivors marks the survivors its selection() states
/// (per head: select_heads; pooled: select_pools, over parts/evict/rank.hpp), or calls the Evictor's
/// own select() for a rule the data cannot state. Neither moves data.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/rule.hpp"
#include "kvpolicy/parts/evict/rank.hpp"

namespace kvpolicy::evict {

namespace detail {

/// The scores the selection ranks: the given ones with each active head's window (its w newest)
/// and sinks (its S oldest) protected (+inf).
inline std::vector<float> protected_scores(const SegmentedScores& s, std::int64_t window, std::int64_t sinks = 0) {
  std::vector<float> out(s.score.begin(), s.score.end());
  if (window > 0 || sinks > 0)
    for (std::int64_t h = 0; h < s.segments(); ++h) {
      const auto b = static_cast<std::size_t>(s.offsets[h]);
      const auto n = static_cast<std::size_t>(s.length(h));
      rank::protect_window(s.position.subspan(b, n), window, std::span<float>(out).subspan(b, n));
      rank::protect_sinks(s.position.subspan(b, n), sinks, std::span<float>(out).subspan(b, n));
    }
  return out;
}

/// A head's best `k` entries by (score, larger position) raised to +inf, so they rank above every
/// score: the guaranteed share of a Head- or PoolSelection.
inline void raise_best(std::span<float> score, std::span<const std::int32_t> position, std::int64_t k) {
  std::vector<std::uint8_t> mine(score.size());
  rank::keep_top_k(std::span<const float>(score), position, k, mine);
  for (std::size_t i = 0; i < score.size(); ++i)
    if (mine[i]) score[i] = std::numeric_limits<float>::infinity();
}

/// AdaKV's safeguard and the threshold's floor (PoolSelection::guaranteed): each head's best
/// `guaranteed` entries score +inf, so they rank above the pool.
inline void protect_guaranteed(const SegmentedScores& s, std::int64_t guaranteed, std::span<float> score) {
  if (guaranteed <= 0) return;
  for (std::int64_t h = 0; h < s.segments(); ++h) {
    const auto b = static_cast<std::size_t>(s.offsets[h]);
    const auto n = static_cast<std::size_t>(s.length(h));
    raise_best(score.subspan(b, n), s.position.subspan(b, n), guaranteed);
  }
}

/// One pooled ranking over the segments [first, last) — SPEC §2 global/layer-wise selection:
/// keep the top `pool_budget` entries, or with floor_ratio f > 0: the top floor((1-f)*pool_budget)
/// pooled, then each head keeps its top (count among those + floor(M*f)).
inline void select_pooled(const SegmentedScores& s, std::span<const float> score, std::int64_t first,
                          std::int64_t last, std::int64_t pool_budget, std::int64_t per_head_budget,
                          double floor_ratio, std::span<std::uint8_t> keep) {
  const std::int64_t begin = s.offsets[first], end = s.offsets[last];
  const std::int64_t total = end - begin;
  std::vector<std::int64_t> head_of(static_cast<std::size_t>(total));
  for (std::int64_t h = first; h < last; ++h)
    std::fill(head_of.begin() + (s.offsets[h] - begin), head_of.begin() + (s.offsets[h + 1] - begin), h);
  const auto k_pooled = static_cast<std::int64_t>(std::floor((1.0 - floor_ratio) * static_cast<double>(pool_budget)));
  std::vector<std::int64_t> idx(static_cast<std::size_t>(total));
  std::iota(idx.begin(), idx.end(), begin);
  const std::int64_t k = std::min(k_pooled, total);
  if (k > 0 && k < total)
    std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), [&](std::int64_t a, std::int64_t b) {
      return rank::above(score[a], s.position[a], head_of[a - begin], score[b], s.position[b], head_of[b - begin]);
    });
  std::fill(keep.begin() + begin, keep.begin() + end, std::uint8_t{0});
  if (floor_ratio == 0.0) {
    for (std::int64_t j = 0; j < k; ++j) keep[idx[j]] = 1;
    return;
  }
  const auto floor_quota = static_cast<std::int64_t>(std::floor(static_cast<double>(per_head_budget) * floor_ratio));
  std::vector<std::int64_t> quota(static_cast<std::size_t>(last - first), floor_quota);
  for (std::int64_t j = 0; j < k; ++j) ++quota[head_of[idx[j] - begin] - first];
  for (std::int64_t h = first; h < last; ++h) {
    const auto b = static_cast<std::size_t>(s.offsets[h]);
    const auto n = static_cast<std::size_t>(s.length(h));
    rank::keep_top_k(score.subspan(b, n), s.position.subspan(b, n), quota[h - first], keep.subspan(b, n));
  }
}

/// The trigger of a stated rule on the host: the heads in groups of
/// group_heads(shape), each group active iff fires(its total length, its heads, c).
template <class E>
bool trigger_groups(const E& e, const CacheShape& shape, StepContext c, std::span<const std::int64_t> lengths,
                    std::span<std::uint8_t> active) {
  const std::int64_t group = e.group_heads(shape);
  require(group >= 1 && shape.heads_total() % group == 0, "Evictor: group_heads = ", group,
          " must divide L x Hkv = ", shape.heads_total(), " (heads trigger together within one sequence)");
  const auto per = static_cast<std::size_t>(group);
  bool any = false;
  for (std::size_t first = 0; first < lengths.size(); first += per) {
    const std::int64_t total = std::accumulate(lengths.begin() + first, lengths.begin() + first + per, std::int64_t{0});
    const bool fires = e.fires(total, static_cast<std::int64_t>(per), c);
    std::fill(active.begin() + first, active.begin() + first + per, static_cast<std::uint8_t>(fires ? 1 : 0));
    any = any || fires;
  }
  return any;
}

/// A HeadSelection on the host: in each head, the prompt (when keeps_prompt), window and sinks
/// protected, then its guaranteed best (past the protected prompt), then the top keep (past the
/// protected prompt) or every entry scoring >= bound.
inline void select_heads(const HeadSelection& sel, StepContext c, const SegmentedScores& s,
                         std::span<std::uint8_t> keep) {
  std::vector<float> score(s.score.begin(), s.score.end());
  for (std::int64_t h = 0; h < s.segments(); ++h) {
    const auto b = static_cast<std::size_t>(s.offsets[h]);
    const auto n = static_cast<std::size_t>(s.length(h));
    const auto seg = std::span<float>(score).subspan(b, n);
    const auto pos = s.position.subspan(b, n);
    std::int64_t prompt = 0;
    if (sel.keeps_prompt)
      for (std::size_t i = 0; i < n; ++i)
        if (pos[i] < c.prompt) {
          seg[i] = std::numeric_limits<float>::infinity();
          ++prompt;
        }
    rank::protect_window(pos, sel.window, seg);
    rank::protect_sinks(pos, sel.sinks, seg);
    if (sel.guaranteed > 0) raise_best(seg, pos, prompt + sel.guaranteed);
    if (sel.threshold)
      rank::keep_at_least(seg, sel.bound, keep.subspan(b, n));
    else
      rank::keep_top_k(seg, pos, prompt + sel.keep, keep.subspan(b, n));
  }
}

/// A PoolSelection on the host, over the groups of group_heads consecutive segments.
inline void select_pools(const PoolSelection& sel, std::int64_t group_heads, const SegmentedScores& s,
                         std::span<std::uint8_t> keep) {
  auto score = protected_scores(s, sel.window, sel.sinks);
  protect_guaranteed(s, sel.guaranteed, score);
  for (std::int64_t first = 0; first < s.segments(); first += group_heads) {
    const std::int64_t last = first + group_heads;
    const auto b = static_cast<std::size_t>(s.offsets[first]);
    const auto n = static_cast<std::size_t>(s.offsets[last] - s.offsets[first]);
    if (n == 0) continue;
    if (sel.threshold)
      rank::keep_at_least(std::span<const float>(score).subspan(b, n), sel.bound, keep.subspan(b, n));
    else
      select_pooled(s, score, first, last, group_heads * sel.budget, sel.budget, sel.floor_ratio, keep);
  }
}

}  // namespace detail

/// The Evictor's trigger over the per-head lengths (one per (layer, kv head), head_index order):
/// marks in `active` the heads of every group that fires and returns whether any does.
template <Evictor E>
bool trigger_heads(const E& e, const CacheShape& shape, StepContext c, std::span<const std::int64_t> lengths,
             std::span<std::uint8_t> active) {
  if constexpr (evictor_triggers_itself<E>)
    return e.trigger(shape, c, lengths, active);
  else
    return detail::trigger_groups(e, shape, c, lengths, active);
}

/// The Evictor's selection over the active heads' segments: keep[i] = 1 for every survivor.
template <Evictor E>
void select_survivors(const E& e, const CacheShape& shape, StepContext c, const SegmentedScores& scores,
            std::span<std::uint8_t> keep) {
  if constexpr (evictor_selects_itself<E>)
    e.select(shape, c, scores, keep);
  else if constexpr (selects_per_head<E>)
    detail::select_heads(e.selection(), c, scores, keep);
  else
    detail::select_pools(e.selection(), e.group_heads(shape), scores, keep);
}

}  // namespace kvpolicy::evict
