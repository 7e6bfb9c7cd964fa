/// \file
/// kvpolicy/cpu/executor.hpp — what cpu_backend does for a Cache (cache.hpp): its entries live in
/// the Allocator's host pool, its attention runs per kv head through the Backend's attend(), and
/// its eviction is the host planner's plan (cache/planner.hpp) applied by compaction. The Cache
/// has checked every argument before it calls in here; a call that throws here (an Admitter, an
/// allocation) takes back what it wrote.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/parallel.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/cpu/softmax_partial.hpp"
#include "kvpolicy/cache/planner.hpp"
#include "kvpolicy/cache/scorer_records.hpp"
#include "kvpolicy/cache/step_state.hpp"
#include "kvpolicy/core/engine_keys.hpp"
#include "kvpolicy/memory/pool.hpp"

namespace kvpolicy::cpu {

/// One Cache's host memory and its steps over it, for the Backend B (its attend()).
template <class B, Scorer S, Admitter A, Evictor E, Allocator Alloc>
class Executor {
  static_assert(!scorer_records_mass<S> || requires(Alloc& a) {
    { a.pool().fields() } -> std::same_as<EntryFields>;
  }, "kvpolicy::Cache: this Scorer records the attention mass, and this Allocator's pool cannot hand its fields over");
  using Records = detail::ScorerRecords<S>;
  // what the pool carries per entry beside position and write score: what the parts declare
  static constexpr FieldSet fields = composed_fields<S, A>;

 public:
  using storage_type = typename Alloc::storage_type;
  /// What the executor keeps per sequence beside the Cache's step state: nothing (the Allocator
  /// keys its heads by the sequence id).
  struct Sequence {};
  /// The plans of the sequences whose steps close together (one per sequence, in order).
  using Plan = detail::HostPlan;

  Executor(const CacheShape& shape, Alloc allocator, const E& evictor, const S& scorer, const A& admitter,
           typename B::Options)
      : shape_(shape), alloc_(std::move(allocator)), evictor_(evictor), scorer_(scorer), admitter_(admitter) {
    alloc_.bind(shape_);
  }

  const E& evictor() const { return evictor_; }
  const S& scorer() const { return scorer_; }
  const A& admitter() const { return admitter_; }
  const Alloc& allocator() const { return alloc_; }

  // ---- sequences and what they hold --------------------------------------------------------------
  Sequence add_sequence(std::int64_t seq) {
    alloc_.add_sequence(seq);
    return {};
  }
  void remove_sequence(std::int64_t seq, Sequence&) { alloc_.remove_sequence(seq); }
  std::int64_t length(std::int64_t seq, const Sequence&, int layer, int head) const {
    return alloc_.length(seq, layer, head);
  }
  /// Every head's length, in head_index order.
  std::vector<std::int64_t> lengths(std::int64_t seq, const Sequence&) const {
    std::vector<std::int64_t> len(static_cast<std::size_t>(shape_.heads_total()));
    for (int l = 0; l < shape_.layers; ++l)
      for (int h = 0; h < shape_.kv_heads; ++h) len[static_cast<std::size_t>(head_index(shape_, l, h))] = alloc_.length(seq, l, h);
    return len;
  }
  EntryMeta entry(std::int64_t seq, const Sequence&, int layer, int head, std::int64_t i) const {
    const auto head_layout = alloc_.layout(seq, layer, head);
    require(i >= 0 && i < head_layout.length, "Cache::entry: index ", i, " out of range [0, ", head_layout.length, ")");
    return alloc_.pool().meta(head_layout.slot(i));
  }
  HeadContents head_contents(std::int64_t seq, const Sequence&, int layer, int head) const {
    const auto head_layout = alloc_.layout(seq, layer, head);
    const auto d = static_cast<std::size_t>(shape_.head_dim);
    HeadContents c;
    for (std::int64_t i = 0; i < head_layout.length; ++i) {
      const std::int64_t slot = head_layout.slot(i);
      c.meta.push_back(alloc_.pool().meta(slot));
      if constexpr (!stores_kv_v<storage_type>) continue;  // the engine holds K/V
      else {
      const storage_type* k = alloc_.pool().key(slot);
      const storage_type* v = alloc_.pool().value(slot);
      for (std::size_t j = 0; j < d; ++j) {
        c.keys.push_back(to_float(k[j]));
        c.values.push_back(to_float(v[j]));
      }
      }
    }
    return c;
  }
  std::int64_t pages_free() const { return alloc_.pages_free(); }
  std::int64_t pages_total() const { return alloc_.pages_total(); }
  /// Whether every head can take T more entries (a whole step).
  bool can_step(std::int64_t seq, const Sequence&, std::int64_t T) const { return alloc_.can_append(seq, T); }
  /// The free pages a step of T more tokens takes, where the Allocator counts them; else the step is
  /// checked alone (refused here when it does not fit) and counts 0.
  std::int64_t batch_pages(std::int64_t seq, const Sequence&, std::int64_t T) const {
    if constexpr (allocator_counts_pages<Alloc>) {
      return alloc_.pages_needed(seq, T);
    } else {
      require(alloc_.can_append(seq, T), "Cache::step_batch: out of memory: sequence ", seq, " cannot take ", T,
              " more entries in every head");
      return 0;
    }
  }

  // ---- one step ----------------------------------------------------------------------------------
  /// The layer's T tokens at positions n..n+T-1, as the Admitter admits them: all of them or, when
  /// this throws, none.
  void append(std::int64_t seq, Sequence&, int layer, std::int64_t n, std::int64_t T, View<const float, 3> keys,
              View<const float, 3> values, View<const float, 2> write_score, View<const float, 2> gate, bool) {
    require(alloc_.can_append(seq, T, layer), "Cache::append: out of memory: sequence ", seq, " layer ", layer,
            " cannot take ", T, " more entries per head (", alloc_.pages_free(), " of ", alloc_.pages_total(),
            " pages free)");
    try {
      write_layer(seq, layer, n, T, keys, values, write_score, gate);
    } catch (...) {  // an Admitter or an allocation failed midway: take back this layer's entries
      drop_open_entries(seq, n, layer);
      throw;
    }
  }

  /// The frozen scores of the open step's entries at `layer` (SPEC §4), checked by the Cache.
  void set_step_scores(std::int64_t seq, Sequence&, int layer, std::int64_t n, View<const float, 2> scores) {
    for (int h = 0; h < shape_.kv_heads; ++h) {
      // the open step's entries are a head's last ones: nothing compacts a head before commit()
      const auto head_layout = alloc_.layout(seq, layer, h);
      for (std::int64_t j = head_layout.length - 1; j >= 0; --j) {
        const std::int64_t slot = head_layout.slot(j);
        const std::int64_t t = alloc_.pool().meta(slot).position - n;
        if (t < 0) break;
        alloc_.pool().set_write_score(slot, scores(h, t));
      }
    }
  }

  /// queries [Hq, T, d] at positions n..n+T-1 over the layer's entries -> out; each key's
  /// probability, for a Scorer that records the mass, handed to its hook (which abort takes back).
  void attend(std::int64_t seq, Sequence&, typename Records::Sequence& records, int layer, std::int64_t n,
              std::int64_t T, View<const float, 3> queries, View<float, 3> out) {
    std::vector<std::int32_t> q_pos(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) q_pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(n + t);
    const AttentionMask mask = composed_attention_mask(evictor_, admitter_);
    if constexpr (!Records::needs_mass && requires { B::decode_range; })
      if (std::int64_t{shape_.group()} * T <= B::decode_rows) return attend_split(seq, layer, q_pos, queries, out, mask);
    // One task per kv head: each writes its own query heads of `out` and its own mass vector.
    std::vector<std::vector<float>> mass(Records::needs_mass ? static_cast<std::size_t>(shape_.kv_heads) : 0);
    const auto attend_head = [&](int h) {
      const auto head_layout = alloc_.layout(seq, layer, h);
      std::span<float> key_mass;  // each key's probability, summed over every query so far (H2O)
      if constexpr (Records::needs_mass) {
        auto& m = mass[static_cast<std::size_t>(h)];
        m.assign(static_cast<std::size_t>(head_layout.length), 0.0f);
        key_mass = m;
      }
      B::attend(std::as_const(alloc_).pool(), head_layout, h, shape_.group(), queries, q_pos, out, key_mass, mask);
    };
    detail::for_each_kv_head<B>(shape_.kv_heads, attention_work(seq, layer, T), attend_head);
    if constexpr (Records::needs_mass) {  // recorded in head order, undone by abort
      std::vector<std::int64_t> slots;
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const auto head_layout = alloc_.layout(seq, layer, h);
        slots.resize(static_cast<std::size_t>(head_layout.length));
        for (std::int64_t j = 0; j < head_layout.length; ++j) slots[static_cast<std::size_t>(j)] = head_layout.slot(j);
        Records::record_mass(scorer_, records, alloc_.pool().fields(), slots, mass[static_cast<std::size_t>(h)]);
      }
    }
  }

  // ---- over engine-owned K/V (SPEC §9) ---------------------------------------------------------
  /// Where the engine keeps the keys a Scorer reads (the pool holds none).
  void use_engine_keys(EngineKeys keys)
    requires(!stores_kv_v<storage_type>)
  {
    engine_keys_ = std::move(keys);
  }
  bool has_engine_keys() const { return static_cast<bool>(engine_keys_.row); }

  /// The engine's attention of this step at `layer` as the Scorer records it, over the engine's
  /// keys: queries [Hq, T, d] at positions n..n+T-1. Each head's keys are read from the engine
  /// (all of them before any attention, so that a key the engine lacks throws with nothing
  /// recorded) into a pool of their own type, and attended by the Backend's attend() as a pool
  /// that stores them would be (values zero, the output dropped): each key's probability is the
  /// one a cache storing the same keys hands its Scorer. `record_queries` (the Cache's) runs once
  /// the mass is made and before it is recorded.
  template <class RecordQueries>
  void observe(std::int64_t seq, Sequence&, typename Records::Sequence& records, int layer, std::int64_t n,
               std::int64_t T, View<const float, 3> queries, RecordQueries&& record_queries)
    requires(!stores_kv_v<storage_type>)
  {
    if constexpr (Records::needs_mass)
      memory::with_key_type(engine_keys_.type, [&]<class K>(std::type_identity<K>) {
        observe_mass<K>(seq, records, layer, n, T, queries, record_queries);
      });
    else
      record_queries();
  }

  /// Takes back the open step (entries at positions >= n) and what its attention recorded. It scans
  /// every head whether or not a step is open (a layer's append takes its own entries back).
  void abort(std::int64_t seq, Sequence& m, typename Records::Sequence& records, std::int64_t n, bool) {
    discard_record(m, records);  // the record first, while its entries are there
    drop_open_entries(seq, n, -1);
  }

  /// What the open step recorded goes, its entries staying (a probe's commit, SPEC §10: after its
  /// plan read the record, before the plan's compaction moves the slots the record names).
  void discard_record(Sequence&, typename Records::Sequence& records) {
    if constexpr (requires { alloc_.pool().fields(); })
      Records::abort(scorer_, records, alloc_.pool().fields());
    else
      Records::abort(scorer_, records, EntryFields{});
  }

  // ---- eviction: plan, then apply ----------------------------------------------------------------
  /// What one sequence's commit asks the planner for.
  struct Request {
    std::int64_t seq;
    const Sequence* memory;
    StepContext context;
    const typename Records::Sequence* records;
  };
  /// Every request's eviction (SPEC §1–5), planned and not applied; throws (a NaN score) with
  /// nothing changed.
  Plan plan(std::span<const Request> requests) const {
    detail::HostPlanner<S, A, E, Alloc> planner{shape_, alloc_, evictor_, scorer_, admitter_,
                                                stores_kv_v<storage_type> ? nullptr : &engine_keys_};
    return planner.plan(requests);
  }
  /// Compacts every planned head; nothing in here can fail but the evicted list's growth, which
  /// comes first.
  std::vector<EvictionReport> apply(const Plan& p, std::vector<EvictedEntry>* evicted) {
    if (evicted != nullptr) {
      std::int64_t total = 0;
      for (const auto& plan : p.plans) total += plan.evicted;
      evicted->reserve(evicted->size() + static_cast<std::size_t>(total));
    }
    std::vector<EvictionReport> reports(p.plans.size());
    for (std::size_t i = 0; i < p.plans.size(); ++i) reports[i] = apply_one(p.seqs[i], p.plans[i], evicted);
    return reports;
  }

 private:
  template <class K, class RecordQueries>
  void observe_mass(std::int64_t seq, typename Records::Sequence& records, int layer, std::int64_t n, std::int64_t T,
                    View<const float, 3> queries, RecordQueries& record_queries) {
    const int d = shape_.head_dim;
    std::vector<memory::EntryPool<K>> heads(static_cast<std::size_t>(shape_.kv_heads));
    std::vector<std::vector<std::int64_t>> slots(heads.size());
    std::vector<float> key(static_cast<std::size_t>(d)), zero(static_cast<std::size_t>(d), 0.0f);
    for (int h = 0; h < shape_.kv_heads; ++h) {
      const auto head_layout = alloc_.layout(seq, layer, h);
      auto& pool = heads[static_cast<std::size_t>(h)];
      auto& s = slots[static_cast<std::size_t>(h)];
      pool.resize(head_layout.length, d);
      for (std::int64_t j = 0; j < head_layout.length; ++j) {
        s.push_back(head_layout.slot(j));
        const EntryMeta& m = alloc_.pool().meta(s.back());
        const auto* row = static_cast<const K*>(memory::engine_key_row(engine_keys_, seq, layer, h, m.position));
        for (int c = 0; c < d; ++c) key[static_cast<std::size_t>(c)] = to_float(row[c]);
        pool.write(j, key.data(), zero.data(), m);
      }
    }
    std::vector<std::int32_t> q_pos(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) q_pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(n + t);
    std::vector<float> dropped(static_cast<std::size_t>(queries.size()));
    const View<float, 3> out(dropped.data(), {queries.dim(0), queries.dim(1), queries.dim(2)});
    std::vector<std::vector<float>> mass(heads.size());
    const AttentionMask mask = composed_attention_mask(evictor_, admitter_);
    detail::for_each_kv_head<B>(shape_.kv_heads, attention_work(seq, layer, T), [&](int h) {
      const auto& pool = heads[static_cast<std::size_t>(h)];
      const std::array<std::int32_t, 1> one_page{0};
      const memory::HeadLayout all{one_page, std::max<std::int64_t>(pool.slots(), 1), pool.slots()};
      auto& m = mass[static_cast<std::size_t>(h)];
      m.assign(static_cast<std::size_t>(pool.slots()), 0.0f);
      B::attend(pool, all, h, shape_.group(), queries, q_pos, out, m, mask);
    });
    record_queries();
    for (int h = 0; h < shape_.kv_heads; ++h)  // recorded in head order, undone by abort
      Records::record_mass(scorer_, records, alloc_.pool().fields(), slots[static_cast<std::size_t>(h)],
                           mass[static_cast<std::size_t>(h)]);
  }

  void write_layer(std::int64_t seq, int layer, std::int64_t n, std::int64_t T, View<const float, 3> keys,
                   View<const float, 3> values, View<const float, 2> write_score, View<const float, 2> gate) {
    const int d = shape_.head_dim;
    std::vector<EntryMeta> meta;
    std::vector<float> k_kept, v_kept;
    for (int h = 0; h < shape_.kv_heads; ++h) {
      meta.clear();
      bool dropped = false;
      for (std::int64_t t = 0; t < T; ++t) {
        EntryMeta m{static_cast<std::int32_t>(n + t), write_score(h, t)};
        for (const Field f : fields_all)  // the fields the parts declare, each as its Field says
          if (fields.has(f))
            field_of(m, f) = memory::field_at_write(f, &keys(h, t, 0), d,
                                                    gate.data != nullptr ? gate(h, t) : initial_value(f));
        // keep (and local, for allocators without a ring) store the entry; drop never does
        if (admitter_.admit(m) == Admission::drop) {
          dropped = true;
          continue;
        }
        meta.push_back(m);
      }
      if (!dropped) {  // the common case: the head's [T, d] rows go straight from the caller's buffers
        alloc_.append(seq, layer, h, T, &keys(h, 0, 0), values.data != nullptr ? &values(h, 0, 0) : nullptr, meta.data());
        continue;
      }
      k_kept.clear();
      v_kept.clear();
      for (const EntryMeta& m : meta) {
        const std::int64_t t = m.position - n;
        k_kept.insert(k_kept.end(), &keys(h, t, 0), &keys(h, t, 0) + d);
        if (values.data != nullptr) v_kept.insert(v_kept.end(), &values(h, t, 0), &values(h, t, 0) + d);
      }
      alloc_.append(seq, layer, h, static_cast<std::int64_t>(meta.size()), k_kept.data(),
                    values.data != nullptr ? v_kept.data() : nullptr, meta.data());
    }
  }

  // Removes the entries at positions >= n (the open step's) from every head of `layer` (every
  // layer for -1), last head first, so that pages go back to the pool in the reverse of the order
  // append took them and the free list is as it was.
  void drop_open_entries(std::int64_t seq, std::int64_t n, int layer) {
    std::vector<std::uint8_t> keep;
    for (int l = shape_.layers - 1; l >= 0; --l) {
      if (layer >= 0 && l != layer) continue;
      for (int h = shape_.kv_heads - 1; h >= 0; --h) {
        const auto head_layout = alloc_.layout(seq, l, h);
        keep.assign(static_cast<std::size_t>(head_layout.length), 1);
        bool any = false;
        for (std::int64_t j = 0; j < head_layout.length; ++j)
          if (alloc_.pool().meta(head_layout.slot(j)).position >= n) {
            keep[static_cast<std::size_t>(j)] = 0;
            any = true;
          }
        if (any) alloc_.compact(seq, l, h, keep);
      }
    }
  }

  /// Flash-decoding (B::attend_partial, B::merge_partials): each head's entries in ranges of
  /// B::decode_range, one task a range on any thread, then each head's states merged in range order
  /// into its query heads of `out`. The ranges do not depend on the thread count, so neither does
  /// the answer; a head of one range gets attend()'s answer bit for bit.
  void attend_split(std::int64_t seq, int layer, std::span<const std::int32_t> q_pos, View<const float, 3> queries,
                    View<float, 3> out, AttentionMask mask) {
    const std::int64_t T = queries.dim(1), d = queries.dim(2), rows = std::int64_t{shape_.group()} * T;
    struct Range {
      int head;
      std::int64_t first, last;
    };
    std::vector<Range> ranges;
    std::vector<std::int64_t> head_begin;  // head h's ranges are [head_begin[h], head_begin[h + 1])
    std::vector<memory::HeadLayout> layouts;
    for (int h = 0; h < shape_.kv_heads; ++h) {
      head_begin.push_back(static_cast<std::int64_t>(ranges.size()));
      layouts.push_back(alloc_.layout(seq, layer, h));
      const std::int64_t n = layouts.back().length;
      for (std::int64_t first = 0; first < n || first == 0; first += B::decode_range)
        ranges.push_back({h, first, std::min(n, first + B::decode_range)});
    }
    head_begin.push_back(static_cast<std::int64_t>(ranges.size()));
    const auto count = static_cast<std::size_t>(ranges.size() * static_cast<std::size_t>(rows));
    std::vector<float> m(count), l(count), acc(count * static_cast<std::size_t>(d));
    std::vector<cpu::SoftmaxPartial> parts;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const std::size_t at = i * static_cast<std::size_t>(rows);
      parts.push_back({m.data() + at, l.data() + at, acc.data() + at * static_cast<std::size_t>(d)});
    }
    detail::for_each_task<B>(static_cast<std::int64_t>(ranges.size()), attention_work(seq, layer, T), [&](std::int64_t i) {
      const Range& r = ranges[static_cast<std::size_t>(i)];
      B::attend_partial(std::as_const(alloc_).pool(), layouts[static_cast<std::size_t>(r.head)], r.head, shape_.group(),
                        queries, q_pos, r.first, r.last, parts[static_cast<std::size_t>(i)], mask);
    });
    for (int h = 0; h < shape_.kv_heads; ++h) {
      const auto b = static_cast<std::size_t>(head_begin[static_cast<std::size_t>(h)]);
      const auto e = static_cast<std::size_t>(head_begin[static_cast<std::size_t>(h) + 1]);
      B::merge_partials(std::span<const cpu::SoftmaxPartial>(parts.data() + b, e - b), rows, d,
                        &out(std::int64_t{h} * shape_.group(), 0, 0));
    }
  }

  /// (query rows) x (entries) over the layer's kv heads: what decides whether threads pay off.
  std::int64_t attention_work(std::int64_t seq, int layer, std::int64_t T) const {
    std::int64_t entries = 0;
    for (int h = 0; h < shape_.kv_heads; ++h) entries += alloc_.length(seq, layer, h);
    return entries * T * shape_.group();
  }

  /// Compacts every active head of one sequence by its plan's keep flags.
  EvictionReport apply_one(std::int64_t seq, const detail::EvictionPlan& plan, std::vector<EvictedEntry>* evicted) {
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
  Alloc alloc_;
  E evictor_;
  S scorer_;
  A admitter_;
  EngineKeys engine_keys_{};  // over engine-owned K/V: where the engine keeps the keys a Scorer reads
};

}  // namespace kvpolicy::cpu
