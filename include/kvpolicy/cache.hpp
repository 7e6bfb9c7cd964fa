/// \file
/// kvpolicy/cache.hpp — Cache<Scorer, Admitter, Evictor, Allocator, Backend>: the composition point.
///
/// One forward step of a sequence, as an engine runs it (SPEC, "When eviction runs"):
///   for each layer l:  append(seq, l, keys, values, log_beta)   // T new tokens, positions n..n+T-1
///                      attend(seq, l, queries, out)             // causal inside the chunk
///   commit(seq)                                                 // n += T; trigger; evict
/// step() does all three for every layer at once. Every call validates everything before it changes
/// anything: a call that throws leaves the cache exactly as it was (SPEC §7).
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/mask.hpp"
#include "kvpolicy/core/parallel.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/engine/planner.hpp"
#include "kvpolicy/engine/scorer_inputs.hpp"
#include "kvpolicy/engine/step_state.hpp"
#include "kvpolicy/memory/pool.hpp"

namespace kvpolicy {

/// One entry an eviction removed, for tools that trace decisions (kvpolicy-replay).
struct EvictedEntry {
  int layer = 0;
  int head = 0;
  std::int32_t position = 0;
};

/// What a commit did: whether the Evictor's trigger fired, and how many entries left the cache
/// (by the Evictor, or by an Admitter's ring, SPEC §3).
struct EvictionReport {
  bool triggered = false;
  std::int64_t evicted = 0;
};


template <Scorer S, Admitter A, Evictor E, Allocator Alloc, Backend B>
class Cache {
  // Compositions that cannot work fail here, with one line each (docs/architecture.md, "The four concepts").
  static_assert(!scorer_needs_attention_mass<S> || backend_emits_attention_mass<B>,
                "kvpolicy::Cache: this Scorer ranks by attention mass (H2O), which this Backend's attention does not emit");
  static_assert(!scorer_needs_attention_mass<S> || requires(Alloc& a) { a.pool().add_attention_mass(0, 0.0f); },
                "kvpolicy::Cache: this Scorer ranks by attention mass, and this Allocator's pool cannot accumulate it");
  static_assert(!(scorer_static_score<S> && scorer_needs_attention_mass<S>),
                "kvpolicy::Cache: a Scorer reads either a static score or the attention mass, not both");
  static_assert(!(admitter_has_ring<A> && masks_attention<E>),
                "kvpolicy::Cache: the Admitter's ring and the Evictor both mask the attention; compose one of them");
  static_assert(!admitter_has_ring<A> || masks_attention<A>,
                "kvpolicy::Cache: an Admitter with a ring must give the attention its mask (attention_mask())");
  static_assert(!(evictor_counts_prompt_by_length<E> && admitter_may_skip<A>),
                "kvpolicy::Cache: this Evictor counts generated entries as length - prompt, which needs every "
                "token stored; this Admitter does not store every token");
  // what the Scorer reads beyond an entry's metadata, by the hooks it declares
  using Inputs = detail::ScorerInputs<S>;
  // the attention feeds the Scorer (engine/scorer_inputs.hpp), so every step attends
  static constexpr bool observes_attention = Inputs::observes_attention;

 public:
  using scorer_type = S;
  using admitter_type = A;
  using evictor_type = E;
  using allocator_type = Alloc;
  using backend_type = B;
  using storage_type = typename Alloc::storage_type;

  Cache(CacheShape shape, Alloc allocator, E evictor = {}, S scorer = {}, A admitter = {})
      : shape_(shape), checks_{shape}, alloc_(std::move(allocator)), evictor_(evictor), scorer_(scorer),
        admitter_(admitter) {
    evictor_.validate(shape_);
    scorer_.validate();
    if constexpr (admitter_validates<A>) admitter_.validate();
    if constexpr (evictor_checks_scorer<E, S>) evictor_.validate_scorer(scorer_);
    alloc_.bind(shape_);
  }

  const CacheShape& shape() const { return shape_; }
  const E& evictor() const { return evictor_; }
  const S& scorer() const { return scorer_; }
  const Alloc& allocator() const { return alloc_; }

  /// ---- sequences -------------------------------------------------------------------------------
  /// prompt_tokens: the length of the sequence's prompt, when the engine knows it; policies that
  /// protect the prefill (EpiKV, SPEC §4) protect these positions. Left at -1, the prompt is every
  /// token before the first single-token (decode) step.
  void add_sequence(std::int64_t seq, std::int64_t prompt_tokens = -1) {
    SequenceState st = state_.make(seq, shape_.layers, prompt_tokens);
    st.inputs = Inputs::start(scorer_, shape_);
    alloc_.add_sequence(seq);  // last of what can throw: a failed call registers nothing
    state_.insert(seq, std::move(st));
  }
  void remove_sequence(std::int64_t seq) {
    state_of(seq);
    alloc_.remove_sequence(seq);
    state_.erase(seq);
  }
  bool has_sequence(std::int64_t seq) const { return state_.contains(seq); }
  /// n: tokens of the sequence processed by committed steps.
  std::int64_t tokens(std::int64_t seq) const { return state_of(seq).n; }
  /// The prompt length the policies see (declared, or detected at the first decode step; while the
  /// sequence is still in its prefill, every committed token).
  std::int64_t prompt_tokens(std::int64_t seq) const { return state_of(seq).prompt_tokens(); }
  std::int64_t length(std::int64_t seq, int layer, int head) const {
    state_of(seq);  // an unknown sequence is the Cache's error, as on the device
    return alloc_.length(seq, layer, head);
  }
  std::int64_t total_length(std::int64_t seq) const {
    state_of(seq);
    std::int64_t total = 0;
    for (int l = 0; l < shape_.layers; ++l)
      for (int h = 0; h < shape_.kv_heads; ++h) total += alloc_.length(seq, l, h);
    return total;
  }
  /// Every entry of a head, in storage order: metadata, K and V (for tests and tools; O(length x d)).
  HeadContents head_contents(std::int64_t seq, int layer, int head) const {
    state_of(seq);
    checks_.layer(layer, "head_contents");
    checks_.head(head, "head_contents");
    const auto head_layout = alloc_.layout(seq, layer, head);
    const auto d = static_cast<std::size_t>(shape_.head_dim);
    HeadContents c;
    for (std::int64_t i = 0; i < head_layout.length; ++i) {
      const std::int64_t slot = head_layout.slot(i);
      c.meta.push_back(alloc_.pool().meta(slot));
      const storage_type* k = alloc_.pool().key(slot);
      const storage_type* v = alloc_.pool().value(slot);
      for (std::size_t j = 0; j < d; ++j) {
        c.keys.push_back(to_float(k[j]));
        c.values.push_back(to_float(v[j]));
      }
    }
    return c;
  }
  std::int64_t pages_free() const { return alloc_.pages_free(); }
  std::int64_t pages_total() const { return alloc_.pages_total(); }
  /// Metadata of entry i of a head, in storage order (not position order after compaction).
  EntryMeta entry(std::int64_t seq, int layer, int head, std::int64_t i) const {
    state_of(seq);
    const auto head_layout = alloc_.layout(seq, layer, head);
    require(i >= 0 && i < head_layout.length, "Cache::entry: index ", i, " out of range [0, ", head_layout.length, ")");
    return alloc_.pool().meta(head_layout.slot(i));
  }

  /// ---- one step, layer by layer ----------------------------------------------------------------
  /// keys/values [Hkv, T, d] post-RoPE, log_beta [Hkv, T] in [-inf, 0]. Every layer of a step appends
  /// the same T, once.
  /// gate [Hkv, T]: WG-KV's write gate g of each token (SPEC §3), for an Admitter that decides by
  /// it (admit::WriteGate); optional otherwise (every entry's g is then 1).
  void append(std::int64_t seq, int layer, View<const float, 3> keys, View<const float, 3> values,
              View<const float, 2> log_beta, View<const float, 2> gate = {}) {
    SequenceState& st = state_of(seq);
    const std::int64_t T = keys.dim(1);
    checks_.append(seq, st, layer, T);
    checks_.layer_inputs(layer, T, st.n, keys, values, log_beta, gate);
    require(alloc_.can_append(seq, T, layer), "Cache::append: out of memory: sequence ", seq, " layer ", layer,
            " cannot take ", T, " more entries per head (", alloc_.pages_free(), " of ", alloc_.pages_total(),
            " pages free)");
    try {
      write_layer(seq, st, layer, T, keys, values, log_beta, gate);
    } catch (...) {  // an Admitter or an allocation failed midway: take back this layer's entries
      drop_open_entries(seq, st, layer);
      throw;
    }
  }

  /// Sets the frozen score (SPEC §4) of the open step's entries at `layer`: scores [Hkv, T], finite
  /// or -inf, as append() takes them. For an engine whose score needs hidden states it has only
  /// after later layers (EpiKV's bands A and B): append with any placeholder, set the scores before
  /// commit(), which is where the trigger and the eviction read them. Only for a static-score Scorer;
  /// the Admitter decided at append(). Validated whole before any entry changes.
  void set_step_scores(std::int64_t seq, int layer, View<const float, 2> scores)
    requires scorer_static_score<S>
  {
    SequenceState& st = state_of(seq);
    checks_.layer(layer, "set_step_scores");
    require(st.pending > 0 && st.appended[static_cast<std::size_t>(layer)], "Cache::set_step_scores: layer ", layer,
            " of sequence ", seq, " has not been appended in an open step");
    require_shape(scores, {shape_.kv_heads, st.pending}, "Cache::set_step_scores: scores");
    detail::check_log_beta<S>(layer, st.n, scores, "Cache::set_step_scores");
    for (int h = 0; h < shape_.kv_heads; ++h) {
      // the open step's entries are a head's last ones: nothing compacts a head before commit()
      const auto head_layout = alloc_.layout(seq, layer, h);
      for (std::int64_t j = head_layout.length - 1; j >= 0; --j) {
        const std::int64_t slot = head_layout.slot(j);
        const std::int64_t t = alloc_.pool().meta(slot).position - st.n;
        if (t < 0) break;
        alloc_.pool().set_write_score(slot, scores(h, t));
      }
    }
  }

  /// queries [Hq, T, d] of this step's T tokens at `layer` (appended already) -> out [Hq, T, d].
  /// For a Scorer that ranks by attention mass (H2O) it also adds each key's attention probability
  /// from these queries to the key's metadata (abort_step takes it back).
  void attend(std::int64_t seq, int layer, View<const float, 3> queries, View<float, 3> out) {
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
    attend_layer(seq, st, layer, queries, out);
  }

  /// Closes the step: n += T, then the evictor's trigger and, if it fires, the eviction.
  EvictionReport commit(std::int64_t seq, std::vector<EvictedEntry>* evicted = nullptr) {
    SequenceState& st = state_of(seq);
    checks_.commit(seq, st, observes_attention);
    // Plan first (it may throw: a scorer that returns NaN), then change state: a commit that
    // throws leaves the step open and the cache as it was.
    const EvictionPlan plan = planner().plan(seq, st.context(), st.inputs);
    return close_step(seq, st, plan, evicted);
  }

  /// Discards the open step of `seq`: the entries its append() calls stored are removed and their
  /// pages go back to the pool, as if the step had never started. For an engine whose forward pass
  /// failed between append() and commit(). A sequence with no open step is left as it is (the call
  /// still scans its heads: O(entries)).
  void abort_step(std::int64_t seq) {
    SequenceState& st = state_of(seq);
    Inputs::abort(st.inputs, alloc_.pool());  // what the step's attention recorded, first
    drop_open_entries(seq, st, -1);
    st.end();
  }

  // ---- one step, every layer at once -----------------------------------------------------------
  /// keys/values [L, Hkv, T, d], log_beta [L, Hkv, T]; queries/out [L, Hq, T, d], or empty views to
  /// skip attention. One sequence's whole forward step (engine/step_state.hpp).
  using SequenceStep = kvpolicy::SequenceStep;

  /// Validated whole before anything is written.
  EvictionReport step(const SequenceStep& s, std::vector<EvictedEntry>* evicted = nullptr) {
    validate_step(s);
    require(alloc_.can_append(s.seq, s.keys.dim(2)), "Cache::step: out of memory: sequence ", s.seq, " cannot take ",
            s.keys.dim(2), " more entries in every head (", alloc_.pages_free(), " of ", alloc_.pages_total(),
            " pages free)");
    return run_step(s, evicted);
  }
  EvictionReport step(std::int64_t seq, View<const float, 4> keys, View<const float, 4> values,
                      View<const float, 3> log_beta, View<const float, 4> queries = {}, View<float, 4> out = {},
                      std::vector<EvictedEntry>* evicted = nullptr) {
    return step(SequenceStep{seq, keys, values, log_beta, queries, out}, evicted);
  }

  /// A batch of sequences, each with its own ragged cache and its own T. The whole batch is
  /// validated (distinct sequences, shapes, values, pool capacity for all of it) before any write,
  /// and every sequence's eviction is planned before any step closes: a failure validation cannot
  /// foresee (a user-defined Scorer returning NaN) takes back every step of the batch.
  std::vector<EvictionReport> step_batch(std::span<const SequenceStep> batch) {
    std::int64_t pages_needed = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      validate_step(batch[i]);
      for (std::size_t j = 0; j < i; ++j)
        require(batch[j].seq != batch[i].seq, "Cache::step_batch: sequence ", batch[i].seq, " appears twice");
      if constexpr (allocator_counts_pages<Alloc>)
        pages_needed += alloc_.pages_needed(batch[i].seq, batch[i].keys.dim(2));
      else
        require(alloc_.can_append(batch[i].seq, batch[i].keys.dim(2)), "Cache::step_batch: out of memory: sequence ",
                batch[i].seq, " cannot take ", batch[i].keys.dim(2), " more entries in every head");
    }
    require(pages_needed <= alloc_.pages_free(), "Cache::step_batch: out of memory: the batch needs ", pages_needed,
            " pages, ", alloc_.pages_free(), " of ", alloc_.pages_total(), " are free");
    std::vector<EvictionPlan> plans;
    std::vector<EvictionReport> reports;
    std::size_t started = 0;
    try {
      plans.reserve(batch.size());
      reports.reserve(batch.size());
      for (const auto& s : batch) {
        ++started;
        write_and_attend(s);
      }
      for (const auto& s : batch) {
        const SequenceState& st = state_of(s.seq);
        plans.push_back(planner().plan(s.seq, st.context(), st.inputs));
      }
    } catch (...) {
      for (std::size_t i = started; i-- > 0;) abort_step(batch[i].seq);  // last first: pages return in reverse
      throw;
    }
    for (std::size_t i = 0; i < batch.size(); ++i)
      reports.push_back(close_step(batch[i].seq, state_of(batch[i].seq), plans[i], nullptr));
    return reports;
  }

 private:
  /// The shared step state (engine/step_state.hpp) and what the sequence's attention recorded for
  /// the Scorer (engine/scorer_inputs.hpp).
  struct SequenceState : detail::StepState {
    typename Inputs::Sequence inputs;
  };
  using EvictionPlan = detail::EvictionPlan;
  detail::EvictionPlanner<S, A, E, Alloc> planner() const { return {shape_, alloc_, evictor_, scorer_, admitter_}; }

  void validate_step(const SequenceStep& s) const { checks_.step(s, state_of(s.seq), observes_attention); }
  void write_and_attend(const SequenceStep& s) {
    SequenceState& st = state_of(s.seq);
    const std::int64_t T = s.keys.dim(2);
    detail::for_each_layer(
        s, shape_.layers,
        [&](int l, auto keys, auto values, auto log_beta, auto gate) {
          write_layer(s.seq, st, l, T, keys, values, log_beta, gate);
        },
        [&](int l, auto queries, auto out) { attend_layer(s.seq, st, l, queries, out); });
  }
  EvictionReport run_step(const SequenceStep& s, std::vector<EvictedEntry>* evicted) {
    try {
      write_and_attend(s);
      return commit(s.seq, evicted);
    } catch (...) {  // whatever failed (a user Scorer, Admitter or Backend; an allocation), the step leaves no trace
      abort_step(s.seq);
      throw;
    }
  }

  // Removes the entries at positions >= n (the open step's) from every head of `layer` (every
  // layer for -1), last head first, so that pages go back to the pool in the reverse of the order
  // append took them and the free list is as it was.
  void drop_open_entries(std::int64_t seq, const SequenceState& st, int layer) {
    std::vector<std::uint8_t> keep;
    for (int l = shape_.layers - 1; l >= 0; --l) {
      if (layer >= 0 && l != layer) continue;
      for (int h = shape_.kv_heads - 1; h >= 0; --h) {
        const auto head_layout = alloc_.layout(seq, l, h);
        keep.assign(static_cast<std::size_t>(head_layout.length), 1);
        bool any = false;
        for (std::int64_t j = 0; j < head_layout.length; ++j)
          if (alloc_.pool().meta(head_layout.slot(j)).position >= st.n) {
            keep[static_cast<std::size_t>(j)] = 0;
            any = true;
          }
        if (any) alloc_.compact(seq, l, h, keep);
      }
    }
  }

  // The state change of a commit, after its eviction is planned: nothing in here can fail (the
  // report vector is grown first).
  EvictionReport close_step(std::int64_t seq, SequenceState& st, const EvictionPlan& plan,
                            std::vector<EvictedEntry>* evicted) {
    if (evicted != nullptr) evicted->reserve(evicted->size() + static_cast<std::size_t>(plan.evicted));
    // the first decode step fixes an undeclared prompt (SPEC §4 protects it from then on)
    st.commit(plan.context);  // n += T; the first decode step fixes an undeclared prompt (SPEC §4)
    Inputs::commit(st.inputs);
    return apply_eviction(seq, plan, evicted);
  }

  const SequenceState& state_of(std::int64_t seq) const { return state_.at(seq); }
  SequenceState& state_of(std::int64_t seq) { return state_.at(seq); }
  void write_layer(std::int64_t seq, SequenceState& st, int layer, std::int64_t T, View<const float, 3> keys,
                   View<const float, 3> values, View<const float, 2> log_beta, View<const float, 2> gate) {
    const int d = shape_.head_dim;
    std::vector<EntryMeta> meta;
    std::vector<float> k_kept, v_kept;
    for (int h = 0; h < shape_.kv_heads; ++h) {
      meta.clear();
      bool dropped = false;
      for (std::int64_t t = 0; t < T; ++t) {
        const EntryMeta m{static_cast<std::int32_t>(st.n + t), log_beta(h, t),
                          S::needs_key_norm ? memory::key_norm(&keys(h, t, 0), d) : 0.0f, 0.0f,
                          gate.data != nullptr ? gate(h, t) : 1.0f};
        // keep (and local, for allocators without a ring) store the entry; drop never does
        if (admitter_.admit(m) == Admission::drop) {
          dropped = true;
          continue;
        }
        meta.push_back(m);
      }
      if (!dropped) {  // the common case: the head's [T, d] rows go straight from the caller's buffers
        alloc_.append(seq, layer, h, T, &keys(h, 0, 0), &values(h, 0, 0), meta.data());
        continue;
      }
      k_kept.clear();
      v_kept.clear();
      for (const EntryMeta& m : meta) {
        const std::int64_t t = m.position - st.n;
        k_kept.insert(k_kept.end(), &keys(h, t, 0), &keys(h, t, 0) + d);
        v_kept.insert(v_kept.end(), &values(h, t, 0), &values(h, t, 0) + d);
      }
      alloc_.append(seq, layer, h, static_cast<std::int64_t>(meta.size()), k_kept.data(), v_kept.data(), meta.data());
    }
    st.pending = T;
    st.appended[static_cast<std::size_t>(layer)] = 1;
  }

  void attend_layer(std::int64_t seq, SequenceState& st, int layer, View<const float, 3> queries,
                    View<float, 3> out) {
    Inputs::record_queries(st.inputs, layer, queries, st.n);
    st.attended[static_cast<std::size_t>(layer)] = 1;
    std::vector<std::int32_t> q_pos(static_cast<std::size_t>(st.pending));
    for (std::int64_t t = 0; t < st.pending; ++t) q_pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(st.n + t);
    // WG-KV's vertical-slash mask, SPEC §3: from its Evictor, or from an Admitter with a ring; else causal
    const AttentionMask mask = composed_attention_mask(evictor_, admitter_);
    // One task per kv head: each writes its own query heads of `out` and its own mass vector.
    std::vector<std::vector<float>> mass(Inputs::needs_mass ? static_cast<std::size_t>(shape_.kv_heads) : 0);
    const auto attend_head = [&](int h) {
      const auto head_layout = alloc_.layout(seq, layer, h);
      std::span<float> key_mass;  // each key's probability, summed over every query so far (H2O)
      if constexpr (Inputs::needs_mass) {
        auto& m = mass[static_cast<std::size_t>(h)];
        m.assign(static_cast<std::size_t>(head_layout.length), 0.0f);
        key_mass = m;
      }
      B::attend(std::as_const(alloc_).pool(), head_layout, h, shape_.group(), queries, q_pos, out, key_mass, mask);
    };
    detail::for_each_kv_head<B>(shape_.kv_heads, attention_work(seq, layer, st.pending), attend_head);
    if constexpr (Inputs::needs_mass)  // applied in head order, undone by abort_step
      for (int h = 0; h < shape_.kv_heads; ++h)
        Inputs::add_mass(st.inputs, alloc_.pool(), alloc_.layout(seq, layer, h), mass[static_cast<std::size_t>(h)]);
  }

  /// (query rows) x (entries) over the layer's kv heads: what decides whether threads pay off.
  std::int64_t attention_work(std::int64_t seq, int layer, std::int64_t T) const {
    std::int64_t entries = 0;
    for (int h = 0; h < shape_.kv_heads; ++h) entries += alloc_.length(seq, layer, h);
    return entries * T * shape_.group();
  }


  /// Compacts every active head by the plan's keep flags.
  EvictionReport apply_eviction(std::int64_t seq, const EvictionPlan& plan, std::vector<EvictedEntry>* evicted) {
    EvictionReport report;
    report.triggered = plan.triggered;
    if (!plan.removes_any) return report;
    for (int l = 0; l < shape_.layers; ++l)
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const auto i = static_cast<std::size_t>(head_index(shape_, l, h));
        if (!plan.active[i]) continue;
        const auto seg = std::span<const std::uint8_t>(plan.keep).subspan(static_cast<std::size_t>(plan.offsets[i]),
                                                                           static_cast<std::size_t>(plan.lengths[i]));
        if (evicted != nullptr)
          for (std::int64_t j = 0; j < plan.lengths[i]; ++j)
            if (!seg[static_cast<std::size_t>(j)])
              evicted->push_back({l, h, plan.position[static_cast<std::size_t>(plan.offsets[i] + j)]});
        report.evicted += alloc_.compact(seq, l, h, seg);
      }
    return report;
  }

  CacheShape shape_;
  detail::StepChecks<S, A, storage_type> checks_;
  Alloc alloc_;
  E evictor_;
  S scorer_;
  A admitter_;
  detail::Sequences<SequenceState> state_;
};

}  // namespace kvpolicy
