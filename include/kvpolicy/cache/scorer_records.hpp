/// \file
/// kvpolicy/cache/scorer_records.hpp — a Scorer's record as the Cache keeps it: the state a
/// RecordingScorer declares for a sequence (core/concepts.hpp) stored beside the sequence and handed
/// to the Scorer's own hooks, each with its default where the Scorer declares none, so that the
/// Cache and the planner name no kind of record; and the head's entries gathered for the form the
/// Scorer scores in:
///   - `operator()(meta, ctx)` (EntryScorer): the entry's metadata alone;
///   - `score_head(keys, metas, ctx, out)` (HeadScorer): the head's keys in fp32 (KeyDiff, SPEC §5);
///   - `score_recorded(record, HeadEntries, ctx, out)` (RecordScorer): its record and the head's
///     entries, with the K/V it declares in head_data (SnapKV's window, SPEC §5; Expected
///     Attention's query moments).
/// Over engine-owned K/V the pool holds no keys: a Scorer that reads them reads the engine's
/// (core/engine_keys.hpp, SPEC §9), by each entry's position.
/// What a step's attention recorded is the open step's until the step closes: a step taken back
/// (Cache::abort_step) discards it, and the Scorer puts back what it changed in the entries' fields.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/record.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/core/engine_keys.hpp"

namespace kvpolicy::detail {

/// The record of a Scorer that records nothing.
struct NoRecord {};
/// A Scorer's record type: its Record, or NoRecord.
template <class S, bool = RecordingScorer<S>>
struct RecordOf {
  using type = NoRecord;
};
template <class S>
struct RecordOf<S, true> {
  using type = typename S::Record;
};

template <Scorer S>
class ScorerRecords {
  static constexpr bool records = RecordingScorer<S>;
  static constexpr EntryData data = head_data_of<S>();

 public:
  /// The attention feeds the Scorer: every step attends, each layer once.
  static constexpr bool observes_attention = scorer_observes_attention<S>;
  /// The attention must hand each key's probability to the Scorer (Backend::attend's mass span).
  static constexpr bool needs_mass = scorer_records_mass<S>;

  /// One sequence's record: the Scorer's Record, or nothing.
  using Sequence = typename RecordOf<S>::type;

  /// The Scorer's checks against the shape, at the Cache's construction.
  static void validate(const S& scorer, const CacheShape& shape) {
    if constexpr (requires { scorer.validate_shape(shape); }) scorer.validate_shape(shape);
  }

  /// A sequence whose prompt is `prompt_tokens` long (-1: not declared).
  static Sequence start(const S& scorer, const CacheShape& shape, std::int64_t prompt_tokens) {
    if constexpr (records)
      return scorer.open_record(shape, prompt_tokens);
    else
      return {};
  }

  /// A step opens at position `first`; `probe`: it is a probe (SPEC §10).
  static void open_step(const S& scorer, Sequence& s, std::int64_t first, bool probe) {
    if constexpr (requires { scorer.open_probe(s, first); })
      if (probe) return scorer.open_probe(s, first);
    if constexpr (requires { scorer.open_step(s, first); }) scorer.open_step(s, first);
  }

  /// A layer's queries of the open step, starting at position `first`.
  static void record_queries(const S& scorer, Sequence& s, int layer, View<const float, 3> queries, std::int64_t first) {
    if constexpr (scorer_records_queries<S>) scorer.record_queries(s, layer, queries, first);
  }

  /// A kv head's attention of the open step: mass[j], the probability its queries gave entry j
  /// (slot slots[j]).
  static void record_mass(const S& scorer, Sequence& s, EntryFields fields, std::span<const std::int64_t> slots,
                          std::span<const float> mass) {
    if constexpr (scorer_records_mass<S>) scorer.record_mass(s, fields, slots, mass);
  }

  /// The open step closed: what it recorded stays.
  static void commit(const S& scorer, Sequence& s) {
    if constexpr (records) scorer.commit_record(s);
  }

  /// The open step taken back: what it recorded goes (before its entries leave, so that the fields
  /// it changed are put back where they are).
  static void abort(const S& scorer, Sequence& s, EntryFields fields) {
    if constexpr (records) scorer.discard_record(s, fields);
  }

  /// Scores the entries `stored` (indices in storage order) of one head of `layer` at `ctx` into
  /// `out`, in the form the Scorer declares. Over a pool without K/V (engine-owned), the keys a
  /// Scorer reads come from `engine` (sequence `seq`), which the Cache made sure it has.
  template <class Pool, class Layout>
  void score_head(const S& scorer, const Sequence& s, const Pool& pool, const Layout& head,
                  std::span<const std::int64_t> stored, int layer, int kv_head, int group, StepContext ctx,
                  std::span<float> out, const EngineKeys* engine = nullptr, std::int64_t seq = 0) {
    const std::size_t len = stored.size();
    if constexpr (RecordScorer<S>) {
      bool reads = data.keys || data.values;
      if constexpr (requires { { scorer.reads_kv(ctx) } -> std::same_as<bool>; }) reads = reads && scorer.reads_kv(ctx);
      gather_meta(pool, head, stored);
      HeadEntries entries{std::span<const EntryMeta>(meta_), {}, {}, layer, kv_head, group};
      if (reads) {
        if constexpr (!requires(const Pool& p) { p.key(0); }) {
          static_assert(!data.values, "a Scorer that reads stored values cannot run over engine-owned K/V");
          entries.keys = engine_keys(engine, seq, layer, kv_head, pool.head_dim());
        } else {
          if constexpr (data.keys) entries.keys = gather(pool, head, stored, keys_, [&](std::int64_t slot) { return pool.key(slot); });
          if constexpr (data.values)
            entries.values = gather(pool, head, stored, values_, [&](std::int64_t slot) { return pool.value(slot); });
        }
      }
      scorer.score_recorded(s, entries, ctx, out);
    } else if constexpr (HeadScorer<S>) {
      gather_meta(pool, head, stored);
      View<const float, 2> keys;
      if constexpr (!requires(const Pool& p) { p.key(0); })
        keys = engine_keys(engine, seq, layer, kv_head, pool.head_dim());
      else
        keys = gather(pool, head, stored, keys_, [&](std::int64_t slot) { return pool.key(slot); });
      scorer.score_head(keys, std::span<const EntryMeta>(meta_), ctx, out);
    } else {
      for (std::size_t j = 0; j < len; ++j) out[j] = scorer(pool.meta(head.slot(stored[j])), ctx);
    }
  }

 private:
  template <class Pool, class Layout>
  void gather_meta(const Pool& pool, const Layout& head, std::span<const std::int64_t> stored) {
    meta_.resize(stored.size());
    for (std::size_t j = 0; j < stored.size(); ++j) meta_[j] = pool.meta(head.slot(stored[j]));
  }
  /// The keys of the gathered entries (meta_) where the engine keeps them, in fp32 into keys_.
  View<const float, 2> engine_keys(const EngineKeys* engine, std::int64_t seq, int layer, int kv_head, int d) {
    require(engine != nullptr && engine->row, "score_head: this Scorer reads stored keys, the pool holds none "
            "(engine-owned K/V) and the engine gave none");  // the Cache requires them first
    return memory::read_engine_keys(*engine, seq, layer, kv_head, std::span<const EntryMeta>(meta_), d, keys_);
  }
  /// The rows row(slot) of the listed entries, in fp32, into `buffer`: [N, d].
  template <class Pool, class Layout, class Row>
  static View<const float, 2> gather(const Pool& pool, const Layout& head, std::span<const std::int64_t> stored,
                                     std::vector<float>& buffer, Row row) {
    const auto d = static_cast<std::size_t>(pool.head_dim());
    buffer.resize(stored.size() * d);
    for (std::size_t j = 0; j < stored.size(); ++j) {
      const auto* r = row(head.slot(stored[j]));
      for (std::size_t c = 0; c < d; ++c) buffer[j * d + c] = to_float(r[c]);
    }
    return View<const float, 2>{buffer.data(), {static_cast<std::int64_t>(stored.size()), static_cast<std::int64_t>(d)}};
  }

  // scratch of score_head, kept between heads
  std::vector<EntryMeta> meta_;
  std::vector<float> keys_, values_;
};

}  // namespace kvpolicy::detail
