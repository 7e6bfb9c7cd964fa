/// \file
/// kvpolicy/cache.hpp — Cache<Scorer, Admitter, Evictor, Allocator, Backend>: the composition point,
/// one class template for every Backend.
///
/// One forward step of a sequence, as an engine runs it (SPEC, "When eviction runs"):
///   for each layer l:  append(seq, l, keys, values, log_beta)   // T new tokens, positions n..n+T-1
///                      attend(seq, l, queries, out)             // causal inside the chunk
///   commit(seq)                                                 // n += T; trigger; evict
/// step() does all three for every layer at once. Every call validates everything before it changes
/// anything: a call that throws leaves the cache exactly as it was (SPEC §7).
///
/// The Cache owns the step state machine (cache/step_state.hpp): which calls a sequence may make,
/// every input check, the prompt it detects, the order plan-then-apply. The Backend owns the rest
/// through its Executor (B::Executor<S, A, E, Alloc>): where entries live, how the attention runs,
/// and how an eviction is planned and applied — cpu_backend's on the host (cpu/executor.hpp),
/// cuda_backend's on the device (cuda/executor.cuh).
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/cache/evictor_hooks.hpp"
#include "kvpolicy/cache/position_runs.hpp"
#include "kvpolicy/cache/scorer_records.hpp"
#include "kvpolicy/cache/step_state.hpp"
#include "kvpolicy/core/engine_keys.hpp"

namespace kvpolicy {

/// What the Cache calls on its Backend's Executor X, after its own checks of every argument
/// (cpu/executor.hpp and cuda/executor.cuh are the two): a sequence's memory (X::Sequence) made and
/// released, its lengths and entries read, a layer appended (all or nothing) and attended, an open
/// step taken back, and the evictions of the steps that close together planned (X::Plan; it may
/// throw, changing nothing) then applied (it cannot fail).
template <class X, class Records>
concept BackendExecutor = requires(X& x, const X& cx, typename X::Sequence& m, const typename X::Sequence& cm,
                                   typename Records::Sequence& in, std::span<const typename X::Request> requests,
                                   const typename X::Plan& plan, std::vector<EvictedEntry>* evicted,
                                   View<const float, 3> rows, View<float, 3> out, View<const float, 2> scalars) {
  { x.add_sequence(std::int64_t{}) } -> std::same_as<typename X::Sequence>;
  x.remove_sequence(std::int64_t{}, m);
  { cx.length(std::int64_t{}, cm, 0, 0) } -> std::convertible_to<std::int64_t>;
  { cx.lengths(std::int64_t{}, cm) } -> std::same_as<std::vector<std::int64_t>>;
  { cx.entry(std::int64_t{}, cm, 0, 0, std::int64_t{}) } -> std::same_as<EntryMeta>;
  { cx.head_contents(std::int64_t{}, cm, 0, 0) } -> std::same_as<HeadContents>;
  { cx.can_step(std::int64_t{}, cm, std::int64_t{}) } -> std::same_as<bool>;
  { cx.batch_pages(std::int64_t{}, cm, std::int64_t{}) } -> std::convertible_to<std::int64_t>;
  x.append(std::int64_t{}, m, 0, std::int64_t{}, std::int64_t{}, rows, rows, scalars, scalars, true);
  x.attend(std::int64_t{}, m, in, 0, std::int64_t{}, std::int64_t{}, rows, out);
  x.abort(std::int64_t{}, m, in, std::int64_t{}, true);
  { x.plan(requests) } -> std::same_as<typename X::Plan>;
  { plan.context(std::size_t{}) } -> std::same_as<StepContext>;
  { x.apply(plan, evicted) } -> std::same_as<std::vector<EvictionReport>>;
};

/// The Cache: one policy composed of its five parts (S scores, A admits, E evicts, Alloc places the entries,
/// B runs the attention and carries out the eviction). A sequence is added, stepped (append and attend per
/// layer, then commit; or step) and removed, as this file's comment shows.
template <Scorer S, Admitter A, Evictor E, Allocator Alloc, Backend B>
class Cache {
  // Compositions that cannot work fail here, with one line each (docs/architecture.md, "The five parts").
  static_assert(!scorer_records_mass<S> || backend_emits_attention_mass<B>,
                "kvpolicy::Cache: this Scorer ranks by attention mass (H2O), which this Backend's attention does not emit");
  static_assert(!reads_field<S>(Field::attention_mass) || scorer_records_mass<S>,
                "kvpolicy::Cache: this Scorer reads Field::attention_mass and records none (record_mass, "
                "core/concepts.hpp): nothing would add to it");
  static_assert(!(scorer_static_score<S> && scorer_records_mass<S>),
                "kvpolicy::Cache: a Scorer reads either a static score or the attention mass, not both");
  static_assert(!(admitter_has_ring<A> && masks_attention<E>),
                "kvpolicy::Cache: the Admitter's ring and the Evictor both mask the attention; compose one of them");
  static_assert(!admitter_has_ring<A> || masks_attention<A>,
                "kvpolicy::Cache: an Admitter with a ring must give the attention its mask (attention_mask())");
  static_assert(!(EvictorHooks<E>::counts_prompt_by_length && admitter_may_skip<A>),
                "kvpolicy::Cache: this Evictor counts generated entries as length - prompt, which needs every "
                "token stored; this Admitter does not store every token");
  static_assert(!(EvictorHooks<E>::needs_every_token && admitter_may_skip<A>),
                "kvpolicy::Cache: this Evictor evicts whole tokens from every head (SPEC §8), which needs every "
                "token stored in every head; this Admitter does not store every token");
  // the Scorer's record and the hooks it declares (cache/scorer_records.hpp)
  using Records = detail::ScorerRecords<S>;
  // where entries live and how steps run on them (the Backend's)
  using Executor = typename B::template Executor<S, A, E, Alloc>;
  static_assert(BackendExecutor<Executor, Records>,
                "kvpolicy::Cache: this Backend's Executor lacks a call the Cache makes (cache.hpp, BackendExecutor)");

 public:
  using scorer_type = S;
  using admitter_type = A;
  using evictor_type = E;
  using allocator_type = Alloc;
  using backend_type = B;
  using storage_type = typename Alloc::storage_type;
  /// What a Backend takes beside the policies (cpu_backend: nothing; cuda_backend: the stream every
  /// call runs on).
  using backend_options = typename B::Options;
  /// Whether the Scorer records the attention (H2O's mass, TOVA's and SnapKV's window, Expected
  /// Attention's query moments; core/concepts.hpp, RecordingScorer): then every step must attend()
  /// every layer.
  static constexpr bool observes_attention = Records::observes_attention;
  /// Whether the cache holds its entries' K/V (false: storage_type is engine_owned, the engine
  /// holds them and the cache keeps each entry's metadata only; SPEC §9).
  static constexpr bool stores_kv = stores_kv_v<storage_type>;
  /// Whether the Scorer reads what only stored K/V give: the K/V of stored entries (KeyDiff) or
  /// the attention over them (H2O, TOVA, SnapKV, Expected Attention).
  static constexpr bool reads_stored_kv = scorer_reads_stored_kv<S>;
  /// Over engine-owned K/V, whether the Scorer reads the engine's keys (SPEC §9): the engine says
  /// where they are (use_engine_keys) before the first step, and a policy that ranks by attention
  /// is shown each layer's queries (observe). The constructor refuses, over engine-owned K/V, a
  /// Scorer that reads stored values, a composition that masks the attention, and an Admitter that
  /// may drop a token. cpu_backend only.
  static constexpr bool reads_engine_keys = !stores_kv && reads_stored_kv;

  /// Checks every part (each its own settings, the Evictor the Scorer it is given), then lets the
  /// Backend take its memory: a refused composition allocates nothing. Throws for an invalid shape
  /// (CacheShape::validate), an Evictor setting out of range (budget, buffer, window, sinks, threshold,
  /// min_tokens, floor ratio; messages start `evict::…`), a Scorer's or Admitter's failed validate(), and an
  /// Evictor whose config names another scorer (validate_scorer: DBTrimKV's horizon, WG-KV's budget).
  /// Binding the Allocator throws if it already holds sequences or its pool cannot be allocated (the
  /// message gives the size; never std::bad_alloc).
  Cache(CacheShape shape, Alloc allocator, E evictor = {}, S scorer = {}, A admitter = {},
        backend_options options = {})
      : shape_(validated(shape, evictor, scorer, admitter)), checks_{shape},
        executor_(shape_, std::move(allocator), evictor, scorer, admitter, options) {}

  const CacheShape& shape() const { return shape_; }
  const E& evictor() const { return executor_.evictor(); }
  const S& scorer() const { return executor_.scorer(); }
  const A& admitter() const { return executor_.admitter(); }
  /// The Allocator, where the Backend keeps it (cpu_backend): read access to the pool (pages_free(),
  /// pages_used(seq), layout(...), pool()). Its pages_free() is locked and may be called from any thread.
  const Alloc& allocator() const
    requires requires(const Executor& x) { x.allocator(); }
  {
    return executor_.allocator();
  }
  /// The Backend's executor, for what it offers beyond the Cache (cuda_backend: the device views
  /// an engine drives the kernels over), and what it keeps for a sequence (cuda_backend: its slot).
  const Executor& executor() const { return executor_; }
  Executor& executor() { return executor_; }
  const typename Executor::Sequence& executor_sequence(std::int64_t seq) const { return state_of(seq).memory; }

  /// ---- sequences -------------------------------------------------------------------------------
  /// prompt_tokens: the length of the sequence's prompt, when the engine knows it; policies that
  /// protect the prefill (EpiKV, SPEC §4) protect these positions, and SnapKV compresses when the
  /// prompt ends (SPEC §5). Left at -1, the prompt is every token before the first single-token
  /// (decode) step. Throws if prompt_tokens is neither -1 nor in [0, 2^31 - 1], if the sequence
  /// already exists, or (memory::Contiguous) if every sequence region is in use.
  void add_sequence(std::int64_t seq, std::int64_t prompt_tokens = -1) {
    SequenceState st = state_.make(seq, shape_.layers, prompt_tokens);
    st.records = Records::start(scorer(), shape_, prompt_tokens);
    st.memory = executor_.add_sequence(seq);  // last of what can throw: a failed call registers nothing
    state_.insert(seq, std::move(st));
  }
  void remove_sequence(std::int64_t seq) {
    executor_.remove_sequence(seq, state_of(seq).memory);
    state_.erase(seq);
  }
  /// Never throws. Every other call on a sequence throws for an id the cache does not know
  /// ("Cache: unknown sequence"). has_sequence, tokens, prompt_tokens, length and entry may be called
  /// from several threads for a sequence that no thread is changing.
  bool has_sequence(std::int64_t seq) const { return state_.contains(seq); }
  /// n: tokens of the sequence processed by committed steps.
  std::int64_t tokens(std::int64_t seq) const { return state_of(seq).n; }
  /// The prompt length the policies see (declared, or detected at the first decode step; while the
  /// sequence is still in its prefill, every committed token).
  std::int64_t prompt_tokens(std::int64_t seq) const { return state_of(seq).prompt_tokens(); }
  std::int64_t length(std::int64_t seq, int layer, int head) const {
    const SequenceState& st = state_of(seq);  // an unknown sequence is the Cache's error
    checks_.layer(layer, "length");
    checks_.head(head, "length");
    return executor_.length(seq, st.memory, layer, head);
  }
  std::int64_t total_length(std::int64_t seq) const {
    std::int64_t total = 0;
    for (const std::int64_t len : executor_.lengths(seq, state_of(seq).memory)) total += len;
    return total;
  }
  /// Every entry of a head, in storage order: metadata, K and V rows in fp32 ([length, d] each; for
  /// tests and tools; O(length x d)); over engine-owned K/V, the metadata alone (keys and values
  /// empty). Both backends have it.
  HeadContents head_contents(std::int64_t seq, int layer, int head) const {
    const SequenceState& st = state_of(seq);
    checks_.layer(layer, "head_contents");
    checks_.head(head, "head_contents");
    return executor_.head_contents(seq, st.memory, layer, head);
  }
  std::int64_t pages_free() const { return executor_.pages_free(); }
  std::int64_t pages_total() const { return executor_.pages_total(); }
  /// Metadata of entry i of a head, in storage order (not position order after compaction). length,
  /// head_contents and entry throw for a layer or head out of range, entry also for i outside
  /// [0, length).
  EntryMeta entry(std::int64_t seq, int layer, int head, std::int64_t i) const {
    const SequenceState& st = state_of(seq);
    checks_.layer(layer, "entry");
    checks_.head(head, "entry");
    return executor_.entry(seq, st.memory, layer, head, i);
  }

  /// ---- one step, layer by layer ----------------------------------------------------------------
  /// keys/values [Hkv, T, d] post-RoPE, log_beta [Hkv, T] in [-inf, 0] (SPEC §1). For a static-score
  /// Scorer (score::Frozen: EpiKV, the KV statistics, WG-KV's g) the same slot holds the frozen score,
  /// any value but NaN and +inf. Every layer of a step appends the same T, once. Over engine-owned
  /// K/V (stores_kv false) the keys are read for what an entry's metadata takes from them (its key
  /// norm) and not kept, and values may be left empty.
  /// gate [Hkv, T] in [0, 1]: WG-KV's write gate g of each token (SPEC §3), required by an Admitter
  /// that decides by it (admit::WriteGate: WGKVRetentionCache); optional otherwise (every entry's g is
  /// then 1).
  /// Throws for an unknown sequence, a layer out of range, T < 1, a T other than the step's, positions
  /// past 2^31 - 1, a layer already appended in this step, a shape mismatch or a null view, a log_beta
  /// (or score) or gate out of range, a K/V value not finite once converted to the storage dtype
  /// (70000 in fp16), a key whose norm overflows fp32 (KNorm scorers), and a pool too full for the
  /// layer ("out of memory"); that layer's entries are then taken back.
  void append(std::int64_t seq, int layer, View<const float, 3> keys, View<const float, 3> values,
              View<const float, 2> log_beta, View<const float, 2> gate = {}) {
    SequenceState& st = state_of(seq);
    const std::int64_t T = keys.dim(1);
    require_engine_keys("Cache::append");
    checks_.append(seq, st, layer, T);
    checks_.layer_inputs(layer, T, st.n, keys, values, log_beta, gate);
    write_layer(st, seq, layer, T, keys, values, log_beta, gate);
  }

  /// Sets the frozen score (SPEC §4) of the open step's entries at `layer`: scores [Hkv, T], finite
  /// or -inf, as append() takes them. For an engine whose score needs hidden states it has only
  /// after later layers (EpiKV's bands A and B): append with any placeholder, set the scores before
  /// commit(), which is where the trigger and the eviction read them (apps/lm/decoder.hpp). Only for a
  /// static-score Scorer; the Admitter decided at append(). Validated whole before any entry changes:
  /// throws for an unknown sequence, a layer out of range, a layer not appended in an open step, a
  /// shape mismatch, or a NaN or +inf score.
  void set_step_scores(std::int64_t seq, int layer, View<const float, 2> scores)
    requires scorer_static_score<S> && requires(Executor& x, typename Executor::Sequence& m) {
      x.set_step_scores(seq, m, layer, std::int64_t{}, scores);
    }
  {
    SequenceState& st = state_of(seq);
    checks_.layer(layer, "set_step_scores");
    require(st.pending > 0 && st.appended[static_cast<std::size_t>(layer)], "Cache::set_step_scores: layer ", layer,
            " of sequence ", seq, " has not been appended in an open step");
    require_shape(scores, {shape_.kv_heads, st.pending}, "Cache::set_step_scores: scores");
    detail::check_log_beta<S>(layer, st.n, scores, "Cache::set_step_scores");
    executor_.set_step_scores(seq, st.memory, layer, st.n, scores);
  }

  /// queries [Hq, T, d] of this step's T tokens at `layer` (appended already) -> out [Hq, T, d].
  /// A Scorer that records the attention is handed these queries (record_queries) or each key's
  /// probability under them (record_mass: H2O adds it to the key's metadata); abort_step takes back
  /// what it recorded.
  /// Over engine-owned K/V (stores_kv false) the engine attends itself: there is no attend().
  /// Attention is causal inside the chunk and covers exactly the cached entries (SPEC §6). Throws if
  /// the layer was not appended in this step, on a shape mismatch, or for a query that is not finite;
  /// where observes_attention (H2O, SnapKV, WGKVBudgetCache, …) also if the layer was already attended
  /// in this step.
  void attend(std::int64_t seq, int layer, View<const float, 3> queries, View<float, 3> out)
    requires stores_kv
  {
    SequenceState& st = state_of(seq);
    checks_.layer(layer, "attend");
    require(st.appended[static_cast<std::size_t>(layer)], "Cache::attend: layer ", layer, " of sequence ", seq,
            " has not been appended in this step");
    if constexpr (observes_attention)  // the attention adds to the policy's state: once per layer and step
      require(!st.attended[static_cast<std::size_t>(layer)], "Cache::attend: layer ", layer, " of sequence ", seq,
              " was already attended in this step; this policy ranks by attention and counts each query once");
    const std::array<std::int64_t, 3> qshape{shape_.q_heads, st.pending, shape_.head_dim};
    require_shape(queries, qshape, "Cache::attend: queries");
    require_shape(View<const float, 3>(out), qshape, "Cache::attend: out");
    checks_.queries(queries, layer);
    attend_layer(st, seq, layer, queries, out);
  }

  /// ---- over engine-owned K/V, a Scorer that reads keys (SPEC §9) --------------------------------
  /// Where the engine keeps its keys (core/engine_keys.hpp), for a Scorer that reads them
  /// (reads_engine_keys): read at observe() and at commit, never copied. Given before the first
  /// step (append and step refuse one without it); a later call replaces it. Throws for an empty
  /// `row`.
  void use_engine_keys(EngineKeys keys)
    requires reads_engine_keys && requires(Executor& x) { x.use_engine_keys(std::move(keys)); }
  {
    require(static_cast<bool>(keys.row), "Cache::use_engine_keys: the engine's row() is empty");
    (void)memory::with_key_type(keys.type, [](auto) { return 0; });  // throws for none of fp32, fp16, bf16
    executor_.use_engine_keys(std::move(keys));
  }

  /// Over engine-owned K/V, for a policy that ranks by attention (observes_attention: H2O, TOVA,
  /// SnapKV): queries [Hq, T, d] of this step's T tokens at `layer` (appended already), with which
  /// the engine attends over its own K/V. The Scorer records them (TOVA's, SnapKV's window) or each
  /// key's probability under them over the engine's keys (H2O's mass), as attend() would over a
  /// cache that stores the same keys; abort_step takes it back. Every layer of every step is
  /// observed once. Throws as attend() does, for a policy that does not rank by attention, and for
  /// a key the engine does not hold (nothing recorded).
  void observe(std::int64_t seq, int layer, View<const float, 3> queries)
    requires(!stores_kv && observes_attention) &&
            requires(Executor& x, typename Executor::Sequence& m, typename Records::Sequence& r, std::function<void()> f) {
              x.observe(seq, m, r, layer, std::int64_t{}, std::int64_t{}, queries, f);
            }
  {
    SequenceState& st = state_of(seq);
    checks_.layer(layer, "observe");
    require(st.appended[static_cast<std::size_t>(layer)], "Cache::observe: layer ", layer, " of sequence ", seq,
            " has not been appended in this step");
    require(!st.attended[static_cast<std::size_t>(layer)], "Cache::observe: layer ", layer, " of sequence ", seq,
            " was already observed in this step; this policy ranks by attention and counts each query once");
    require_shape(queries, {shape_.q_heads, st.pending, shape_.head_dim}, "Cache::observe: queries");
    checks_.queries(queries, layer, "Cache::observe");
    observe_layer(st, seq, layer, queries);
  }

  /// Closes the step: n += T, then the evictor's trigger and, if it fires, the eviction. `evicted`,
  /// when given, gets one EvictedEntry for each entry that left the cache (over engine-owned K/V, what
  /// the engine frees; head_runs and token_runs group it, cache/position_runs.hpp). Throws if no step
  /// is open, if a layer was not appended, or, where observes_attention, not attended; and
  /// if a user-defined Scorer returns NaN, when the step stays open and unchanged.
  EvictionReport commit(std::int64_t seq, std::vector<EvictedEntry>* evicted = nullptr) {
    checks_.commit(seq, state_of(seq), observes_attention);
    return close_steps(std::span<const std::int64_t>(&seq, 1), evicted).front();
  }

  /// Whether this Cache takes probe steps (open_probe): its Backend's executor can forget a step's
  /// record while keeping its entries (cpu_backend), and no Admitter's ring would drop entries by a
  /// count of tokens that a probe's do not join.
  static constexpr bool takes_probes =
      !admitter_has_ring<A> && requires(Executor& x, typename Executor::Sequence& m, typename Records::Sequence& r) {
        x.discard_record(m, r);
      };

  /// Makes the next step of `seq` a probe (SPEC §10): tokens the engine runs through the model to
  /// ask it something about the sequence (KVzip: repeat your context), whose K/V are appended and
  /// attended as any step's, from position n on; at its commit the Scorer scores with the probe's
  /// entries present and what it recorded, the Evictor evicts where it declares evicts_at_probe
  /// (any other keeps what it holds), then every entry of the probe leaves (and is listed among the
  /// evicted), what it recorded is discarded, and n stays: the next step starts where the probe
  /// did. abort_step takes it back as any step (and cancels a probe not yet begun); a step() or
  /// step_batch() that throws leaves it opened. Throws for an unknown sequence or one with an open
  /// step. The pool must hold the probe's entries beside the sequence's until its commit.
  void open_probe(std::int64_t seq)
    requires takes_probes
  {
    SequenceState& st = state_of(seq);
    require(st.pending == 0, "Cache::open_probe: sequence ", seq, " has an open step; commit or abort it first");
    st.probe = true;
  }
  /// Whether the next or open step of `seq` is a probe.
  bool probing(std::int64_t seq) const { return state_of(seq).probe; }

  /// Discards the open step of `seq`: the entries its append() calls stored are removed and their
  /// pages go back to the pool, as if the step had never started. For an engine whose forward pass
  /// failed between append() and commit(). A sequence with no open step is left as it is. What the
  /// step's attention recorded (H2O's mass, SnapKV's queries) is dropped too. Throws only for an
  /// unknown sequence.
  void abort_step(std::int64_t seq) {
    SequenceState& st = state_of(seq);
    executor_.abort(seq, st.memory, st.records, st.n, st.pending > 0);  // what the step recorded, and its entries
    st.end();
  }

  // ---- one step, every layer at once -----------------------------------------------------------
  /// keys/values [L, Hkv, T, d], log_beta [L, Hkv, T]; queries/out [L, Hq, T, d], or empty views to
  /// skip attention; gate [L, Hkv, T]; all fp32. One sequence's whole forward step
  /// (cache/step_state.hpp). The Cache on either Backend takes it and checks it with the same code.
  using SequenceStep = kvpolicy::SequenceStep;

  /// What step() checks before it writes anything, alone: throws what step() would throw for `s`
  /// before its first write, and changes nothing (a sharded cache's ranks agree on it first,
  /// dist/agree.hpp).
  void check_step(const SequenceStep& s) const {
    require_engine_keys("Cache::step");
    checks_.step(s, state_of(s.seq), observes_attention);
    require(executor_.can_step(s.seq, state_of(s.seq).memory, s.keys.dim(2)), "Cache::step: out of memory: sequence ",
            s.seq, " cannot take ", s.keys.dim(2), " more entries in every head (", pages_free(), " of ",
            pages_total(), " pages free)");
  }

  /// Validated whole before anything is written. queries/out may be left empty only where
  /// observes_attention is false (H2O, SnapKV and WGKVBudgetCache need them). Throws for everything
  /// append() and attend() throw for, if a step opened by append() is still open, and with "out of
  /// memory" if the pool cannot take T more entries in every head. A failure the checks cannot
  /// foresee (a user Scorer, Admitter or Backend) takes the whole step back.
  EvictionReport step(const SequenceStep& s, std::vector<EvictedEntry>* evicted = nullptr) {
    check_step(s);
    try {
      write_and_attend(s);
      return commit(s.seq, evicted);
    } catch (...) {  // whatever failed (a user Scorer, Admitter or Backend; an allocation), the step leaves no trace
      take_back(s.seq);
      throw;
    }
  }
  /// The same step from views; it has no gate, so WGKVRetentionCache uses the SequenceStep form.
  EvictionReport step(std::int64_t seq, View<const float, 4> keys, View<const float, 4> values,
                      View<const float, 3> log_beta, View<const float, 4> queries = {}, View<float, 4> out = {},
                      std::vector<EvictedEntry>* evicted = nullptr) {
    return step(SequenceStep{seq, keys, values, log_beta, queries, out}, evicted);
  }

  /// A batch of sequences, each with its own ragged cache and its own T. The whole batch is
  /// validated (distinct sequences, shapes, values, pool capacity for all of it) before any write,
  /// and every sequence's eviction is planned before any step closes: a failure validation cannot
  /// foresee (a user-defined Scorer returning NaN) takes back every step of the batch. Also throws if
  /// a sequence appears twice, or if the pool lacks the pages for the whole batch (memory::Paged
  /// counts them together). Reports come back in batch order.
  /// It may run alongside calls on sequences outside its batch. Since another thread may take pages
  /// first, a step (or batch) can still fail with "out of memory" after its check; it is then taken back.
  std::vector<EvictionReport> step_batch(std::span<const SequenceStep> batch) {
    std::int64_t pages_needed = 0;
    std::vector<std::int64_t> seqs;
    require_engine_keys("Cache::step_batch");
    for (std::size_t i = 0; i < batch.size(); ++i) {
      checks_.step(batch[i], state_of(batch[i].seq), observes_attention);
      for (std::size_t j = 0; j < i; ++j)
        require(batch[j].seq != batch[i].seq, "Cache::step_batch: sequence ", batch[i].seq, " appears twice");
      pages_needed += executor_.batch_pages(batch[i].seq, state_of(batch[i].seq).memory, batch[i].keys.dim(2));
      seqs.push_back(batch[i].seq);
    }
    require(pages_needed <= pages_free(), "Cache::step_batch: out of memory: the batch needs ", pages_needed,
            " pages, ", pages_free(), " of ", pages_total(), " are free");
    std::size_t started = 0;
    try {
      for (const auto& s : batch) {
        ++started;
        write_and_attend(s);
      }
      return close_steps(seqs, nullptr);
    } catch (...) {
      for (std::size_t i = started; i-- > 0;) take_back(batch[i].seq);  // last first: pages return in reverse
      throw;
    }
  }

 private:
  /// The shared step state (cache/step_state.hpp), the Scorer's record of the sequence
  /// (cache/scorer_records.hpp), and what the Backend keeps for it.
  struct SequenceState : detail::StepState {
    typename Records::Sequence records;
    typename Executor::Sequence memory;
  };

  /// The composition's own checks, before the Backend takes any memory.
  static const CacheShape& validated(const CacheShape& shape, const E& evictor, const S& scorer, const A& admitter) {
    // SPEC §9: over engine-owned K/V only what the metadata and the engine's keys decide, and
    // nothing the engine's own attention or memory would have to be told besides the evicted entries
    if constexpr (!stores_kv && scorer_reads_stored_values<S>)
      fail("kvpolicy::Cache: this policy's Scorer reads the values of stored entries, which a cache over "
           "engine-owned K/V (storage engine_owned) does not hold nor read from the engine; give it a storage "
           "type that keeps K/V (float, half, bfloat16)");
    else if constexpr (reads_engine_keys && !requires(Executor& x, EngineKeys k) { x.use_engine_keys(k); })
      fail("kvpolicy::Cache: this policy's Scorer reads stored keys or the attention over them, which this "
           "Backend cannot read from the engine over engine-owned K/V (cpu_backend can)");
    else if constexpr (!stores_kv && (masks_attention<E> || masks_attention<A>))
      fail("kvpolicy::Cache: this composition masks the attention (WG-KV's local ring), which the engine's own "
           "attention over engine-owned K/V (storage engine_owned) would not apply; give it a storage type that "
           "keeps K/V");
    else if constexpr (!stores_kv && admitter_may_skip<A>)
      fail("kvpolicy::Cache: this Admitter may drop a token at write time, which an engine that owns the K/V "
           "(storage engine_owned) would never be told to free; give it a storage type that keeps K/V");
    evictor.validate(shape);
    scorer.validate();
    Records::validate(scorer, shape);
    if constexpr (admitter_validates<A>) admitter.validate();
    EvictorHooks<E>::validate_scorer(evictor, scorer);
    return shape;
  }

  /// A step that failed inside step() or step_batch() taken back: as abort_step, but a probe the
  /// sequence had opened stays opened, as before the call (a call that throws changes nothing).
  void take_back(std::int64_t seq) {
    SequenceState& st = state_of(seq);
    const bool probe = st.probe;
    abort_step(seq);
    st.probe = probe;
  }

  const SequenceState& state_of(std::int64_t seq) const { return state_.at(seq); }
  SequenceState& state_of(std::int64_t seq) { return state_.at(seq); }

  void write_layer(SequenceState& st, std::int64_t seq, int layer, std::int64_t T, View<const float, 3> keys,
                   View<const float, 3> values, View<const float, 2> log_beta, View<const float, 2> gate) {
    const bool opens = st.pending == 0;
    if (opens) Records::open_step(scorer(), st.records, st.n, st.probe);
    try {
      executor_.append(seq, st.memory, layer, st.n, T, keys, values, log_beta, gate, opens);
    } catch (...) {  // the step did not open: the record takes back its opening (it recorded nothing yet)
      if (opens) Records::abort(scorer(), st.records, EntryFields{});
      throw;
    }
    st.pending = T;
    st.appended[static_cast<std::size_t>(layer)] = 1;
  }
  void attend_layer(SequenceState& st, std::int64_t seq, int layer, View<const float, 3> queries, View<float, 3> out) {
    Records::record_queries(scorer(), st.records, layer, queries, st.n);
    st.attended[static_cast<std::size_t>(layer)] = 1;
    executor_.attend(seq, st.memory, st.records, layer, st.n, st.pending, queries, out);
  }
  void observe_layer(SequenceState& st, std::int64_t seq, int layer, View<const float, 3> queries) {
    if constexpr (!stores_kv && observes_attention) {
      // the queries are recorded once the mass is made (a key the engine lacks throws before) and
      // before it is recorded (recording it cannot fail): a call that throws records nothing
      executor_.observe(seq, st.memory, st.records, layer, st.n, st.pending, queries,
                        [&] { Records::record_queries(scorer(), st.records, layer, queries, st.n); });
      st.attended[static_cast<std::size_t>(layer)] = 1;
    }
  }
  /// A Scorer that reads the engine's keys has them before a step begins.
  void require_engine_keys(const char* call) const {
    if constexpr (reads_engine_keys)
      require(executor_.has_engine_keys(), call, ": this policy's Scorer reads the keys (or the attention over ",
              "them) that the engine owns; say where they are first (Cache::use_engine_keys, SPEC §9)");
  }
  void write_and_attend(const SequenceStep& s) {
    SequenceState& st = state_of(s.seq);
    const std::int64_t T = s.keys.dim(2);
    detail::for_each_layer(
        s, shape_.layers,
        [&](int l, auto keys, auto values, auto log_beta, auto gate) {
          write_layer(st, s.seq, l, T, keys, values, log_beta, gate);
        },
        [&](int l, auto queries, auto out) {
          if constexpr (stores_kv)
            attend_layer(st, s.seq, l, queries, out);
          else  // the checks refused an out and queries where nothing observes them
            observe_layer(st, s.seq, l, queries);
        });
  }

  /// Closes the open steps of `seqs` (every layer appended): plans every eviction first (it may
  /// throw: a scorer that returns NaN; then every step is still open and the cache as it was),
  /// then closes each step and applies the plans, where nothing can fail.
  std::vector<EvictionReport> close_steps(std::span<const std::int64_t> seqs, std::vector<EvictedEntry>* evicted) {
    std::vector<typename Executor::Request> requests;
    requests.reserve(seqs.size());
    for (const std::int64_t seq : seqs) {
      const SequenceState& st = state_of(seq);
      requests.push_back({seq, &st.memory, st.context(), &st.records});
    }
    const typename Executor::Plan plan = executor_.plan(requests);
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      SequenceState& st = state_of(seqs[i]);
      if constexpr (takes_probes)
        if (st.probe) {  // SPEC §10: the record served the plan; it goes before the compaction moves its slots
          executor_.discard_record(st.memory, st.records);
          st.commit(plan.context(i));  // n stays
          continue;
        }
      st.commit(plan.context(i));  // n += T; the first decode step fixes an undeclared prompt (SPEC §4)
      Records::commit(scorer(), st.records);
    }
    return executor_.apply(plan, evicted);
  }

  CacheShape shape_;
  detail::StepChecks<S, A, storage_type> checks_;
  Executor executor_;
  detail::Sequences<SequenceState> state_;
};

}  // namespace kvpolicy
