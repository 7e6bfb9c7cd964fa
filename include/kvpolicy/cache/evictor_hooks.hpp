/// \file
/// kvpolicy/cache/evictor_hooks.hpp — the Evictor's fixed surface: every hook the Cache and the
/// planner (cache/planner.hpp) call on an Evictor, each with the default an Evictor gets when it
/// does not declare it, as an attention variant overrides a base's defaults. Callers call
/// EvictorHooks<E> and never probe; whether a hook is declared is said once, by the probes in
/// core/concepts.hpp. A new hook is one row here whose default keeps every Evictor as it was.
///
///   hook                                  default                         declared by
///   validate_scorer(scorer)               nothing to check                evict::Pooled (the horizon), WG-KV's budget, dist::Sharded*
///   shared_context(ctx)                   ctx (this Cache's entries)      dist::ShardedWriteGatedBudget
///   trigger(shape, ctx, lengths, active)  fires() per group of heads      dist::Sharded, evict::Pyramid
///   budget_binds(ctx, meta, offsets)      true                            WG-KV's budget (tells_binding)
///   agree_on(score)                       score()                         dist::Sharded*
///   select(shape, ctx, scores, keep)      the stated selection()          WG-KV's budget, dist::Sharded*
///   counts_prompt_by_length               false                           EpiKV's budget (evict::Generated)
///   needs_every_token                     false                           token-level eviction (evict::Union)
///   evicts_at_probe                       false (no trigger at a probe)   KVzip (SPEC §10)
///   selects_heads_alone                   false                           evict::Pyramid
///
/// The attention's mask (core/concepts.hpp, composed_attention_mask) is the Evictor's or the
/// Admitter's, so it is composed there rather than here.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/parts/evict/selection.hpp"

namespace kvpolicy {

template <Evictor E>
struct EvictorHooks {
  /// EpiKV's budget counts a head's generated entries as length - prompt: exact only when every
  /// prompt token was stored, so the Cache refuses an Admitter that may skip one.
  static constexpr bool counts_prompt_by_length = evictor_counts_prompt_by_length<E>;
  /// Token-level eviction keeps the same positions in every head: it needs every token stored.
  static constexpr bool needs_every_token = evictor_needs_every_token<E>;
  /// Its trigger and selection decide each head from that head alone: a rank holding a share of
  /// the heads (dist/sharded.hpp) runs it as it is.
  static constexpr bool selects_heads_alone = evictor_selects_heads_alone<E>;
  /// budget_binds() reads the active heads' entries, which the planner gathers only for it.
  static constexpr bool tells_binding = evictor_tells_binding<E>;
  /// Its trigger runs at a probe's commit (SPEC §10); any other Evictor's never fires there.
  static constexpr bool evicts_at_probe = evictor_evicts_at_probe<E>;

  /// At construction: the Scorer it is composed with (a horizon its config named, WG-KV's budget).
  template <class S>
  static void validate_scorer(const E& e, const S& scorer) {
    if constexpr (evictor_checks_scorer<E, S>) e.validate_scorer(scorer);
  }
  /// The context the trigger, the Scorer and the selection see: a rank's share of the heads gives
  /// the whole sequence's (its entries over every rank).
  static StepContext shared_context(const E& e, StepContext c) {
    if constexpr (evictor_shares_context<E>)
      return e.shared_context(c);
    else
      return c;
  }
  /// Marks in `active` the heads whose group fires (one per (layer, kv head), head_index order)
  /// and returns whether any does (parts/evict/selection.hpp).
  static bool trigger(const E& e, const CacheShape& shape, StepContext c, std::span<const std::int64_t> lengths,
                      std::span<std::uint8_t> active) {
    if (c.probe > 0 && !evicts_at_probe) return false;  // a probe's entries are not the sequence's (SPEC §10)
    return evict::trigger_heads(e, shape, c, lengths, active);
  }
  /// Whether the budget binds this step, from the entries' metadata alone (meta[offsets[i],
  /// offsets[i+1]) per active head, in stored order); StepContext::budget_binds carries it to the
  /// Scorer. Without the hook it always binds.
  static bool budget_binds(const E& e, StepContext c, std::span<const EntryMeta> meta,
                           std::span<const std::int64_t> offsets) {
    if constexpr (tells_binding)
      return e.budget_binds(c, meta, offsets);
    else
      return true;
  }
  /// Runs the commit's scoring: a rank's share agrees on it, so that a refusal on any rank (a
  /// user-defined Scorer's NaN) is every rank's, before the selection's collectives.
  template <class F>
  static void agree_on(const E& e, F&& score) {
    if constexpr (evictor_agrees_on_refusal<E>)
      e.agree_on(std::forward<F>(score));
    else
      std::forward<F>(score)();
  }
  /// keep[i] = 1 for every survivor of the active heads' segments (parts/evict/selection.hpp).
  static void select(const E& e, const CacheShape& shape, StepContext c, const SegmentedScores& scores,
                     std::span<std::uint8_t> keep) {
    evict::select_survivors(e, shape, c, scores, keep);
  }
};

}  // namespace kvpolicy
