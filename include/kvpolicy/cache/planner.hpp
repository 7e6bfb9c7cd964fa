/// \file
/// kvpolicy/cache/planner.hpp — the eviction planner, one for both backends: plan_evictions runs
/// the plan's skeleton (SPEC §1–2: the per-head lengths, the trigger, the scoring of the active
/// heads at step n, the selection; SPEC §3: an Admitter's ring departs first) over the primitives a
/// backend's executor gives — the host's here (HostPlanner), the device's in cuda/executor.cuh —
/// calling the Evictor only through its hooks (cache/evictor_hooks.hpp). A plan reads the cache
/// and changes nothing; the Cache applies it (compaction) only once every plan of a step or a batch
/// is made, so a plan that fails (a NaN score) leaves every step open and the cache as it was. The
/// Scorer's record and scoring come through the hooks it declares (cache/scorer_records.hpp), the trigger and
/// selection through the rule the Evictor states (core/rule.hpp, run by parts/evict/selection.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/cache/evictor_hooks.hpp"
#include "kvpolicy/cache/scorer_records.hpp"

namespace kvpolicy::detail {

/// A NaN a Scorer returned (only a user-defined Scorer can make one: the built-in scorers are
/// finite or -inf on every input append accepts, docs/numerics.md), where the backend found it.
struct NanScore {
  std::size_t request = 0;         // which of the plan's requests
  std::int64_t head = 0;           // head_index(shape, layer, kv head)
  std::optional<EntryMeta> entry;  // the entry, where the backend knows which one
};

/// The plan of the evictions of the sequences whose steps close together (`requests`, each with
/// .seq and .context, its step committed), for the Evictor `e` of a Cache of shape `shape`, over
/// the primitives of the backend's executor x:
///
///   x.seen_lengths(p, r)              starts r's plan in p; per head (head_index order), the entries
///                                     the Evictor sees: the stored ones less an Admitter's ring
///                                     departures (SPEC §3)
///   x.seen_entries(p, i, active)      the metadata of the entries the Evictor sees in request i's
///                                     active heads, in stored order (only for an Evictor that tells
///                                     binding)
///   x.triggered(p, i, ctx, fires, active)   request i's context and trigger, as decided here
///   x.stage(p) -> bool                whether anything is to be removed (else p is complete)
///   x.score(p, requests) -> optional<NanScore>   scores every active head of every request
///   x.select(p)                       EvictorHooks::select over each fired request's scores
///
/// Changes nothing; a NaN score is an error, never a ranking input, and throws here.
template <Evictor E, class X, class Request>
typename X::Plan plan_evictions(const CacheShape& shape, const E& e, X& x, std::span<const Request> requests) {
  using hooks = EvictorHooks<E>;
  typename X::Plan p;
  bool any_fires = false;  // the same on every rank (the trigger is), unlike a ring's departures
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const std::vector<std::int64_t> lengths = x.seen_lengths(p, requests[i]);
    StepContext ctx = requests[i].context;
    for (const std::int64_t len : lengths) ctx.entries += len;
    ctx = hooks::shared_context(e, ctx);  // a rank's share: the sequence over every rank
    std::vector<std::uint8_t> active(lengths.size(), 0);
    const bool fires = hooks::trigger(e, shape, ctx, lengths, active);
    if (!fires) std::fill(active.begin(), active.end(), std::uint8_t{0});
    any_fires = any_fires || fires;
    if constexpr (hooks::tells_binding)
      if (fires) {  // before the scoring: a budget that keeps every entry needs no score (StepContext::budget_binds)
        std::vector<std::int64_t> offsets(lengths.size() + 1, 0);
        for (std::size_t h = 0; h < lengths.size(); ++h) offsets[h + 1] = offsets[h] + (active[h] ? lengths[h] : 0);
        ctx.budget_binds = hooks::budget_binds(e, ctx, x.seen_entries(p, i, active), offsets);
      }
    x.triggered(p, i, ctx, fires, std::move(active));
  }
  if (!x.stage(p)) return p;
  const auto score = [&] {
    const std::optional<NanScore> nan = x.score(p, requests);
    if (!nan) return;
    const Request& r = requests[nan->request];
    const std::int64_t n = p.context(nan->request).n;
    const std::int64_t layer = nan->head / shape.kv_heads, head = nan->head % shape.kv_heads;
    if (nan->entry)
      fail("Cache::commit: the scorer returned NaN for sequence ", r.seq, " layer ", layer, " head ", head,
           " position ", nan->entry->position, " (write score ", nan->entry->write_score, ", key norm ",
           nan->entry->key_norm, ", attention mass ", nan->entry->attention_mass, ", n = ", n,
           "); a NaN score never enters a ranking");
    fail("Cache::commit: the scorer returned NaN for sequence ", r.seq, " layer ", layer, " head ", head, " (n = ", n,
         "); a NaN score never enters a ranking");
  };
  // Only the heads that fired are scored. Where any did, the ranks agree on the scoring of the
  // whole batch: a refusal on any rank is every rank's (dist/sharded.hpp), before the selection's
  // collectives.
  if (any_fires) hooks::agree_on(e, score);
  x.select(p);
  return p;
}

/// One sequence's eviction decided on the host but not applied: the touched heads' flattened keep
/// flags (what cpu::Executor::apply compacts by).
struct EvictionPlan {
  StepContext context{};
  bool triggered = false;    // the Evictor's trigger fired (what EvictionReport::triggered reports)
  bool removes_any = false;  // something to apply: the Evictor fired, or an Admitter's ring drops entries
  std::vector<std::int64_t> lengths, offsets;
  std::vector<std::uint8_t> active, keep;
  std::vector<std::int32_t> position;
  std::int64_t evicted = 0;  // entries the plan removes
};

/// The host's plans of the sequences whose steps close together, one per request, in order.
struct HostPlan {
  std::vector<std::int64_t> seqs;
  std::vector<EvictionPlan> plans;
  StepContext context(std::size_t i) const { return plans[i].context; }
};

/// The host's planner primitives (plan_evictions) over one Cache's shape, allocator and policies,
/// read only. Per request it keeps, while planning, what the Evictor sees of each head (the ring's
/// survivors) and the scores of the heads that fire.
template <Scorer S, Admitter A, Evictor E, class Alloc>
class HostPlanner {
 public:
  using Plan = HostPlan;

  /// `engine_keys`: where the engine keeps the keys of a pool that holds none (engine-owned K/V,
  /// SPEC §9), for a Scorer that reads keys; else nullptr.
  HostPlanner(const CacheShape& shape, const Alloc& alloc, const E& evictor, const S& scorer, const A& admitter,
              const EngineKeys* engine_keys = nullptr)
      : shape_(shape), alloc_(alloc), evictor_(evictor), scorer_(scorer), admitter_(admitter), engine_keys_(engine_keys) {}

  /// Every request's plan (SPEC §1–3). Changes nothing.
  template <class Request>
  Plan plan(std::span<const Request> requests) {
    working_.clear();
    return plan_evictions(shape_, evictor_, *this, requests);
  }

  // ---- the primitives plan_evictions calls --------------------------------------------------------
  template <class Request>
  std::vector<std::int64_t> seen_lengths(Plan& p, const Request& r) {
    p.seqs.push_back(r.seq);
    EvictionPlan& made = p.plans.emplace_back();
    Working& w = working_.emplace_back();
    const auto heads = static_cast<std::size_t>(shape_.heads_total());
    made.lengths.resize(heads);
    for (int l = 0; l < shape_.layers; ++l)
      for (int h = 0; h < shape_.kv_heads; ++h)
        made.lengths[static_cast<std::size_t>(head_index(shape_, l, h))] = alloc_.length(r.seq, l, h);
    w.seen = made.lengths;
    w.ring_drops = ring_survivors(r.seq, r.context.n, w.ring_kept) > 0;
    if (w.ring_drops)
      for (std::size_t i = 0; i < heads; ++i)
        if (!w.ring_kept[i].empty())
          w.seen[i] = std::count(w.ring_kept[i].begin(), w.ring_kept[i].end(), std::uint8_t{1});
    return w.seen;
  }
  /// The active heads' entries as the Evictor sees them (what a binding budget weighs).
  std::vector<EntryMeta> seen_entries(const Plan& p, std::size_t i, std::span<const std::uint8_t> active) const {
    std::vector<EntryMeta> meta;
    for (int l = 0; l < shape_.layers; ++l)
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const auto k = static_cast<std::size_t>(head_index(shape_, l, h));
        if (!active[k]) continue;
        const auto head_layout = alloc_.layout(p.seqs[i], l, h);
        for (std::int64_t j = 0; j < head_layout.length; ++j)
          if (sees(i, k, j)) meta.push_back(alloc_.pool().meta(head_layout.slot(j)));
      }
    return meta;
  }
  void triggered(Plan& p, std::size_t i, StepContext ctx, bool fires, std::vector<std::uint8_t> active) {
    EvictionPlan& made = p.plans[i];
    made.context = ctx;
    made.triggered = fires;
    made.removes_any = fires || working_[i].ring_drops || ctx.probe > 0;  // a probe's entries always leave
    made.active = std::move(active);
  }
  /// The active heads' score segments, sized.
  bool stage(Plan& p) {
    bool any = false;
    for (std::size_t i = 0; i < p.plans.size(); ++i) {
      const EvictionPlan& made = p.plans[i];
      Working& w = working_[i];
      any = any || made.removes_any;
      w.offsets.assign(made.active.size() + 1, 0);
      for (std::size_t h = 0; h < made.active.size(); ++h)
        w.offsets[h + 1] = w.offsets[h] + (made.active[h] ? w.seen[h] : 0);
      w.score.assign(static_cast<std::size_t>(w.offsets.back()), 0.0f);
      w.position.assign(w.score.size(), 0);
    }
    return any;
  }
  /// Every active head's entries as the Evictor sees them, scored at its sequence's context (one
  /// head at a time: ScorerRecords' gathering scratch serves every head).
  template <class Request>
  std::optional<NanScore> score(Plan& p, std::span<const Request> requests) {
    ScorerRecords<S> records;
    std::vector<std::int64_t> stored;  // the head's entries the Evictor sees, as stored indices
    for (std::size_t i = 0; i < p.plans.size(); ++i) {
      const EvictionPlan& made = p.plans[i];
      Working& w = working_[i];
      for (int l = 0; l < shape_.layers; ++l)
        for (int h = 0; h < shape_.kv_heads; ++h) {
          const auto k = static_cast<std::size_t>(head_index(shape_, l, h));
          if (!made.active[k]) continue;
          StepContext head_ctx = made.context;  // the context this head is scored in (StepContext::head)
          head_ctx.head = static_cast<std::int64_t>(k);
          const auto head_layout = alloc_.layout(p.seqs[i], l, h);
          stored.clear();
          for (std::int64_t j = 0; j < head_layout.length; ++j)
            if (sees(i, k, j)) stored.push_back(j);
          const auto b = static_cast<std::size_t>(w.offsets[k]);
          const auto meta_of = [&](std::size_t j) -> const EntryMeta& {
            return alloc_.pool().meta(head_layout.slot(stored[j]));
          };
          for (std::size_t j = 0; j < stored.size(); ++j) w.position[b + j] = meta_of(j).position;
          records.score_head(scorer_, *requests[i].records, alloc_.pool(), head_layout, stored, l, h, shape_.group(),
                            head_ctx, std::span<float>(w.score).subspan(b, stored.size()), engine_keys_, p.seqs[i]);
          for (std::size_t j = 0; j < stored.size(); ++j)
            if (std::isnan(w.score[b + j])) return NanScore{i, static_cast<std::int64_t>(k), meta_of(j)};
        }
    }
    return std::nullopt;
  }
  /// Each fired request's selection, then its keep flags over every stored entry of the heads
  /// either the Evictor or an Admitter's ring touched.
  void select(Plan& p) {
    for (std::size_t i = 0; i < p.plans.size(); ++i) {
      EvictionPlan& made = p.plans[i];
      Working& w = working_[i];
      if (!made.removes_any) continue;
      std::vector<std::uint8_t> keep(w.score.size(), 1);
      if (made.triggered)
        EvictorHooks<E>::select(evictor_, shape_, made.context, SegmentedScores{w.score, w.position, w.offsets}, keep);
      if (made.context.probe > 0) {
        release_probe(p.seqs[i], made, w, keep);
      } else if (!w.ring_drops) {
        made.offsets = std::move(w.offsets);
        made.keep = std::move(keep);
        made.position = std::move(w.position);
      } else {
        merge_ring(p.seqs[i], made, w, keep);
      }
      for (const std::uint8_t k : made.keep) made.evicted += k == 0;
    }
  }

  /// The ring of an Admitter with one (WG-KV, SPEC §3): per head, the stored entries that stay —
  /// all but the Admission::local ones older than the W_local newest tokens of the sequence
  /// (position < n - W_local), which no later query may see (the vertical-slash mask). By position,
  /// not by rank among what is stored, so entries the Evictor removed never keep an unadmitted one
  /// alive. Empty for a head that drops none. Returns the entries dropped over every head.
  std::int64_t ring_survivors(std::int64_t seq, std::int64_t n, std::vector<std::vector<std::uint8_t>>& kept) const {
    std::int64_t dropped_total = 0;
    if constexpr (admitter_has_ring<A>) {
      const std::int64_t oldest_in_ring = n - static_cast<std::int64_t>(admitter_.ring());
      kept.assign(static_cast<std::size_t>(shape_.heads_total()), {});
      for (int l = 0; l < shape_.layers; ++l)
        for (int h = 0; h < shape_.kv_heads; ++h) {
          const auto i = static_cast<std::size_t>(head_index(shape_, l, h));
          const auto head_layout = alloc_.layout(seq, l, h);
          std::vector<std::uint8_t> keep;
          for (std::int64_t j = 0; j < head_layout.length; ++j) {
            const EntryMeta& m = alloc_.pool().meta(head_layout.slot(j));
            if (m.position >= oldest_in_ring || admitter_.admit(m) != Admission::local) continue;
            if (keep.empty()) keep.assign(static_cast<std::size_t>(head_layout.length), 1);
            keep[static_cast<std::size_t>(j)] = 0;
            ++dropped_total;
          }
          kept[i] = std::move(keep);
        }
    }
    return dropped_total;
  }

 private:
  /// What one request's plan holds while it is made.
  struct Working {
    std::vector<std::int64_t> seen;                    // per head: the entries the Evictor sees
    std::vector<std::vector<std::uint8_t>> ring_kept;  // per head; empty: the ring drops nothing there
    bool ring_drops = false;
    std::vector<std::int64_t> offsets;                 // the active heads' score segments
    std::vector<float> score;
    std::vector<std::int32_t> position;
  };

  /// Whether the Evictor sees stored entry j of head k of request i (the ring has not dropped it).
  bool sees(std::size_t i, std::size_t k, std::int64_t j) const {
    const Working& w = working_[i];
    return w.ring_kept.empty() || w.ring_kept[k].empty() || w.ring_kept[k][static_cast<std::size_t>(j)];
  }

  /// The keep flags over every stored entry of the heads either part touched: the ring's
  /// departures, and the Evictor's flags (`keep`, over what it saw) on the rest.
  void merge_ring(std::int64_t seq, EvictionPlan& made, const Working& w, const std::vector<std::uint8_t>& keep) const {
    const auto heads = made.active.size();
    made.offsets.assign(heads + 1, 0);
    for (std::size_t i = 0; i < heads; ++i) {
      const bool touched = made.active[i] || !w.ring_kept[i].empty();
      made.offsets[i + 1] = made.offsets[i] + (touched ? made.lengths[i] : 0);
    }
    made.keep.assign(static_cast<std::size_t>(made.offsets.back()), 1);
    made.position.assign(made.keep.size(), 0);
    for (int l = 0; l < shape_.layers; ++l)
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const auto i = static_cast<std::size_t>(head_index(shape_, l, h));
        if (made.offsets[i + 1] == made.offsets[i]) continue;
        const auto head_layout = alloc_.layout(seq, l, h);
        std::int64_t seen = 0;  // rank among the Evictor's entries of this head
        for (std::int64_t j = 0; j < made.lengths[i]; ++j) {
          const auto at = static_cast<std::size_t>(made.offsets[i] + j);
          made.position[at] = alloc_.pool().meta(head_layout.slot(j)).position;
          const bool in_ring = w.ring_kept[i].empty() || w.ring_kept[i][static_cast<std::size_t>(j)];
          std::uint8_t k = in_ring ? 1 : 0;
          if (in_ring && made.active[i]) k = keep[static_cast<std::size_t>(w.offsets[i] + seen++)];
          made.keep[at] = k;
        }
        made.active[i] = 1;
      }
  }

  /// A probe's commit (SPEC §10): the keep flags over every stored entry of every head, the
  /// Evictor's where it fired (`keep`, over its active heads) and 0 for each of the probe's own
  /// entries (positions n - probe .. n - 1), which leave whatever it chose. A probe never meets an
  /// Admitter's ring (Cache::open_probe), so the Evictor saw every stored entry.
  void release_probe(std::int64_t seq, EvictionPlan& made, const Working& w, const std::vector<std::uint8_t>& keep) const {
    const auto heads = made.active.size();
    const std::int64_t first = made.context.n - made.context.probe;
    made.offsets.assign(heads + 1, 0);
    for (std::size_t i = 0; i < heads; ++i) made.offsets[i + 1] = made.offsets[i] + made.lengths[i];
    made.keep.assign(static_cast<std::size_t>(made.offsets.back()), 1);
    made.position.assign(made.keep.size(), 0);
    for (int l = 0; l < shape_.layers; ++l)
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const auto i = static_cast<std::size_t>(head_index(shape_, l, h));
        const auto head_layout = alloc_.layout(seq, l, h);
        for (std::int64_t j = 0; j < made.lengths[i]; ++j) {
          const auto at = static_cast<std::size_t>(made.offsets[i] + j);
          const std::int32_t position = alloc_.pool().meta(head_layout.slot(j)).position;
          made.position[at] = position;
          if (position >= first)
            made.keep[at] = 0;
          else if (made.active[i])
            made.keep[at] = keep[static_cast<std::size_t>(w.offsets[i] + j)];
        }
        made.active[i] = 1;
      }
  }

  const CacheShape& shape_;
  const Alloc& alloc_;
  const E& evictor_;
  const S& scorer_;
  const A& admitter_;
  const EngineKeys* engine_keys_ = nullptr;
  std::vector<Working> working_;  // per request of the plan being made
};

}  // namespace kvpolicy::detail
