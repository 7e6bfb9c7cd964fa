/// \file
/// kvpolicy/engine/planner.hpp — the eviction planner: turns a sequence's committed step into an
/// EvictionPlan, a value (SPEC §1–2: trigger on the per-head lengths, score the active heads at
/// step n, select; SPEC §3: an Admitter's ring departs first). It reads the cache and changes
/// nothing; the Cache applies a plan (compaction on the CPU) only once every plan of a step or a
/// batch is made, so a plan that fails (a NaN score) leaves every step open and the cache as it
/// was. The Scorer's inputs come through the hooks it declares (engine/scorer_inputs.hpp), the
/// trigger and selection through the rule the Evictor states (core/rule.hpp, run by
/// parts/evict/selection.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/engine/scorer_inputs.hpp"
#include "kvpolicy/parts/evict/selection.hpp"

namespace kvpolicy::detail {

/// One eviction decided but not applied: the touched heads' flattened keep flags.
struct EvictionPlan {
  StepContext context{};
  bool triggered = false;    // the Evictor's trigger fired (what EvictionReport::triggered reports)
  bool removes_any = false;  // something to apply: the Evictor fired, or an Admitter's ring drops entries
  std::vector<std::int64_t> lengths, offsets;
  std::vector<std::uint8_t> active, keep;
  std::vector<std::int32_t> position;
  std::int64_t evicted = 0;  // entries the plan removes
};

/// The planner of one Cache: its shape, allocator and policies, read only.
template <Scorer S, Admitter A, Evictor E, class Alloc>
class EvictionPlanner {
 public:
  EvictionPlanner(const CacheShape& shape, const Alloc& alloc, const E& evictor, const S& scorer, const A& admitter)
      : shape_(shape), alloc_(alloc), evictor_(evictor), scorer_(scorer), admitter_(admitter) {}

  /// SPEC §1–2 for sequence `seq` at `ctx` (its step committed; `recorded`: what its attention
  /// recorded for the Scorer). Changes nothing. A NaN score (only a user-defined Scorer can make one: the built-in scorers are finite
  /// or -inf on every input append accepts, docs/numerics.md) is an error, never a ranking input.
  /// With an Admitter's ring (SPEC §3) the ring's departures go first, and the Evictor triggers on,
  /// scores and selects among what stays.
  EvictionPlan plan(std::int64_t seq, StepContext ctx, const typename ScorerInputs<S>::Sequence& recorded) const {
    const auto heads = static_cast<std::size_t>(shape_.heads_total());
    EvictionPlan made;
    made.lengths.resize(heads);
    for (int l = 0; l < shape_.layers; ++l)
      for (int h = 0; h < shape_.kv_heads; ++h)
        made.lengths[static_cast<std::size_t>(head_index(shape_, l, h))] = alloc_.length(seq, l, h);
    std::vector<std::vector<std::uint8_t>> ring_kept;  // per head; empty: the ring drops nothing there
    std::vector<std::int64_t> lengths = made.lengths;  // what the Evictor sees
    const bool ring_drops = ring_survivors(seq, ctx.n, ring_kept) > 0;
    if (ring_drops)
      for (std::size_t i = 0; i < heads; ++i)
        if (!ring_kept[i].empty())
          lengths[i] = std::count(ring_kept[i].begin(), ring_kept[i].end(), std::uint8_t{1});
    for (const std::int64_t len : lengths) ctx.entries += len;
    if constexpr (evictor_shares_context<E>) ctx = evictor_.shared_context(ctx);  // the sequence over every rank
    made.context = ctx;
    made.active.assign(heads, 0);
    const bool fires = evict::trigger_heads(evictor_, shape_, ctx, lengths, made.active);
    if (!fires && !ring_drops) return made;
    if (!fires) std::fill(made.active.begin(), made.active.end(), std::uint8_t{0});
    made.removes_any = true;
    made.triggered = fires;

    std::vector<std::int64_t> offsets(heads + 1, 0);
    for (std::size_t i = 0; i < heads; ++i) offsets[i + 1] = offsets[i] + (made.active[i] ? lengths[i] : 0);
    if constexpr (evictor_tells_binding<E>)
      if (fires) {  // the active heads' entries as the Evictor sees them; a binding budget needs the scores
        std::vector<EntryMeta> meta;
        meta.reserve(static_cast<std::size_t>(offsets.back()));
        for (int l = 0; l < shape_.layers; ++l)
          for (int h = 0; h < shape_.kv_heads; ++h) {
            const auto i = static_cast<std::size_t>(head_index(shape_, l, h));
            if (!made.active[i]) continue;
            const auto head_layout = alloc_.layout(seq, l, h);
            for (std::int64_t j = 0; j < head_layout.length; ++j)
              if (ring_kept.empty() || ring_kept[i].empty() || ring_kept[i][static_cast<std::size_t>(j)])
                meta.push_back(alloc_.pool().meta(head_layout.slot(j)));
          }
        ctx.budget_binds = evictor_.budget_binds(ctx, meta, offsets);
        made.context = ctx;
      }
    std::vector<float> score(static_cast<std::size_t>(offsets.back()));
    std::vector<std::int32_t> position(score.size());
    ScorerInputs<S> inputs;  // its scratch serves every head
    std::vector<std::int64_t> stored;  // the head's entries the Evictor sees, as stored indices
    const auto score_heads = [&] {
      for (int l = 0; l < shape_.layers; ++l)
        for (int h = 0; h < shape_.kv_heads; ++h) {
          const auto i = static_cast<std::size_t>(head_index(shape_, l, h));
          if (!made.active[i]) continue;
          StepContext head_ctx = ctx;  // the context this head is scored in (StepContext::head)
          head_ctx.head = static_cast<std::int64_t>(i);
          const auto head_layout = alloc_.layout(seq, l, h);
          stored.clear();
          for (std::int64_t j = 0; j < head_layout.length; ++j)
            if (ring_kept.empty() || ring_kept[i].empty() || ring_kept[i][static_cast<std::size_t>(j)]) stored.push_back(j);
          const auto b = static_cast<std::size_t>(offsets[i]);
          const std::size_t len = stored.size();
          const auto meta_of = [&](std::size_t j) -> const EntryMeta& { return alloc_.pool().meta(head_layout.slot(stored[j])); };
          for (std::size_t j = 0; j < len; ++j) position[b + j] = meta_of(j).position;
          inputs.score_head(scorer_, recorded, alloc_.pool(), head_layout, stored, l, h, shape_.group(), head_ctx,
                            std::span<float>(score).subspan(b, len));
          for (std::size_t j = 0; j < len; ++j) {
            if (!std::isnan(score[b + j])) continue;
            const EntryMeta& m = meta_of(j);
            fail("Cache::commit: the scorer returned NaN for sequence ", seq, " layer ", l, " head ", h, " position ",
                 m.position, " (write score ", m.write_score, ", key norm ", m.key_norm, ", attention mass ",
                 m.attention_mass, ", n = ", ctx.n, "); a NaN score never enters a ranking");
          }
        }
    };
    if constexpr (evictor_agrees_on_refusal<E>)
      evictor_.agree_on(score_heads);  // a refusal on any rank is every rank's (dist/sharded.hpp)
    else
      score_heads();
    std::vector<std::uint8_t> keep(score.size(), 1);
    if (fires) evict::select_survivors(evictor_, shape_, ctx, SegmentedScores{score, position, offsets}, keep);
    if (!ring_drops) {
      made.offsets = std::move(offsets);
      made.keep = std::move(keep);
      made.position = std::move(position);
    } else {  // the heads either part touched, with keep flags over every stored entry
      made.offsets.assign(heads + 1, 0);
      for (std::size_t i = 0; i < heads; ++i) {
        const bool touched = made.active[i] || !ring_kept[i].empty();
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
            const bool in_ring = ring_kept[i].empty() || ring_kept[i][static_cast<std::size_t>(j)];
            std::uint8_t k = in_ring ? 1 : 0;
            if (in_ring && made.active[i]) k = keep[static_cast<std::size_t>(offsets[i] + seen++)];
            made.keep[at] = k;
          }
          made.active[i] = 1;
        }
    }
    for (const std::uint8_t k : made.keep) made.evicted += k == 0;
    return made;
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
  const CacheShape& shape_;
  const Alloc& alloc_;
  const E& evictor_;
  const S& scorer_;
  const A& admitter_;
};

}  // namespace kvpolicy::detail
