/// \file
/// kvpolicy/parts/evict/evictors.hpp — Evictors: trigger + selection scope + protection + quotas
/// (SPEC §1 "Trigger and survivors", SPEC §2 "Global trigger and survivors"). An evictor marks
/// survivors; it never moves data. Each states its rule as data (core/rule.hpp), which the host
/// (parts/evict/selection.hpp) and the device (cuda/kernels/evict_step.cuh) run.
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
#include "kvpolicy/parts/evict/rank.hpp"
#include "kvpolicy/parts/evict/memory_bound.hpp"
#include "kvpolicy/parts/evict/selection.hpp"

namespace kvpolicy {

namespace trigger {

/// SPEC §1: a head evicts once its length reaches M + B, and keeps M. Between triggers it holds at
/// most M + B - 1 entries after a decode step.
struct Buffered {
  std::int64_t budget = evict::default_budget;  // M, per (layer, kv head)
  std::int64_t buffer = evict::default_buffer;  // B >= 1 (B = 1 evicts every step: a strict budget M)

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

/// The threshold variant's floor (SPEC §1 "min_tokens"): a count, and only beside a threshold (a
/// top-M keeps M already, and DBTrimKV's floor over a top-K is floor_ratio).
inline void validate_min_tokens(const char* who, std::int64_t min_tokens, double threshold) {
  require(min_tokens >= 0, who, ": min_tokens = ", min_tokens, " must be >= 0");
  require(min_tokens == 0 || threshold > 0.0, who, ": min_tokens = ", min_tokens,
          " is the threshold variant's floor per head; set threshold alpha > 0 (--threshold) or min_tokens = 0");
}

inline void validate_floor(const char* who, double floor_ratio, double threshold) {
  require(floor_ratio >= 0.0 && floor_ratio < 1.0, who, ": floor_ratio f = ", floor_ratio, " must be in [0, 1)");
  require(!(floor_ratio > 0.0 && threshold > 0.0), who, ": floor_ratio = ", floor_ratio, " and threshold = ", threshold,
          " are exclusive variants; set one of them");
}

}  // namespace detail

/// Per (layer, kv head) eviction — TRIM-KV, SPEC §1. Each head triggers on its own length and keeps
/// its top M; with threshold alpha > 0 every head runs after every step and keeps each entry scoring
/// >= log alpha, and its min_tokens best whatever their score.
template <class Trigger = trigger::Buffered>
struct PerHead {
  Trigger rule{};
  std::int64_t window = 0;      // sliding-window protection w (SPEC §1), default 0
  double threshold = 0.0;       // alpha; 0 = top-M selection
  std::int64_t sinks = 0;       // sink protection S: the S oldest entries of a head stay (SPEC §5)
  std::int64_t min_tokens = 0;  // the threshold variant's floor per head (SPEC §1)

  std::int64_t budget() const { return rule.budget; }
  std::int64_t buffer() const { return rule.buffer; }

  void validate(const CacheShape& shape) const {
    shape.validate();
    rule.validate("evict::PerHead");
    detail::validate_common("evict::PerHead", rule.budget, window, threshold, sinks);
    detail::validate_min_tokens("evict::PerHead", min_tokens, threshold);
  }
  // the rule, stated once (core/rule.hpp); the threshold variant filters every step (SPEC §1), as
  // the authors' code does after every forward
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext) const {
    return threshold > 0.0 || rule.fires(length);
  }
  /// A head evicts back to M once it reaches M + B, so after a commit it holds at most M + B - 1;
  /// the threshold variant keeps what scores above log alpha, which no budget bounds, and a budget
  /// at the int32 position limit (the full cache's) is never reached.
  std::optional<MemoryBound> memory_bound(const CacheShape& shape) const {
    if constexpr (requires { rule.budget + rule.buffer; }) {
      const std::int64_t held = rule.budget + rule.buffer - 1;
      if (threshold > 0.0 || held >= INT32_MAX - 1) return std::nullopt;
      return MemoryBound{held, shape.heads_total() * held};
    } else {
      return std::nullopt;
    }
  }
  HeadSelection selection() const {
    HeadSelection sel;
    sel.keep = rule.budget;
    sel.threshold = threshold > 0.0;
    sel.bound = sel.threshold ? detail::log_alpha(threshold) : 0.0f;
    sel.window = window;
    sel.sinks = sinks;
    sel.guaranteed = min_tokens;
    return sel;
  }
};

/// Which heads a pooled rule ranks together (SPEC §2), and how its trigger compares.
namespace scope {
/// The layer-wise variant: a layer's Hkv heads; a layer triggers when its total exceeds Hkv * (M + B)
/// (strictly).
struct Layer {
  static constexpr const char* name = "evict::LayerWise";
  static std::int64_t heads(const CacheShape& shape) { return shape.kv_heads; }
  KVPOLICY_HD static bool fires(std::int64_t length, std::int64_t reach) { return length > reach; }
};
/// The global rule: every layer and head of a sequence; it triggers when the total reaches
/// L * Hkv * (M + B).
struct Sequence {
  static constexpr const char* name = "evict::Global";
  static std::int64_t heads(const CacheShape& shape) { return shape.heads_total(); }
  KVPOLICY_HD static bool fires(std::int64_t length, std::int64_t reach) { return length >= reach; }
};
}  // namespace scope

/// Pooled eviction — DBTrimKV, SPEC §2: the heads of a Scope trigger together once their total
/// reaches heads * (M + B) (as the Scope compares) and keep their pooled top heads * M, with
/// optional floor_ratio quotas; or the threshold variant, run after every step, with its floor per
/// head min_tokens. Global is the sequence (M_global = L * Hkv * M), LayerWise a layer.
template <class Scope>
struct Pooled {
  std::int64_t budget = default_budget;  // M per (layer, kv head)
  std::int64_t buffer = default_buffer;
  double floor_ratio = 0.0;    // f in [0, 1)
  std::int64_t window = 0;
  double threshold = 0.0;
  std::int64_t sinks = 0;      // S oldest entries of each head protected (SPEC §5)
  /// The lookahead horizon the policy's config named (0: none named). A config's horizon belongs to
  /// the scorer; the Cache checks at construction that its scorer has it, so a horizon given only to
  /// the evictor's factory is an error, not silently the scorer's default.
  int horizon = 0;
  std::int64_t min_tokens = 0;  // the threshold variant's floor per head (SPEC §2)

  void validate(const CacheShape& shape) const {
    shape.validate();
    trigger::Buffered{budget, buffer}.validate(Scope::name);
    detail::validate_common(Scope::name, budget, window, threshold, sinks);
    detail::validate_floor(Scope::name, floor_ratio, threshold);
    detail::validate_min_tokens(Scope::name, min_tokens, threshold);
  }
  template <class Scorer>
  void validate_scorer(const Scorer& s) const {
    detail::validate_horizon(Scope::name, horizon, s);
  }
  std::int64_t group_heads(const CacheShape& shape) const { return Scope::heads(shape); }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t heads, StepContext) const {
    return threshold > 0.0 || Scope::fires(length, heads * (budget + buffer));
  }
  /// A group of G heads evicts once its total reaches G (M + B) (as the Scope compares), so after a
  /// commit it holds at most that, less one where reaching it fires; one head may hold all of it.
  std::optional<MemoryBound> memory_bound(const CacheShape& shape) const {
    if (threshold > 0.0) return std::nullopt;
    const std::int64_t group = Scope::heads(shape), reach = group * (budget + buffer);
    const std::int64_t held = Scope::fires(reach, reach) ? reach - 1 : reach;
    return MemoryBound{held, shape.heads_total() / group * held};
  }
  PoolSelection selection() const {
    PoolSelection sel;
    sel.budget = budget;
    sel.floor_ratio = floor_ratio;
    sel.window = window;
    sel.sinks = sinks;
    sel.threshold = threshold > 0.0;
    sel.bound = sel.threshold ? detail::log_alpha(threshold) : 0.0f;
    sel.guaranteed = min_tokens;
    return sel;
  }
};
/// DBTrimKV's layer-wise pool: each layer's kv heads share Hkv * M.
using LayerWise = Pooled<scope::Layer>;
/// DBTrimKV's global pool: every layer's and kv head's entries share L * Hkv * M.
using Global = Pooled<scope::Sequence>;

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
  std::int64_t budget = default_budget;  // K
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
  // the rule, stated once (core/rule.hpp). The R newest entries are generated ones whenever
  // more than K >= R of them are present; with K or fewer the head keeps everything anyway.
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext c) const { return length - c.prompt > budget; }
  /// The prompt (here the first step's one token) stays, and K generated entries beside it.
  std::optional<MemoryBound> memory_bound(const CacheShape& shape) const {
    return MemoryBound{budget + 1, shape.heads_total() * (budget + 1)};
  }
  HeadSelection selection() const {
    HeadSelection sel;
    sel.keep = budget;
    sel.window = std::max(recent(), window);
    sel.sinks = sinks;
    sel.keeps_prompt = true;
    return sel;
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
  // the rule, stated once (core/rule.hpp): a head past its ring keeps the ring (its
  // W_local newest), its sinks, and the older entries promoted (g >= tau)
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext) const { return length > local; }
  /// The ring is bounded; the global cache keeps every token with g >= tau.
  std::optional<MemoryBound> memory_bound(const CacheShape&) const { return std::nullopt; }
  HeadSelection selection() const {
    HeadSelection sel;
    sel.threshold = true;
    sel.bound = static_cast<float>(tau);
    sel.window = local;
    sel.sinks = sinks;
    return sel;
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
  // selection weighs every head's global cache against one budget, which no HeadSelection or
  // PoolSelection states: a select() of its own, run on the host only (core/concepts.hpp)
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext) const { return length > local; }
  /// Without a budget the global caches grow. With one (SPEC §3, appendix K): a decode step adds at
  /// most one promoted entry to each head's global cache, and once the global caches pass the budget
  /// a head of at least n = ceil(1 / fraction) global entries drops at least one, so it never grows
  /// under pressure, while one with fewer drops none and stays below n. The heads of n or more
  /// therefore hold no more than the last step without pressure left, which was within the budget:
  /// the global caches hold at most budget + (n - 1) per head, the rings W_local per head beside
  /// them, and one head at most W_local + max(budget, n - 1).
  std::optional<MemoryBound> memory_bound(const CacheShape& shape) const {
    if (budget_entries == 0) return std::nullopt;
    const auto n = static_cast<std::int64_t>(std::ceil(1.0 / fraction));
    return MemoryBound{local + std::max(budget_entries, n - 1), shape.heads_total() * (local + n - 1) + budget_entries};
  }
  void select(const CacheShape&, StepContext c, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    select_within(c, s, keep, [](std::int64_t total) { return total; });
  }
  /// Whether the budget binds this step, from the entries' metadata alone (core/concepts.hpp,
  /// evictor_tells_binding): the global caches' total (global_length per head) above the budget.
  /// When it does not, select() drops no global entry, so their scores decide nothing.
  bool budget_binds(StepContext, std::span<const EntryMeta> meta, std::span<const std::int64_t> offsets) const {
    return budget_entries > 0 && global_total(meta, offsets) > budget_entries;
  }
  /// The global caches' total over the heads meta[offsets[i], offsets[i+1]): per head, its entries
  /// outside the ring (all but the W_local newest by position) that the gate admitted (g >= tau) or
  /// that are among its S oldest (sinks) — what select() counts from the scorer's scores.
  std::int64_t global_total(std::span<const EntryMeta> meta, std::span<const std::int64_t> offsets) const {
    std::int64_t total = 0;
    std::vector<std::int32_t> position;
    for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
      const auto head = meta.subspan(static_cast<std::size_t>(offsets[i]), static_cast<std::size_t>(offsets[i + 1] - offsets[i]));
      const auto n = static_cast<std::int64_t>(head.size());
      if (n <= local) continue;  // all ring
      position.clear();
      for (const EntryMeta& m : head) position.push_back(m.position);
      // positions are unique in a head: the ring is every position >= the (n - W_local)-th smallest
      std::nth_element(position.begin(), position.begin() + (n - local), position.end());
      const std::int32_t ring_from = position[static_cast<std::size_t>(n - local)];
      std::int32_t sinks_below = std::numeric_limits<std::int32_t>::min();  // the S oldest: below this position
      if (sinks > 0) {
        const std::int64_t s = std::min(sinks, n);
        std::nth_element(position.begin(), position.begin() + (s - 1), position.end());
        sinks_below = position[static_cast<std::size_t>(s - 1)] + 1;
      }
      for (const EntryMeta& m : head)
        total += m.position < ring_from && (m.write_score >= static_cast<float>(tau) || m.position < sinks_below);
    }
    return total;
  }
  /// select() with the sequence's global total taken through total_of: the identity here, the sum
  /// over the ranks for a Cache that holds one rank's share of the heads (dist::ShardedWriteGatedBudget).
  template <class Total>
  void select_within(StepContext, const SegmentedScores& s, std::span<std::uint8_t> keep, Total&& total_of) const {
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
    global_total = total_of(global_total);
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
  std::int64_t budget = default_budget;  // M per (layer, kv head)
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
  // the rule, stated once (core/rule.hpp)
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext c) const {
    return c.prompt_ends && length > budget;
  }
  /// The prompt is compressed once; decode tokens stay.
  std::optional<MemoryBound> memory_bound(const CacheShape&) const { return std::nullopt; }
  HeadSelection selection() const {
    HeadSelection sel;
    sel.keep = budget;
    sel.window = window;
    sel.sinks = sinks;
    return sel;
  }
};

static_assert(Evictor<PerHead<>> && Evictor<LayerWise> && Evictor<Global> && Evictor<Generated> &&
                  Evictor<WriteGated> && Evictor<PromptEnd> && Evictor<WriteGatedBudget>,
              "the built-in evictors must model kvpolicy::Evictor");
static_assert(evictor_states_selection<PerHead<>> && evictor_states_selection<LayerWise> &&
                  evictor_states_selection<Global> && evictor_states_selection<Generated> &&
                  evictor_states_selection<WriteGated> && evictor_states_selection<PromptEnd>,
              "the per-head and pooled evictors state their rule as data (core/rule.hpp)");

}  // namespace evict
}  // namespace kvpolicy
