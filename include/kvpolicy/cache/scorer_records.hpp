/// \file
/// kvpolicy/cache/scorer_records.hpp — a Scorer's records: what it reads beyond its entries'
/// metadata, and the state a sequence keeps for it between steps, chosen by the hooks it declares
/// (core/concepts.hpp), so that the Cache names no policy family:
///   - `operator()(meta, ctx)` (EntryScorer): the entry's metadata alone;
///   - `score_head(keys, metas, ctx, out)` (HeadScorer): the head's keys in fp32 (KeyDiff, SPEC §5);
///   - `score_window(keys, metas, ctx, window, out)` (WindowScorer): the keys and the last W
///     queries of the layer, which the attention records (SnapKV, SPEC §5);
///   - `score_moments(keys, values, metas, ctx, moments, out)` (MomentsScorer): the keys, the values
///     and the moments of the layer's queries before RoPE, which the attention records (Expected
///     Attention, docs/policies.md);
///   - Field::attention_mass declared: the attention adds each key's probability to that field (H2O,
///     SPEC §5).
/// What the attention records is the open step's until the step closes: a step taken back
/// (Cache::abort_step) restores the windows and the mass as they were.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/memory/query_statistics.hpp"
#include "kvpolicy/memory/query_window.hpp"

namespace kvpolicy::detail {

template <Scorer S>
class ScorerRecords {
 public:
  /// The attention feeds the Scorer: every step attends, each layer once.
  static constexpr bool observes_attention = scorer_needs_attention_mass<S> || WindowScorer<S> || MomentsScorer<S>;
  /// The attention must hand back each key's probability (Backend::attend's mass span).
  static constexpr bool needs_mass = scorer_needs_attention_mass<S>;

  /// One sequence's records.
  struct Sequence {
    std::vector<memory::QueryWindow> windows;               // per layer, for a WindowScorer only
    std::vector<memory::QueryStatistics> moments;           // per layer, for a MomentsScorer only
    std::vector<std::pair<std::int64_t, float>> mass_undo;  // (slot, mass before) of the open step
  };

  /// What the records need of the shape: the RoPE a MomentsScorer undoes pairs d's components.
  static void validate(const S& scorer, const CacheShape& shape) {
    if constexpr (MomentsScorer<S>) scorer.query_rope().validate(shape.head_dim);
  }

  /// A sequence whose prompt is `prompt_tokens` long (-1: not declared).
  static Sequence start(const S& scorer, const CacheShape& shape, std::int64_t prompt_tokens) {
    Sequence s;
    if constexpr (WindowScorer<S>)
      s.windows.assign(static_cast<std::size_t>(shape.layers),
                       memory::QueryWindow(scorer.observation_window, shape.q_heads, shape.head_dim));
    if constexpr (MomentsScorer<S>)
      s.moments.assign(static_cast<std::size_t>(shape.layers),
                       memory::QueryStatistics(shape.q_heads, shape.head_dim, scorer.query_rope(),
                                               scorer.query_moments_from(), prompt_tokens));
    return s;
  }

  /// A layer's queries of the open step, starting at position `first`.
  static void record_queries(Sequence& s, int layer, View<const float, 3> queries, std::int64_t first) {
    if constexpr (WindowScorer<S>) s.windows[static_cast<std::size_t>(layer)].push(queries, first);
    if constexpr (MomentsScorer<S>) s.moments[static_cast<std::size_t>(layer)].push(queries, first);
  }

  /// Adds a head's attention probabilities (mass[j] for its entry j) to the pool, remembering
  /// each slot's mass before.
  template <class Pool, class Layout>
  static void add_mass(Sequence& s, Pool& pool, const Layout& head, std::span<const float> mass) {
    for (std::int64_t j = 0; j < head.length; ++j) {
      const std::int64_t slot = head.slot(j);
      s.mass_undo.emplace_back(slot, field_of(pool.meta(slot), Field::attention_mass));
      pool.add_to_field(slot, Field::attention_mass, mass[static_cast<std::size_t>(j)]);
    }
  }

  /// The open step closed: what it recorded stays.
  static void commit(Sequence& s) {
    for (auto& w : s.windows) w.commit();
    for (auto& m : s.moments) m.commit();
    s.mass_undo.clear();
  }

  /// The open step taken back: what it recorded goes (the mass first, before its entries leave).
  template <class Pool>
  static void abort(Sequence& s, Pool& pool) {
    if constexpr (scorer_needs_attention_mass<S>)
      for (auto it = s.mass_undo.rbegin(); it != s.mass_undo.rend(); ++it) pool.set_field(it->first, Field::attention_mass, it->second);
    for (auto& w : s.windows) w.discard();
    for (auto& m : s.moments) m.discard();
    s.mass_undo.clear();
  }

  /// Scores the entries `stored` (indices in storage order) of one head of `layer` at `ctx` into
  /// `out`, through the hook the Scorer declares.
  template <class Pool, class Layout>
  void score_head(const S& scorer, const Sequence& s, const Pool& pool, const Layout& head,
                  std::span<const std::int64_t> stored, int layer, int kv_head, int group, StepContext ctx,
                  std::span<float> out) {
    const std::size_t len = stored.size();
    if constexpr (WindowScorer<S> && requires { { scorer.reads_window(ctx) } -> std::same_as<bool>; }) {
      if (!scorer.reads_window(ctx)) {  // this step's scores need only the metadata: no keys, no queries
        meta_.resize(len);
        for (std::size_t j = 0; j < len; ++j) meta_[j] = pool.meta(head.slot(stored[j]));
        scorer.score_window(View<const float, 2>{}, std::span<const EntryMeta>(meta_), ctx, ObservedQueries{}, out);
        return;
      }
    }
    if constexpr (!requires(const Pool& p) { p.key(0); }) {
      // a pool without K/V (engine_owned): the Cache refused every Scorer that would get here
      if constexpr (scorer_needs_head_keys<S> || WindowScorer<S> || MomentsScorer<S>)
        fail("score_head: this Scorer reads stored keys, and the pool holds none (engine-owned K/V)");
      else
        for (std::size_t j = 0; j < len; ++j) out[j] = scorer(pool.meta(head.slot(stored[j])), ctx);
    } else if constexpr (scorer_needs_head_keys<S> || WindowScorer<S> || MomentsScorer<S>) {
      const auto d = static_cast<std::size_t>(pool.head_dim());
      meta_.resize(len);
      keys_.resize(len * d);
      for (std::size_t j = 0; j < len; ++j) {
        const std::int64_t slot = head.slot(stored[j]);
        meta_[j] = pool.meta(slot);
        const auto* k = pool.key(slot);
        for (std::size_t c = 0; c < d; ++c) keys_[j * d + c] = to_float(k[c]);
      }
      const View<const float, 2> keys{keys_.data(), {static_cast<std::int64_t>(len), static_cast<std::int64_t>(d)}};
      if constexpr (MomentsScorer<S>) {
        values_.resize(len * d);
        for (std::size_t j = 0; j < len; ++j) {
          const auto* v = pool.value(head.slot(stored[j]));
          for (std::size_t c = 0; c < d; ++c) values_[j * d + c] = to_float(v[c]);
        }
        scorer.score_moments(keys, View<const float, 2>{values_.data(), keys.shape}, std::span<const EntryMeta>(meta_),
                             ctx, s.moments[static_cast<std::size_t>(layer)].moments(kv_head, group, moments_), out);
      } else if constexpr (WindowScorer<S>)
        scorer.score_window(keys, std::span<const EntryMeta>(meta_), ctx,
                            s.windows[static_cast<std::size_t>(layer)].ordered(kv_head, group, window_, window_positions_),
                            out);
      else
        scorer.score_head(keys, std::span<const EntryMeta>(meta_), ctx, out);
    } else {
      for (std::size_t j = 0; j < len; ++j) out[j] = scorer(pool.meta(head.slot(stored[j])), ctx);
    }
  }

 private:
  // scratch of score_head, kept between heads
  std::vector<EntryMeta> meta_;
  std::vector<float> keys_, values_, window_;
  std::vector<double> moments_;
  std::vector<std::int32_t> window_positions_;
};

}  // namespace kvpolicy::detail
