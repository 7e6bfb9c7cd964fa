/// \file
/// kvpolicy/policy/evict.hpp — Evictors: trigger + selection scope + protection + quotas
/// (SPEC §1 "Trigger and survivors", SPEC §2 "Global trigger and survivors"). An evictor marks
/// survivors; it never moves data. select() here is the host reference every backend must match.
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
#include "kvpolicy/core/mask.hpp"
#include "kvpolicy/policy/rank.hpp"
#include "kvpolicy/policy/selection.hpp"

namespace kvpolicy {

namespace trigger {

/// SPEC §1: a head evicts once its length reaches M + B, and keeps M. Between triggers it holds at
/// most M + B - 1 entries after a decode step.
struct Buffered {
  std::int64_t budget = 1024;  // M, per (layer, kv head)
  std::int64_t buffer = 128;   // B >= 1 (B = 1 evicts every step: a strict budget M)

  void validate(const char* who) const {
    require(budget >= 1, who, ": budget M = ", budget, " must be >= 1");
    require(buffer >= 1, who, ": buffer B = ", buffer, " must be >= 1");
    // a head never holds more than 2^31 - 1 entries (positions are int32), and M + B stays exact
    require(budget <= INT32_MAX - buffer, who, ": budget M = ", budget, " plus buffer B = ", buffer,
            " exceeds 2^31 - 1 entries per head");
  }
  KVPOLICY_HD bool fires(std::int64_t length) const { return length >= budget + buffer; }
};

}  // namespace trigger

namespace evict {

namespace detail {

/// The threshold bound log(alpha) (SPEC §1), formed in double so that an alpha outside fp32's range
/// still gives its finite log.
inline float log_alpha(double alpha) { return static_cast<float>(std::log(alpha)); }

inline void validate_common(const char* who, std::int64_t budget, std::int64_t window, double threshold,
                            std::int64_t sinks = 0) {
  require(window >= 0 && window <= budget, who, ": window w = ", window, " must be in [0, budget M = ", budget, "]");
  require(sinks >= 0 && sinks <= budget - window, who, ": sinks S = ", sinks, " must be in [0, budget M - window w = ",
          budget - window, "]");
  require(threshold == 0.0 || (std::isfinite(threshold) && threshold > 0.0), who, ": threshold alpha = ", threshold,
          " must be > 0 and finite (0 disables the threshold variant)");
}

/// The most entries one (layer, kv head) holds under a per-head budget M with buffer B (SPEC §1):
/// eviction brings a head back to M once it reaches M + B, so between evictions it holds at most
/// M + B - 1, and a step appends up to `largest_chunk` before its trigger runs.
inline std::int64_t per_head_peak(const char* who, std::int64_t budget, std::int64_t buffer, double threshold,
                                  std::int64_t largest_chunk) {
  require(threshold == 0.0, who, ": the threshold variant (alpha = ", threshold,
          ") keeps every entry scoring >= log(alpha): no budget bounds a head, so no pool size follows from "
          "the config; size by the longest sequence (memory::Paged<P>::pages_for)");
  require(budget >= 1 && buffer >= 1 && largest_chunk >= 1, who, ": budget M = ", budget, ", buffer B = ", buffer,
          " and largest_chunk = ", largest_chunk, " must be >= 1");
  return budget + buffer - 1 + largest_chunk;
}

/// A horizon named by the evictor's config (> 0) must be the scorer's (SPEC §2: h of Eq. 9).
template <class Scorer>
void validate_horizon(const char* who, int horizon, const Scorer& s) {
  if constexpr (requires { s.horizon; })
    require(horizon == 0 || s.horizon == horizon, who, ": the config's horizon h = ", horizon,
            " is not the scorer's h = ", s.horizon, " (pass the scorer built from the same config, e.g. dbtrimkv_scorer(c))");
}

inline void validate_floor(const char* who, double floor_ratio, double threshold) {
  require(floor_ratio >= 0.0 && floor_ratio < 1.0, who, ": floor_ratio f = ", floor_ratio, " must be in [0, 1)");
  require(!(floor_ratio > 0.0 && threshold > 0.0), who, ": floor_ratio = ", floor_ratio, " and threshold = ", threshold,
          " are exclusive variants; set one of them");
}

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

/// The PoolSelection of the pooled evictors' config (SPEC §2).
inline PoolSelection pooled(std::int64_t budget, double floor_ratio, std::int64_t window, std::int64_t sinks,
                            double threshold) {
  PoolSelection sel;
  sel.budget = budget;
  sel.floor_ratio = floor_ratio;
  sel.window = window;
  sel.sinks = sinks;
  sel.threshold = threshold > 0.0;
  sel.bound = sel.threshold ? log_alpha(threshold) : 0.0f;
  return sel;
}

/// The trigger of a stated rule (policy/selection.hpp) on the host: the heads in groups of
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
/// protected, then the top keep (past the protected prompt) or every entry scoring >= bound.
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
    if (sel.threshold)
      rank::keep_at_least(seg, sel.bound, keep.subspan(b, n));
    else
      rank::keep_top_k(seg, pos, prompt + sel.keep, keep.subspan(b, n));
  }
}

/// A PoolSelection on the host, over the groups of group_heads consecutive segments.
inline void select_pools(const PoolSelection& sel, std::int64_t group_heads, const SegmentedScores& s,
                         std::span<std::uint8_t> keep) {
  const auto score = protected_scores(s, sel.window, sel.sinks);
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

/// Per (layer, kv head) eviction — TRIM-KV, SPEC §1. Each head triggers on its own length; a
/// triggered head keeps its top M (or, with threshold alpha > 0, every entry scoring >= log alpha).
template <class Trigger = trigger::Buffered>
struct PerHead {
  Trigger rule{};
  std::int64_t window = 0;  // sliding-window protection w (SPEC §1), default 0
  double threshold = 0.0;   // alpha; 0 = top-M selection
  std::int64_t sinks = 0;   // sink protection S: the S oldest entries of a head stay (SPEC §5)

  std::int64_t budget() const { return rule.budget; }
  std::int64_t buffer() const { return rule.buffer; }

  void validate(const CacheShape& shape) const {
    shape.validate();
    rule.validate("evict::PerHead");
    detail::validate_common("evict::PerHead", rule.budget, window, threshold, sinks);
  }
  // the rule, stated once (policy/selection.hpp)
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext) const { return rule.fires(length); }
  HeadSelection head_selection() const {
    HeadSelection sel;
    sel.keep = rule.budget;
    sel.threshold = threshold > 0.0;
    sel.bound = sel.threshold ? detail::log_alpha(threshold) : 0.0f;
    sel.window = window;
    sel.sinks = sinks;
    return sel;
  }

  bool trigger(const CacheShape& shape, std::span<const std::int64_t> lengths, std::span<std::uint8_t> active) const {
    return detail::trigger_groups(*this, shape, {}, lengths, active);
  }
  void select(const CacheShape&, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    detail::select_heads(head_selection(), {}, s, keep);
  }
};

/// Layer-wise pooled eviction — SPEC §2 "layer-wise variant": a layer triggers when its total
/// exceeds Hkv * (M + B) (strictly) and keeps the top Hkv * M of the layer.
struct LayerWise {
  std::int64_t budget = 1024;  // M per (layer, kv head)
  std::int64_t buffer = 128;
  std::int64_t window = 0;
  double threshold = 0.0;
  double floor_ratio = 0.0;  // the global rule's quotas, applied within each layer
  std::int64_t sinks = 0;    // S oldest entries of each head protected (SPEC §5)
  /// The lookahead horizon the policy's config named (0: none named). A config's horizon belongs to
  /// the scorer; the Cache checks at construction that its scorer has it, so a horizon given only to
  /// the evictor's factory is an error, not silently the scorer's default.
  int horizon = 0;

  void validate(const CacheShape& shape) const {
    shape.validate();
    trigger::Buffered{budget, buffer}.validate("evict::LayerWise");
    detail::validate_common("evict::LayerWise", budget, window, threshold, sinks);
    detail::validate_floor("evict::LayerWise", floor_ratio, threshold);
  }
  template <class Scorer>
  void validate_scorer(const Scorer& s) const {
    detail::validate_horizon("evict::LayerWise", horizon, s);
  }
  // the rule, stated once (policy/selection.hpp): a layer's heads trigger and rank together
  std::int64_t group_heads(const CacheShape& shape) const { return shape.kv_heads; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t heads, StepContext) const {
    return length > heads * (budget + buffer);
  }
  PoolSelection pool_selection() const { return detail::pooled(budget, floor_ratio, window, sinks, threshold); }

  bool trigger(const CacheShape& shape, std::span<const std::int64_t> lengths, std::span<std::uint8_t> active) const {
    return detail::trigger_groups(*this, shape, {}, lengths, active);
  }
  void select(const CacheShape& shape, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    detail::select_pools(pool_selection(), group_heads(shape), s, keep);
  }
};

/// Global eviction over every layer and head of a sequence — DBTrimKV, SPEC §2: triggers when the
/// sequence's total reaches L * Hkv * (M + B); keeps the top L * Hkv * M, with optional floor_ratio
/// quotas or the threshold variant.
struct Global {
  std::int64_t budget = 1024;  // M per (layer, kv head); M_global = L * Hkv * M
  std::int64_t buffer = 128;
  double floor_ratio = 0.0;    // f in [0, 1)
  std::int64_t window = 0;
  double threshold = 0.0;
  std::int64_t sinks = 0;      // S oldest entries of each head protected (SPEC §5)
  /// The lookahead horizon the policy's config named (0: none named). A config's horizon belongs to
  /// the scorer; the Cache checks at construction that its scorer has it, so a horizon given only to
  /// the evictor's factory is an error, not silently the scorer's default.
  int horizon = 0;

  void validate(const CacheShape& shape) const {
    shape.validate();
    trigger::Buffered{budget, buffer}.validate("evict::Global");
    detail::validate_common("evict::Global", budget, window, threshold, sinks);
    detail::validate_floor("evict::Global", floor_ratio, threshold);
  }
  template <class Scorer>
  void validate_scorer(const Scorer& s) const {
    detail::validate_horizon("evict::Global", horizon, s);
  }
  // the rule, stated once (policy/selection.hpp): every head of the sequence triggers and ranks together
  std::int64_t group_heads(const CacheShape& shape) const { return shape.heads_total(); }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t heads, StepContext) const {
    return length >= heads * (budget + buffer);
  }
  PoolSelection pool_selection() const { return detail::pooled(budget, floor_ratio, window, sinks, threshold); }

  bool trigger(const CacheShape& shape, std::span<const std::int64_t> lengths, std::span<std::uint8_t> active) const {
    return detail::trigger_groups(*this, shape, {}, lengths, active);
  }
  void select(const CacheShape& shape, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    detail::select_pools(pool_selection(), group_heads(shape), s, keep);
  }
};

/// EpiKV and the KV statistics, SPEC §4, per (layer, kv head): a budget K over the head's generated
/// entries (positions >= the prompt, StepContext::prompt). Every prompt entry is kept; so are the
/// R = min(128, K / 4) newest generated ones. A head whose generated entries exceed K drops its
/// lowest-scoring other generated entries down to K: one per decode step. The trigger counts the
/// generated entries as length - prompt, exact when every prompt token was stored (admit::All).
/// SPEC §5's protection for every evictor: the S oldest entries (sinks) and the w newest (window)
/// of a head also rank above every score, within the prompt + K it keeps (a policy run without a
/// prompt otherwise may drop token 0, the attention sink).
struct Generated {
  static constexpr bool counts_prompt_by_length = true;  // so it composes with admit::All only
  std::int64_t budget = 2048;  // K
  std::int64_t recency = -1;   // R; -1 = min(128, K / 4)
  std::int64_t sinks = 0;      // S oldest entries of each head protected (SPEC §5)
  std::int64_t window = 0;     // w newest entries of each head protected (SPEC §5), beside the R newest

  std::int64_t recent() const { return recency >= 0 ? recency : std::min<std::int64_t>(128, budget / 4); }

  void validate(const CacheShape& shape) const {
    shape.validate();
    require(budget >= 1 && budget <= INT32_MAX, "evict::Generated: budget K = ", budget, " must be in [1, 2^31 - 1]");
    require(recency >= -1 && recency <= budget, "evict::Generated: recency R = ", recency,
            " must be -1 (min(128, K/4)) or in [0, budget K = ", budget, "]");
    require(window >= 0 && window <= budget, "evict::Generated: window w = ", window, " must be in [0, budget K = ",
            budget, "]");
    const std::int64_t recent_max = std::max(recent(), window);
    require(sinks >= 0 && sinks <= budget - recent_max, "evict::Generated: sinks S = ", sinks,
            " must be in [0, budget K - max(R, w) = ", budget - recent_max, "]");
  }
  // the rule, stated once (policy/selection.hpp). The R newest entries are generated ones whenever
  // more than K >= R of them are present; with K or fewer the head keeps everything anyway.
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext c) const { return length - c.prompt > budget; }
  HeadSelection head_selection() const {
    HeadSelection sel;
    sel.keep = budget;
    sel.window = std::max(recent(), window);
    sel.sinks = sinks;
    sel.keeps_prompt = true;
    return sel;
  }

  bool trigger(const CacheShape& shape, StepContext c, std::span<const std::int64_t> lengths,
               std::span<std::uint8_t> active) const {
    return detail::trigger_groups(*this, shape, c, lengths, active);
  }
  void select(const CacheShape&, StepContext c, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    detail::select_heads(head_selection(), c, s, keep);
  }
};

/// WG-KV's dual cache (SPEC §3) as a rule on a head's entries, with g, the write-gate value, as the
/// entry's frozen score: a head keeps its W_local newest entries (the local ring) and, of the older
/// ones, those with g >= tau (the global cache); any other leaves for good. Run after every step,
/// this keeps exactly what the ring with lazy promotion keeps: on decode the token the ring
/// displaces is promoted iff g >= tau; on a prefill of T tokens the last min(T, W_local) stay local
/// and each earlier one is kept iff g >= tau. attention_mask() gives the attention the matching
/// vertical-slash mask (core/mask.hpp), so a query never sees a token its ring has displaced.
/// Cost per step: one pass over the metadata of the heads longer than W_local.
/// Sinks (SPEC §5): the S oldest entries of a head stay whatever their g, and the mask shows them.
/// Its window is the ring.
struct WriteGated {
  std::int64_t local = 256;  // W_local
  double tau = 0.1;          // admission threshold
  std::int64_t sinks = 0;    // S oldest entries (positions 0..S-1: every token enters the ring) kept

  AttentionMask attention_mask() const { return {local, static_cast<float>(tau), GateField::write_score, sinks}; }

  void validate(const CacheShape& shape) const {
    shape.validate();
    require(local >= 1 && local <= INT32_MAX, "evict::WriteGated: W_local = ", local, " must be in [1, 2^31 - 1]");
    require(std::isfinite(tau) && tau > 0.0 && tau <= 1.0, "evict::WriteGated: tau = ", tau, " must be in (0, 1]");
    require(sinks >= 0 && sinks <= INT32_MAX, "evict::WriteGated: sinks S = ", sinks, " must be in [0, 2^31 - 1]");
  }
  // the rule, stated once (policy/selection.hpp): a head past its ring keeps the ring (its
  // W_local newest), its sinks, and the older entries promoted (g >= tau)
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext) const { return length > local; }
  HeadSelection head_selection() const {
    HeadSelection sel;
    sel.threshold = true;
    sel.bound = static_cast<float>(tau);
    sel.window = local;
    sel.sinks = sinks;
    return sel;
  }

  bool trigger(const CacheShape& shape, std::span<const std::int64_t> lengths, std::span<std::uint8_t> active) const {
    return detail::trigger_groups(*this, shape, {}, lengths, active);
  }
  void select(const CacheShape&, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    detail::select_heads(head_selection(), {}, s, keep);
  }
};

/// WG-KV's admission under a hard budget (SPEC §3 "Admission with eviction", as the authors' code
/// runs appendix K), with score::GatedObservedAttention: every step, each head keeps its W_local
/// newest entries (the ring) and drops the older ones its gate refused (scored -inf), as
/// evict::WriteGated; and when the sum over the sequence's heads of their global-cache lengths (the
/// entries outside the ring; the rings are not counted) exceeds budget_entries = L * Hkv * M_avg,
/// each head also drops floor(fraction * its global length) of its global entries (a head where
/// that is 0 drops none), the lowest by score, ties going to the newer entry. Sinks (SPEC §5): the
/// S oldest entries stay whatever their g and are never dropped; outside the ring they are part of
/// the global cache and count in its length.
struct WriteGatedBudget {
  std::int64_t local = 256;         // W_local
  double tau = 0.1;                 // for the attention mask; the scorer applies it to the ranking
  std::int64_t budget_entries = 0;  // L * Hkv * M_avg; 0 = no budget
  double fraction = 0.1;
  std::int64_t sinks = 0;           // S oldest entries kept (SPEC §5)

  AttentionMask attention_mask() const { return {local, static_cast<float>(tau), GateField::write_score, sinks}; }

  void validate(const CacheShape& shape) const {
    WriteGated{local, tau, sinks}.validate(shape);
    require(budget_entries >= 0, "evict::WriteGatedBudget: budget = ", budget_entries, " must be >= 0 (0: none)");
    require(fraction > 0.0 && fraction <= 1.0, "evict::WriteGatedBudget: fraction = ", fraction, " must be in (0, 1]");
  }
  /// The scorer must draw the same ring, gate, budget and sinks (the Cache calls this at construction).
  template <class Scorer>
  void validate_scorer(const Scorer& s) const {
    if constexpr (requires { s.local; s.tau; s.budget_entries; s.sinks; })
      require(s.local == local && s.tau == tau && s.budget_entries == budget_entries && s.sinks == sinks,
              "evict::WriteGatedBudget: the scorer's W_local = ", s.local, ", tau = ", s.tau, ", budget = ",
              s.budget_entries, ", sinks = ", s.sinks, " differ from the evictor's ", local, ", ", tau, ", ",
              budget_entries, ", ", sinks);
  }
  // its trigger, stated as the others' (only a head past its ring has a global cache); its
  // selection weighs every head's global cache against one budget, so it runs on the host only
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext) const { return length > local; }
  bool trigger(const CacheShape& shape, StepContext c, std::span<const std::int64_t> lengths,
               std::span<std::uint8_t> active) const {
    return detail::trigger_groups(*this, shape, c, lengths, active);
  }
  void select(const CacheShape&, StepContext, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    std::vector<float> score(s.score.begin(), s.score.end());
    const auto heads = static_cast<std::size_t>(s.segments());
    std::vector<std::int64_t> held(heads), droppable(heads), global(heads);
    std::int64_t global_total = 0;  // the sequence's global cache: every head is here that has one
    for (std::int64_t h = 0; h < s.segments(); ++h) {
      const auto b = static_cast<std::size_t>(s.offsets[h]);
      const auto n = static_cast<std::size_t>(s.length(h));
      const auto seg = std::span<float>(score).subspan(b, n);
      rank::protect_window(s.position.subspan(b, n), local, seg);  // the ring
      rank::protect_sinks(s.position.subspan(b, n), sinks, seg);
      const auto i = static_cast<std::size_t>(h);
      for (const float v : seg) {  // protected (+inf), admitted global entries (finite), refused (-inf)
        held[i] += v != -std::numeric_limits<float>::infinity();
        droppable[i] += std::isfinite(v);
      }
      global[i] = held[i] - std::min<std::int64_t>(local, static_cast<std::int64_t>(n));
      global_total += global[i];
    }
    const bool pressure = budget_entries > 0 && global_total > budget_entries;
    for (std::int64_t h = 0; h < s.segments(); ++h) {
      const auto i = static_cast<std::size_t>(h);
      const auto b = static_cast<std::size_t>(s.offsets[h]);
      const auto n = static_cast<std::size_t>(s.length(h));
      const auto drop = pressure ? std::min(droppable[i], static_cast<std::int64_t>(std::floor(
                                                              fraction * static_cast<double>(global[i]))))
                                 : 0;
      rank::keep_top_k(std::span<const float>(score).subspan(b, n), s.position.subspan(b, n), held[i] - drop,
                       keep.subspan(b, n));
    }
  }
};

/// SnapKV, SPEC §5: once, when the step that reaches the prompt length the engine declared commits
/// (StepContext::prompt_ends), every head longer than M keeps its W_obs newest entries (the
/// observation window) and its best M - W_obs others. Decode tokens are never evicted (SnapKV
/// compresses the prompt); a sequence whose prompt length was not declared is never compressed.
/// Sinks (SPEC §5): the S oldest entries of a head are kept too, within M.
struct PromptEnd {
  std::int64_t budget = 1024;  // M per (layer, kv head)
  std::int64_t window = 32;    // W_obs, the protected window
  std::int64_t sinks = 0;      // S oldest entries of each head protected

  void validate(const CacheShape& shape) const {
    shape.validate();
    require(budget >= 1 && budget <= INT32_MAX, "evict::PromptEnd: budget M = ", budget, " must be in [1, 2^31 - 1]");
    require(window >= 0 && window <= budget, "evict::PromptEnd: window W_obs = ", window, " must be in [0, budget M = ",
            budget, "]");
    require(sinks >= 0 && sinks <= budget - window, "evict::PromptEnd: sinks S = ", sinks,
            " must be in [0, budget M - W_obs = ", budget - window, "]");
  }
  // the rule, stated once (policy/selection.hpp)
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext c) const {
    return c.prompt_ends && length > budget;
  }
  HeadSelection head_selection() const {
    HeadSelection sel;
    sel.keep = budget;
    sel.window = window;
    sel.sinks = sinks;
    return sel;
  }

  bool trigger(const CacheShape& shape, StepContext c, std::span<const std::int64_t> lengths,
               std::span<std::uint8_t> active) const {
    return detail::trigger_groups(*this, shape, c, lengths, active);
  }
  void select(const CacheShape&, StepContext c, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    detail::select_heads(head_selection(), c, s, keep);
  }
};

static_assert(Evictor<PerHead<>>, "evict::PerHead must model kvpolicy::Evictor");
static_assert(Evictor<LayerWise>, "evict::LayerWise must model kvpolicy::Evictor");
static_assert(Evictor<Global>, "evict::Global must model kvpolicy::Evictor");
static_assert(Evictor<Generated>, "evict::Generated must model kvpolicy::Evictor");
static_assert(Evictor<WriteGated>, "evict::WriteGated must model kvpolicy::Evictor");
static_assert(Evictor<PromptEnd>, "evict::PromptEnd must model kvpolicy::Evictor");
static_assert(Evictor<WriteGatedBudget>, "evict::WriteGatedBudget must model kvpolicy::Evictor");
static_assert(StatedEvictor<PerHead<>> && StatedEvictor<LayerWise> && StatedEvictor<Global> &&
                  StatedEvictor<Generated> && StatedEvictor<WriteGated> && StatedEvictor<PromptEnd>,
              "the per-head and pooled evictors state their rule as data (policy/selection.hpp)");

}  // namespace evict
}  // namespace kvpolicy
