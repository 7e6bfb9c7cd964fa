/// \file
/// kvpolicy/core/concepts.hpp — the concepts of the five parts a Cache is composed of (docs/architecture.md, "The five parts").
/// Every policy static_asserts the concept it models, so a wrong composition fails to compile with
/// one readable line.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/mask.hpp"
#include "kvpolicy/core/record.hpp"
#include "kvpolicy/core/rope.hpp"
#include "kvpolicy/core/rule.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"

namespace kvpolicy {

/// Scorer: entry metadata + step context -> one fp32 score, higher = keep. Pure KVPOLICY_HD math.
template <class S>
concept EntryScorer = requires(const S& s, EntryMeta m, StepContext c) {
  { s(m, c) } -> std::same_as<float>;
};
/// A scorer that scores a whole head at once from its keys and metadata (KeyDiff, SPEC §5): score_head(keys
/// [N, d], meta [N], ctx, out [N]).
template <class S>
concept HeadScorer = requires(const S& s, View<const float, 2> keys, std::span<const EntryMeta> meta, StepContext c,
                              std::span<float> out) { s.score_head(keys, meta, c, out); };
/// A Scorer that records what a sequence's attention shows it across steps (SnapKV's last queries,
/// Expected Attention's query moments, H2O's attention mass) declares its record, one per sequence,
/// and the hooks the Cache calls on it; the Cache and the planner store the record and call the
/// hooks without knowing what is inside (cache/scorer_records.hpp):
///   typename Record                                   one sequence's; dropped with its sequence
///   Record open_record(shape, prompt_tokens)          a sequence is added (prompt_tokens -1: none declared)
///   void commit_record(Record&)                       the open step closed: what it recorded stays
///   void discard_record(Record&, EntryFields)         the open step taken back: what it recorded goes,
///                                                     and the fields it changed are put back (SPEC §7)
/// and what it records, one or both, each step's attention calling it once per layer:
///   void record_queries(Record&, layer, queries [Hq, T, d], first)   the layer's queries at positions first..
///   void record_mass(Record&, EntryFields, slots [N], mass [N])      a kv head's attention: each key's
///                                                     probability summed over the step's queries and the group
/// Optional: open_step(Record&, first) when a step opens at position `first` (before its first
/// layer is stored; a store that fails then discards the record's step); open_probe(Record&, first)
/// when the step that opens is a probe (SPEC §10; open_step where it declares none; what a probe
/// records serves its commit's scoring and is then discarded); validate_shape(shape) at the Cache's
/// construction. commit_record and discard_record run where the Cache can no longer take
/// a step back (SPEC §7): they must not throw.
template <class S>
concept RecordingScorer = requires { typename S::Record; } &&
                          requires(const S& s, typename S::Record& r, const CacheShape& shape, EntryFields f) {
  { s.open_record(shape, std::int64_t{}) } -> std::same_as<typename S::Record>;
  s.commit_record(r);
  s.discard_record(r, f);
} && std::movable<typename S::Record>;
/// A RecordingScorer that records each layer's queries.
template <class S>
concept QueryRecorder = RecordingScorer<S> && requires(const S& s, typename S::Record& r, View<const float, 3> q) {
  s.record_queries(r, 0, q, std::int64_t{});
};
/// A RecordingScorer that records the attention mass (the attention must hand it each key's probability).
template <class S>
concept MassRecorder = RecordingScorer<S> && requires(const S& s, typename S::Record& r, EntryFields f,
                                                      std::span<const std::int64_t> slots, std::span<const float> mass) {
  s.record_mass(r, f, slots, mass);
};
template <class S>
constexpr bool scorer_records_queries = QueryRecorder<S>;
template <class S>
constexpr bool scorer_records_mass = MassRecorder<S>;
/// A Scorer that records the attention: every step must attend every layer.
template <class S>
constexpr bool scorer_observes_attention = scorer_records_queries<S> || scorer_records_mass<S>;
/// A RecordingScorer that scores a head from its record and the head's entries (their K/V as it
/// declares in head_data): score_recorded(record, HeadEntries, ctx, out [N]). SnapKV's window, Expected
/// Attention's moments. Optional: reads_kv(ctx), false where this step's scores need the metadata
/// alone (the head's entries then come without keys and values).
template <class S>
concept RecordScorer = RecordingScorer<S> && requires(const S& s, const typename S::Record& r, HeadEntries e,
                                                      StepContext c, std::span<float> out) {
  s.score_recorded(r, e, c, out);
};
/// The K/V a RecordScorer reads of a head's entries (none where it declares none).
template <class S>
constexpr EntryData head_data_of() {
  if constexpr (requires { S::head_data; })
    return S::head_data;
  else
    return {};
}
/// A Scorer: copyable, checks its settings (validate()), and scores in one of the three ways above.
template <class S>
concept Scorer = std::copyable<S> && requires(const S& s) { s.validate(); } &&
                 (EntryScorer<S> || HeadScorer<S> || RecordScorer<S>);

/// The per-entry fields a part declares it reads (`static constexpr FieldSet entry_fields`, core/
/// entry.hpp; none when it declares none): what the pools carry for it.
template <class T>
constexpr FieldSet entry_fields_of() {
  if constexpr (requires { T::entry_fields; })
    return T::entry_fields;
  else
    return {};
}
template <class T>
constexpr bool reads_field(Field f) {
  return entry_fields_of<T>().has(f);
}
/// The fields a composition's pools carry: what its Scorer and its Admitter read.
template <class S, class A>
inline constexpr FieldSet composed_fields = entry_fields_of<S>() | entry_fields_of<A>();

/// Admitter: decides at write time where a new entry goes.
template <class A>
concept Admitter = std::copyable<A> && requires(const A& a, EntryMeta m) {
  { a.admit(m) } -> std::same_as<Admission>;
};
/// An Admitter with a local ring (WG-KV, SPEC §3): ring() = W_local, the newest entries of a head
/// in which Admission::local entries live; the Cache drops them once they are older.
template <class A>
constexpr bool admitter_has_ring = requires(const A& a) {
  { a.ring() } -> std::convertible_to<std::int64_t>;
};
/// An Admitter that may leave a token out of the cache (drop, or local with a ring): every Admitter
/// but one that declares stores_every_token (admit::All).
template <class A>
constexpr bool admitter_may_skip = !requires { requires A::stores_every_token; };
/// An Evictor whose trigger counts a head's generated entries as length - prompt (EpiKV's budget,
/// SPEC §4): exact only when every prompt token was stored.
template <class E>
constexpr bool evictor_counts_prompt_by_length = requires { requires E::counts_prompt_by_length; };
/// An Evictor whose rule needs every head to store every token (token-level eviction, SPEC §8:
/// its positions are every head's).
template <class E>
constexpr bool evictor_needs_every_token = requires { requires E::needs_every_token; };
/// An Evictor whose trigger runs at a probe step's commit (SPEC §10: KVzip selects there); every
/// other Evictor keeps what it holds through a probe.
template <class E>
constexpr bool evictor_evicts_at_probe = requires { requires E::evicts_at_probe; };
/// An Admitter that decides by the gate field (it declares Field::gate), which append must then be given.
template <class A>
constexpr bool admitter_reads_gate = reads_field<A>(Field::gate);

/// Evictor: the rule of an eviction, stated once (core/rule.hpp): which heads trigger together
/// (group_heads), when a group fires (fires, KVPOLICY_HD: the device's trigger kernel calls it),
/// and what a triggered group keeps (selection(): a HeadSelection or a PoolSelection). It never
/// moves data; the host executor (parts/evict/selection.hpp: evict::trigger_heads, evict::select_survivors) and the
/// device's evict_step run the statement. A rule the data cannot state (WG-KV's hard budget, which
/// weighs every head against one sum) gives select(shape, ctx, scores, keep) instead of
/// selection(), and runs on the host only.
template <class E>
concept evictor_states_selection = requires(const E& e) {
  requires std::same_as<decltype(e.selection()), evict::HeadSelection> ||
               std::same_as<decltype(e.selection()), evict::PoolSelection>;
};
/// An Evictor that keeps by its own select() (the rule the data cannot state, above). dist::Sharded,
/// whose selection runs collectives over the ranks, is one, and runs on the device Cache too: the
/// device scores and compacts, the host selects over the scores it reads back.
template <class E>
concept evictor_selects_itself =
    requires(const E& e, const CacheShape& shape, StepContext c, const SegmentedScores& scores,
             std::span<std::uint8_t> keep) { e.select(shape, c, scores, keep); };
/// An Evictor: copyable, checks its settings against the shape, groups its heads, says when a group fires,
/// and states its selection or selects itself.
template <class E>
concept Evictor = std::copyable<E> &&
                  requires(const E& e, const CacheShape& shape, std::int64_t length, StepContext c) {
                    e.validate(shape);
                    { e.group_heads(shape) } -> std::convertible_to<std::int64_t>;
                    { e.fires(length, length, c) } -> std::same_as<bool>;
                  } && (evictor_states_selection<E> || evictor_selects_itself<E>);
/// An Evictor whose selection() is a HeadSelection (each head ranks alone).
template <class E>
constexpr bool selects_per_head = requires(const E& e) {
  { e.selection() } -> std::same_as<evict::HeadSelection>;
};

/// ---- hooks a part may declare (each absent by default): whether it declares one is probed here, once;
/// the Cache and the planner call an Evictor's through EvictorHooks (cache/evictor_hooks.hpp), which
/// gives each its default ---------------------------------------------------------------------------
/// attention_mask(): the mask the attention applies (WG-KV's vertical-slash, core/mask.hpp), from
///   the Evictor or from an Admitter with a ring; absent: causal only.
template <class T>
constexpr bool masks_attention = requires(const T& t) {
  { t.attention_mask() } -> std::same_as<AttentionMask>;
};
/// validate_scorer(s): an Evictor checks the Scorer it is composed with, at construction (a horizon
///   the config named, WG-KV's shared budget).
template <class E, class S>
constexpr bool evictor_checks_scorer = requires(const E& e, const S& s) { e.validate_scorer(s); };
/// shared_context(ctx): an Evictor whose Cache holds one rank's share of the heads (dist/sharded.hpp)
///   gives the whole sequence's context (its entries over every rank) before the trigger, the
///   Scorer and the selection see it.
template <class E>
constexpr bool evictor_shares_context = requires(const E& e, StepContext c) {
  { e.shared_context(c) } -> std::same_as<StepContext>;
};
/// trigger(shape, ctx, lengths, active): an Evictor runs its trigger over every group of the
///   sequence at once (a sharded pool sums all its pools' lengths over the ranks in one collective,
///   dist/sharded.hpp); absent: fires() per group (evict::trigger_heads).
template <class E>
constexpr bool evictor_triggers_itself = requires(const E& e, const CacheShape& shape, StepContext c,
                                                  std::span<const std::int64_t> lengths, std::span<std::uint8_t> active) {
  { e.trigger(shape, c, lengths, active) } -> std::same_as<bool>;
};
/// agree_on(f): an Evictor whose Cache holds one rank's share of the heads runs f, the commit's
///   scoring, so that every rank throws the same error when any rank's throws (dist::agree): a NaN
///   from a user-defined Scorer on one rank refuses the commit on every rank, before the selection's
///   collectives.
template <class E>
constexpr bool evictor_agrees_on_refusal = requires(const E& e, void (*f)()) { e.agree_on(f); };
/// budget_binds(ctx, meta, offsets): an Evictor whose budget weighs only what the gates admitted
///   (WG-KV's hard budget) tells from the entries' metadata alone — meta[offsets[i], offsets[i+1])
///   for each head the trigger fired for, in stored order — whether the budget binds this step; the
///   planner sets StepContext::budget_binds from it before the scoring. Where it is false a Scorer may
///   skip what only a binding budget reads (score::GatedObservedAttention skips appendix K's attention,
///   and through reads_window(ctx) is not even handed the keys and queries).
template <class E>
constexpr bool evictor_tells_binding = requires(const E& e, StepContext c, std::span<const EntryMeta> meta,
                                                std::span<const std::int64_t> offsets) {
  { e.budget_binds(c, meta, offsets) } -> std::same_as<bool>;
};
/// selects_heads_alone: an Evictor whose own trigger() and select() decide each head from that
///   head's length and entries alone (PyramidKV's per-layer budgets): a rank holding a share of
///   the heads (dist/sharded.hpp) runs it as it is.
template <class E>
constexpr bool evictor_selects_heads_alone = requires { requires E::selects_heads_alone; };
/// validate(): an Admitter checks its own settings, at construction.
template <class A>
constexpr bool admitter_validates = requires(const A& a) { a.validate(); };
/// pages_needed(seq, T): an Allocator counts the free pages a step of T more tokens takes, so that a
///   batch is refused whole when the pool lacks them (else each step is checked alone).
template <class A>
constexpr bool allocator_counts_pages = requires(const A& a) {
  { a.pages_needed(std::int64_t{}, std::int64_t{}) } -> std::convertible_to<std::int64_t>;
};
/// The mask a composition's attention applies: the Evictor's, else the Admitter's, else none
/// (causal only).
template <class E, class A>
AttentionMask composed_attention_mask(const E& e, const A& a) {
  if constexpr (masks_attention<E>)
    return e.attention_mask();
  else if constexpr (masks_attention<A>)
    return a.attention_mask();
  else
    return {};
}

/// ---- what a Scorer reads besides its write score and position (each optional, default false) ----------
/// static_score: EntryMeta::write_score is a score handed in at write time (EpiKV, the KV
///   statistics, SPEC §4), any value but NaN, instead of a log_beta in [-inf, 0].
template <class S>
constexpr bool scorer_static_score = requires { requires S::static_score; };
/// A Scorer that reads what only stored K/V give: stored keys (a HeadScorer, or a RecordScorer
/// that declares them), or the attention over them (what a RecordingScorer records). Over K/V the
/// engine owns it reads the engine's keys (core/engine_keys.hpp, SPEC §9), and never values.
template <class S>
constexpr bool scorer_reads_stored_kv = HeadScorer<S> || scorer_observes_attention<S> || head_data_of<S>().keys ||
                                        head_data_of<S>().values;
/// A Scorer that reads stored values (Expected Attention's): what no engine's keys give, so it runs
/// only over a cache that stores K/V (SPEC §9).
template <class S>
constexpr bool scorer_reads_stored_values = head_data_of<S>().values;
/// How the device scores a Scorer (core/record.hpp, DeviceScoring): what it declares, else by_entry
/// for an EntryScorer that records nothing, else none.
template <class S>
constexpr DeviceScoring device_scoring_of() {
  if constexpr (requires { S::device_scoring; })
    return S::device_scoring;
  else if constexpr (EntryScorer<S> && !RecordingScorer<S>)
    return DeviceScoring::by_entry;
  else
    return DeviceScoring::none;
}
/// Backend: where a Cache's entries live, how its attention runs and how its evictions are planned
/// and applied, named by the fifth argument of Cache — cpu_backend (the Allocator's host pool,
/// cpu/backend.hpp) or cuda_backend (device memory and the CUDA kernels, cuda/backend.cuh). A
/// Backend names itself (static constexpr const char* name), says what it takes beside the policies
/// (Options: nothing on the CPU, the stream on the device; the Cache constructor's last argument),
/// and gives the Cache its Executor<S, A, E, Alloc> (cache.hpp lists what the Cache calls on it).
/// There is one Cache class template; the Backend is a policy of it like the other four. What it
/// can do beyond that it declares with optional traits (default false): emits_attention_mass
/// (below; a Scorer that records the mass needs it), parallel_heads (its attend() may run for different kv heads at once;
/// core/parallel.hpp).
template <class B>
concept Backend = requires {
  { B::name } -> std::convertible_to<const char*>;
  typename B::Options;
};
/// A Backend whose attention hands each key's probability to a Scorer that records the mass (H2O).
template <class B>
constexpr bool backend_emits_attention_mass = requires { requires B::emits_attention_mass; };

/// Allocator: owns where entries live. Appends whole steps of a head, reads them back through
/// block tables, and compacts a head to its survivors, returning emptied pages to the pool.
template <class A>
concept Allocator = requires(A& a, const A& ca, const CacheShape& shape, std::int64_t seq, int layer,
                             int head, std::span<const std::uint8_t> keep) {
  typename A::storage_type;
  a.bind(shape);
  a.add_sequence(seq);
  a.remove_sequence(seq);
  { ca.has_sequence(seq) } -> std::same_as<bool>;
  { ca.length(seq, layer, head) } -> std::same_as<std::int64_t>;
  { ca.can_append(seq, std::int64_t{1}) } -> std::same_as<bool>;
  { ca.can_append(seq, std::int64_t{1}, layer) } -> std::same_as<bool>;
  a.append(seq, layer, head, std::int64_t{1}, static_cast<const float*>(nullptr), static_cast<const float*>(nullptr),
           static_cast<const EntryMeta*>(nullptr));
  ca.layout(seq, layer, head);  // a memory::HeadLayout: block table, page size, length
  ca.pool();                    // the memory::EntryPool the layouts index
  { a.compact(seq, layer, head, keep) } -> std::same_as<std::int64_t>;
  { ca.pages_free() } -> std::convertible_to<std::int64_t>;
  { ca.pages_total() } -> std::convertible_to<std::int64_t>;
};

}  // namespace kvpolicy
