/// \file
/// kvpolicy/cuda/executor.cuh — what cuda_backend does for a Cache (cache.hpp): its pool, block
/// tables and free list live in device memory it owns (gpu::PagedMemory), and every step runs on
/// the CUDA kernels — append, paged decode attention, and an eviction planned then applied as on
/// the host: the trigger (the Evictor's rule, run once, on the host where the lengths are known),
/// the plan (score and select into the workspace; a NaN score throws here with nothing changed),
/// then the apply (compact), with the evicted entries read from the plan's keep flags.
///
/// The host-view API copies its inputs to the device and synchronises the cache's stream at each
/// call's end to report errors the device found (out of pages, a NaN score) as exceptions — the
/// convenience an engine has on the CPU. An engine whose tensors already live on the GPU calls the
/// kernels itself over the executor's views (Cache::executor(): kv(), tables_view(), free_list()),
/// as examples/engine_cuda.cu does, and pays neither.
///
/// What it runs: EntryScorers (RetentionDecay, Lookahead, KNormRetention, Frozen, the training-free
/// EntryScorers) and score::ObservedAttention (SnapKV, TOVA, AdaKV: the queries the Cache records,
/// scored on the device); admit::All; every Evictor that states its selection as data (core/rule.hpp),
/// selected on the device; and an Evictor that selects itself (dist::Sharded: a pooled selection over
/// the ranks of a tensor-parallel group, dist/sharded.hpp), selected on the host over the scores the
/// device computed (read back: 8 bytes an entry of the heads that fire) with the keep flags sent back,
/// so that the scoring, the attention and the compaction stay on the device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/cuda/kernels/append.cuh"
#include "kvpolicy/cuda/kernels/attention.cuh"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/device_parts.hpp"
#include "kvpolicy/cuda/memory/device_array.cuh"
#include "kvpolicy/cuda/kernels/evict_step.cuh"
#include "kvpolicy/cuda/kernels/observed_attention.cuh"
#include "kvpolicy/cuda/memory/paged_memory.cuh"
#include "kvpolicy/cache/evictor_hooks.hpp"
#include "kvpolicy/cache/planner.hpp"
#include "kvpolicy/cache/scorer_records.hpp"
#include "kvpolicy/cache/step_state.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/selection.hpp"

namespace kvpolicy::gpu {

/// The device keeps its entries in pages of a memory::Paged<P, Storage> pool.
template <Scorer S, Admitter A, Evictor E, class Alloc>
class Executor {
  static_assert(sizeof(Alloc) == 0, "kvpolicy::Cache<cuda_backend>: the Allocator must be memory::Paged<P, Storage>");
};

template <Scorer S, Admitter A, Evictor E, int P, class Storage>
class Executor<S, A, E, memory::Paged<P, Storage>> {
  // the parts the device runs (cuda/device_parts.hpp, which the registry reads too); the observed
  // attention from the queries the Cache records: cuda/kernels/observed_attention.cuh
  static constexpr bool observes = device_scoring_of<S>() == DeviceScoring::observed_attention;
  static_assert(device_scores<S>,
                "kvpolicy::Cache<cuda_backend>: this Scorer (the S of Executor<S, ...> named below) declares no way "
                "the device scores it (core/record.hpp, DeviceScoring: by_entry, or observed_attention with "
                "score::ObservedAttention's settings); compose it with cpu_backend");
  static_assert(device_admits<A>, "kvpolicy::Cache<cuda_backend>: the device cache admits every token");
  static_assert(device_evicts<E>,
                "kvpolicy::Cache<cuda_backend>: the device runs no Evictor whose budget weighs what the gates "
                "admitted (WG-KV's hard budget runs on the CPU)");
  static_assert(device_allocates<memory::Paged<P, Storage>>,
                "kvpolicy::Cache<cuda_backend>: page size must be 16, 32 or 64");
  using Memory = PagedMemory<P, Storage>;
  using device_type = typename Memory::device_type;
  template <class T>
  using DeviceArray = detail::DeviceArray<T>;
  using Records = kvpolicy::detail::ScorerRecords<S>;
  // the per-entry fields the parts declare: the columns the device pool carries
  static constexpr FieldSet fields = composed_fields<S, A>;

 public:
  using storage_type = Storage;
  /// Where a sequence lives on the device: its slot in the block tables, and each head's length
  /// when its open step began (what abort takes it back to).
  struct Sequence {
    std::int32_t slot = 0;
    std::vector<std::int32_t> first;
  };
  /// What one sequence's commit asks the planner for.
  struct Request {
    std::int64_t seq;
    const Sequence* memory;
    StepContext context;
    const typename Records::Sequence* records;
  };
  /// The eviction of the sequences whose steps close together, planned into the workspace: the
  /// sequences whose trigger fired, side by side in `tables` (gathered when there are several),
  /// their keep flags in `work`. apply() must follow plan() with no other call in between.
  struct Plan {
    std::vector<StepContext> contexts;  // per request, as its step commits
    std::vector<std::uint8_t> triggered;
    std::vector<std::int32_t> slots;
    std::vector<std::size_t> fired;     // the requests whose trigger fired, in order
    std::vector<std::vector<std::int64_t>> seen;  // per request, its heads' lengths
    std::vector<std::uint8_t> active;   // the fired requests' heads, side by side: the trigger's flags
    std::vector<std::int64_t> lengths;  // and their lengths
    BlockTableView tables{};
    detail::EvictWork work{};
    StepContext context(std::size_t i) const { return contexts[i]; }
  };

  /// Allocates the pool (allocator.pages_total() pages of P slots) and the scratch on the current
  /// device; `stream` runs every call (default: the legacy default stream).
  Executor(const CacheShape& shape, memory::Paged<P, Storage> allocator, const E& evictor, const S& scorer,
           const A& admitter, cudaStream_t stream)
      : shape_(with_kernels(shape)), evictor_(evictor), scorer_(scorer), admitter_(admitter),
        mem_(shape_, static_cast<std::int32_t>(allocator.pages_total()), fields,
             std::min<std::int64_t>(allocator.pages_total() * P, typical_head_length()), stream) {
    const int d = shape_.head_dim;
    int device = 0;
    KVPOLICY_CUDA_CHECK(cudaGetDevice(&device), "Cache<cuda_backend>: the current device");
    KVPOLICY_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device),
                        "Cache<cuda_backend>: device ", device);
    const auto per_seq = static_cast<std::size_t>(shape_.heads_total());
    rows_ = DeviceArray<std::int32_t>(static_cast<std::size_t>(shape_.kv_heads));
    evicted_ = DeviceArray<std::int64_t>(per_seq);
    context_ = DeviceArray<StepContext>(1);
    base_ = DeviceArray<std::int32_t>(1);
    query_position_ = DeviceArray<std::int32_t>(1);
    queries_ = DeviceArray<float>(std::size_t(shape_.q_heads) * d);
    out_ = DeviceArray<float>(queries_.size());
    std::size_t bytes = append_workspace_bytes(shape_.kv_heads);
    bytes = std::max(bytes, evict_workspace_bytes(mem_.slot_tables(0)));
    const DecodeBatch one{queries_.get(), base_.get(), 1, shape_.q_heads, shape_.kv_heads, out_.get()};
    bytes = std::max(bytes, decode_attention_workspace_bytes(one, std::int64_t{pages_total()} * P, P, sm_count_));
    workspace_ = DeviceArray<unsigned char>(bytes);
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  Executor(Executor&&) noexcept = default;
  Executor& operator=(Executor&&) noexcept = default;

  const E& evictor() const { return evictor_; }
  const S& scorer() const { return scorer_; }
  const A& admitter() const { return admitter_; }

  // ---- the device views, for an engine that drives the kernels itself ----------------------------
  PagedKV<device_type> kv() const { return mem_.kv(); }
  /// Every sequence slot's block tables: segment = slot * L * Hkv + layer * Hkv + head.
  BlockTableView tables_view() const { return mem_.tables_view(); }
  FreeList free_list() const { return mem_.free_list(); }
  /// Block-table rows of at least max_pages pages (capped at the pool), for an engine that appends
  /// through the kernels itself: rows start at what the rule lets a head hold plus a chunk, and an
  /// append through the Cache widens them when a head needs more. Widening reallocates the tables:
  /// views taken before it (tables_view(), slot tables) are stale after it.
  void reserve_rows(std::int32_t max_pages) { mem_.widen_rows(std::min(max_pages, mem_.pages_total())); }
  std::int32_t max_pages_per_head() const { return mem_.max_pages(); }
  cudaStream_t stream() const { return mem_.stream(); }

  // ---- sequences and what they hold --------------------------------------------------------------
  Sequence add_sequence(std::int64_t) {
    Sequence m;
    m.first.assign(static_cast<std::size_t>(shape_.heads_total()), 0);
    m.slot = mem_.acquire_slot();
    return m;
  }
  void remove_sequence(std::int64_t, Sequence& m) {
    truncate(m, std::vector<std::int32_t>(static_cast<std::size_t>(shape_.heads_total()), 0));
    mem_.release_slot(m.slot);
  }
  std::int64_t length(std::int64_t, const Sequence& m, int layer, int head) const {
    return mem_.length(mem_.segment(m.slot, layer, head));
  }
  std::vector<std::int64_t> lengths(std::int64_t, const Sequence& m) const {
    const std::vector<std::int32_t> len = mem_.lengths(m.slot);
    return {len.begin(), len.end()};
  }
  /// Metadata of entry i of a head, in storage order (the host pool's order: both compact alike).
  EntryMeta entry(std::int64_t, const Sequence& m, int layer, int head, std::int64_t i) const {
    const std::int32_t seg = mem_.segment(m.slot, layer, head);
    const std::int32_t len = mem_.length(seg);
    require(i >= 0 && i < len, "Cache::entry: index ", i, " out of range [0, ", len, ")");
    return mem_.entry(seg, i);
  }
  /// Every entry of a head, in storage order: metadata, K and V (read back from the device).
  HeadContents head_contents(std::int64_t, const Sequence& m, int layer, int head) const {
    return mem_.head_contents(mem_.segment(m.slot, layer, head));
  }
  std::int64_t pages_free() const { return mem_.pages_free(); }
  std::int64_t pages_total() const { return mem_.pages_total(); }
  bool can_step(std::int64_t, const Sequence& m, std::int64_t T) const { return pages_needed(m, T) <= pages_free(); }
  std::int64_t batch_pages(std::int64_t, const Sequence& m, std::int64_t T) const { return pages_needed(m, T); }

  // ---- one step ----------------------------------------------------------------------------------
  /// Stages the layer's entries and appends them on the device: all of them, or (out of pages, a
  /// full block-table row that cannot widen) none, with the error; with them the fields the parts
  /// declare, each as its Field says (memory::field_at_write).
  void append(std::int64_t seq, Sequence& m, int layer, std::int64_t n, std::int64_t T, View<const float, 3> keys,
              View<const float, 3> values, View<const float, 2> write_score, View<const float, 2> gate,
              bool step_opens) {
    const int d = shape_.head_dim;
    std::vector<device_type> k(static_cast<std::size_t>(keys.size())), v(k.size());
    for (std::int64_t i = 0; i < keys.size(); ++i) {
      const Storage ks = from_float<Storage>(keys.data[i]), vs = from_float<Storage>(values.data[i]);
      std::memcpy(static_cast<void*>(&k[static_cast<std::size_t>(i)]), &ks, sizeof ks);  // the same bits
      std::memcpy(static_cast<void*>(&v[static_cast<std::size_t>(i)]), &vs, sizeof vs);
    }
    std::vector<std::int32_t> pos(static_cast<std::size_t>(shape_.kv_heads * T)), rows(static_cast<std::size_t>(shape_.kv_heads));
    for (std::int64_t h = 0; h < shape_.kv_heads; ++h) {
      rows[static_cast<std::size_t>(h)] = mem_.segment(m.slot, layer, static_cast<int>(h));
      for (std::int64_t t = 0; t < T; ++t) pos[static_cast<std::size_t>(h * T + t)] = static_cast<std::int32_t>(n + t);
    }
    reserve_staging(k.size(), pos.size());
    mem_.upload(stage_keys_.get(), k.data(), k.size());
    mem_.upload(stage_values_.get(), v.data(), v.size());
    mem_.upload(stage_position_.get(), pos.data(), pos.size());
    mem_.upload(stage_write_score_.get(), write_score.data, pos.size());
    mem_.upload(rows_.get(), rows.data(), rows.size());
    if (step_opens) m.first = mem_.lengths(m.slot);  // where this step's entries begin, for abort
    AppendRows<device_type> a{rows_.get(), shape_.kv_heads, static_cast<std::int32_t>(T), stage_keys_.get(),
                              stage_values_.get(), stage_position_.get(), stage_write_score_.get()};
    for (const Field f : fields_all)  // each declared field's value as the CPU cache stores it (the fp32 key as handed in)
      if (fields.has(f) && source_of(f) != FieldSource::attention) {
        auto& column = stage_fields_[static_cast<int>(f)];
        std::vector<float> value(pos.size());
        for (std::int64_t h = 0; h < shape_.kv_heads; ++h)
          for (std::int64_t t = 0; t < T; ++t)
            value[static_cast<std::size_t>(h * T + t)] = memory::field_at_write(
                f, &keys(h, t, 0), d, gate.data != nullptr ? gate(h, t) : initial_value(f));  // finite: checked
        mem_.upload(column.get(), value.data(), value.size());
        a.fields[static_cast<int>(f)] = column.get();
      }
    Status s{};
    while (true) {
      std::size_t bytes = workspace_.size();
      gpu::append(workspace_.get(), bytes, kv(), tables_view(), free_list(), a, mem_.status_word(), mem_.stream());
      s = mem_.status();
      if (s.code != Status::table_full || mem_.max_pages() >= mem_.pages_total()) break;
      mem_.reset_status();  // a head outgrew its block-table row: widen every row, try again (nothing was written)
      const std::int64_t wider = std::max<std::int64_t>(2 * std::int64_t{mem_.max_pages()}, s.needed);
      mem_.widen_rows(static_cast<std::int32_t>(std::min<std::int64_t>(mem_.pages_total(), wider)));
    }
    if (s.code == Status::out_of_pages || s.code == Status::table_full) {
      mem_.reset_status();
      fail("Cache::append: out of memory: sequence ", seq, " layer ", layer, " cannot take ", T,
           " more entries per head (", s.code == Status::table_full ? "a head's block table is full: " : "",
           s.needed, " pages needed, ", s.available, s.code == Status::table_full ? " per head)" : " free)");
    }
  }

  /// queries [Hq, T, d] at positions n..n+T-1 -> out, causal inside the chunk (SPEC §6) as on the
  /// CPU: the chunk's T rows go to the decode kernel as a batch of T queries over the same heads,
  /// each at its own position. The device batch is [T, Hq, d] (the host view is [Hq, T, d]).
  void attend(std::int64_t, Sequence& m, typename Records::Sequence&, int layer, std::int64_t n, std::int64_t T,
              View<const float, 3> queries, View<float, 3> out) {
    const auto d = static_cast<std::size_t>(shape_.head_dim);
    const auto Hq = static_cast<std::size_t>(shape_.q_heads);
    std::vector<float> rows(static_cast<std::size_t>(queries.size()));
    for (std::size_t h = 0; h < Hq; ++h)
      for (std::int64_t t = 0; t < T; ++t)
        std::memcpy(&rows[(static_cast<std::size_t>(t) * Hq + h) * d], &queries(static_cast<std::int64_t>(h), t, 0),
                    d * sizeof(float));
    if (queries_.size() < rows.size()) {
      queries_ = DeviceArray<float>(rows.size());
      out_ = DeviceArray<float>(rows.size());
      base_ = DeviceArray<std::int32_t>(static_cast<std::size_t>(T));
      query_position_ = DeviceArray<std::int32_t>(static_cast<std::size_t>(T));
    }
    const std::vector<std::int32_t> base(static_cast<std::size_t>(T), mem_.segment(m.slot, layer, 0));
    std::vector<std::int32_t> q_pos(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) q_pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(n + t);
    mem_.upload(queries_.get(), rows.data(), rows.size());
    mem_.upload(base_.get(), base.data(), base.size());
    mem_.upload(query_position_.get(), q_pos.data(), q_pos.size());
    DecodeBatch batch{queries_.get(), base_.get(), static_cast<std::int32_t>(T), shape_.q_heads, shape_.kv_heads,
                      out_.get()};
    batch.query_position = query_position_.get();  // causal inside the chunk
    batch.mask = composed_attention_mask(evictor_, admitter_);  // WG-KV's vertical-slash mask, SPEC §3
    const std::vector<std::int32_t> len = mem_.lengths(m.slot);  // the split follows the layer's longest head
    const auto layer_first = len.begin() + head_index(shape_, layer, 0);
    const std::int64_t longest = *std::max_element(layer_first, layer_first + shape_.kv_heads);
    std::size_t bytes = decode_attention_workspace_bytes(batch, longest, P, sm_count_);
    reserve_workspace(bytes);
    decode_attention(workspace_.get(), bytes, kv(), tables_view(), batch, longest, mem_.stream(), sm_count_);
    mem_.download(rows.data(), out_.get(), rows.size());
    for (std::size_t h = 0; h < Hq; ++h)
      for (std::int64_t t = 0; t < T; ++t)
        std::memcpy(&out(static_cast<std::int64_t>(h), t, 0), &rows[(static_cast<std::size_t>(t) * Hq + h) * d],
                    d * sizeof(float));
  }

  /// Takes back the open step: what its attention recorded (the observed queries), and each head
  /// back to its length when the step began.
  void abort(std::int64_t, Sequence& m, typename Records::Sequence& records, std::int64_t, bool open) {
    Records::abort(scorer_, records, EntryFields{});  // the device's entries' fields are changed by no record
    if (open) truncate(m, m.first);
  }

  // ---- eviction: plan, then apply ----------------------------------------------------------------
  /// The planner's skeleton (cache/planner.hpp, as on the host) over the primitives below: every
  /// request's trigger on the host (the lengths are the device's), then one scoring and selection
  /// on the device over the sequences it fires for — their block-table rows side by side, gathered
  /// when there are several — into the workspace. A NaN score throws with nothing changed: the
  /// tables it planned over are the sequences' own or a copy, and nothing was compacted.
  Plan plan(std::span<const Request> requests) { return kvpolicy::detail::plan_evictions(shape_, evictor_, *this, requests); }

  // ---- the primitives the planner calls (cache/planner.hpp, plan_evictions) ------------------------
  std::vector<std::int64_t> seen_lengths(Plan& p, const Request& r) {
    p.slots.push_back(r.memory->slot);
    return p.seen.emplace_back(lengths(r.seq, *r.memory));  // the device cache has no ring (admit::All)
  }
  void triggered(Plan& p, std::size_t i, StepContext ctx, bool fires, std::vector<std::uint8_t> active) {
    p.contexts.push_back(ctx);
    p.triggered.push_back(fires ? 1 : 0);
    if (!fires) return;
    p.fired.push_back(i);
    p.active.insert(p.active.end(), active.begin(), active.end());
    p.lengths.insert(p.lengths.end(), p.seen[i].begin(), p.seen[i].end());
  }
  /// The fired sequences' contexts and block-table rows on the device, the workspace carved, the
  /// trigger's flags (per head and per group of heads) uploaded as the host decided them.
  bool stage(Plan& p) {
    if (p.fired.empty()) return false;
    const auto per_seq = static_cast<std::size_t>(shape_.heads_total());
    const auto per_group = static_cast<std::int32_t>(evictor_.group_heads(shape_));
    const std::size_t k = p.fired.size();
    std::vector<StepContext> fired_context;
    for (const std::size_t i : p.fired) fired_context.push_back(p.contexts[i]);
    if (context_.size() < k) context_ = DeviceArray<StepContext>(k);
    mem_.upload(context_.get(), fired_context.data(), k);
    // one sequence's rows are contiguous in the tables; several are gathered side by side
    p.tables = mem_.slot_tables(p.slots[p.fired[0]]);
    if (k > 1) {
      const std::size_t row_ints = per_seq * static_cast<std::size_t>(mem_.max_pages());
      if (gather_tables_.size() < k * row_ints) gather_tables_ = DeviceArray<std::int32_t>(k * row_ints);
      if (gather_length_.size() < k * per_seq) gather_length_ = DeviceArray<std::int32_t>(k * per_seq);
      for (std::size_t j = 0; j < k; ++j) {
        const BlockTableView from = mem_.slot_tables(p.slots[p.fired[j]]);
        mem_.copy(gather_tables_.get() + j * row_ints, from.table, row_ints);
        mem_.copy(gather_length_.get() + j * per_seq, from.length, per_seq);
      }
      p.tables = {gather_tables_.get(), gather_length_.get(), static_cast<std::int32_t>(k * per_seq), mem_.max_pages()};
    }
    reserve_workspace(evict_workspace_bytes(p.tables));
    WorkspaceLayout layout;
    p.work = detail::carve_evict(layout, workspace_.get(), per_group, kv(), p.tables);
    std::vector<std::uint8_t> group_active(p.active.size() / static_cast<std::size_t>(per_group));
    for (std::size_t g = 0; g < group_active.size(); ++g) group_active[g] = p.active[g * static_cast<std::size_t>(per_group)];
    mem_.upload(p.work.active, p.active.data(), p.active.size());
    mem_.upload(p.work.group_active, group_active.data(), group_active.size());
    return true;
  }
  /// The active heads' scores on the device; a NaN is found there and reported by its segment.
  std::optional<kvpolicy::detail::NanScore> score(Plan& p, std::span<const Request> requests) {
    if constexpr (observes)
      score_observed(p, requests, p.active, p.lengths);
    else
      detail::score_active(p.work, scorer_, evictor_, shape_, kv(), p.tables, context_.get(), mem_.status_word(),
                           mem_.stream());
    const Status s = mem_.status();
    if (s.code != Status::nan_score) return std::nullopt;
    mem_.reset_status();
    const auto per_seq = static_cast<std::size_t>(shape_.heads_total());
    const auto segment = static_cast<std::size_t>(s.segment);
    return kvpolicy::detail::NanScore{p.fired[segment / per_seq], static_cast<std::int64_t>(segment % per_seq), {}};
  }
  /// The stated selection on the device; an Evictor that selects itself, on the host.
  void select(Plan& p) {
    if constexpr (evictor_states_selection<E>)
      detail::select_kept(p.work, evictor_, shape_, p.tables, context_.get(),
                          static_cast<std::int32_t>(evictor_.group_heads(shape_)), mem_.stream());
    else
      select_on_host(p);
  }

  /// Compacts the planned heads (the one launch that changes memory), returns gathered rows to
  /// their sequences, and reports each request's trigger and evicted count; the evicted entries
  /// (optional) come from the plan's keep flags, per head in storage order.
  std::vector<EvictionReport> apply(const Plan& p, std::vector<EvictedEntry>* evicted) {
    std::vector<EvictionReport> reports(p.contexts.size());
    for (std::size_t i = 0; i < reports.size(); ++i) reports[i].triggered = p.triggered[i] != 0;
    if (p.fired.empty()) return reports;
    const auto per_seq = static_cast<std::size_t>(shape_.heads_total());
    const std::size_t k = p.fired.size();
    if (evicted != nullptr) collect_evicted(p, *evicted);  // before the keep flags' heads move
    if (evicted_.size() < k * per_seq) evicted_ = DeviceArray<std::int64_t>(k * per_seq);
    detail::apply_eviction(p.work, kv(), p.tables, free_list(), evicted_.get(), mem_.stream());
    if (k > 1) {
      const std::size_t row_ints = per_seq * static_cast<std::size_t>(mem_.max_pages());
      for (std::size_t j = 0; j < k; ++j) {
        const BlockTableView to = mem_.slot_tables(p.slots[p.fired[j]]);
        mem_.copy(to.table, gather_tables_.get() + j * row_ints, row_ints);
        mem_.copy(to.length, gather_length_.get() + j * per_seq, per_seq);
      }
    }
    std::vector<std::int64_t> gone(k * per_seq);
    mem_.download(gone.data(), evicted_.get(), gone.size());
    for (std::size_t j = 0; j < k; ++j)
      for (std::size_t h = 0; h < per_seq; ++h) reports[p.fired[j]].evicted += gone[j * per_seq + h];
    return reports;
  }

 private:
  /// The shape, once the device has kernels for its head width (before any allocation).
  static const CacheShape& with_kernels(const CacheShape& shape) {
    const int d = shape.head_dim;
    require(d == 64 || d == 128 || d == 256, "Cache<cuda_backend>: head_dim = ", d, " has no kernel (64, 128 or 256)");
    return shape;
  }

  /// The evicted entries of a plan: per fired sequence and head, the positions its keep flags drop.
  void collect_evicted(const Plan& p, std::vector<EvictedEntry>& evicted) const {
    const auto segments = static_cast<std::size_t>(p.tables.segments);
    std::vector<std::int64_t> offsets(segments + 1);
    mem_.download(offsets.data(), p.work.offsets, offsets.size());
    const auto total = static_cast<std::size_t>(offsets.back());
    std::vector<std::uint8_t> keep(total);
    std::vector<std::int32_t> position(total);
    mem_.download(keep.data(), p.work.keep, total);
    mem_.download(position.data(), p.work.position, total);
    std::size_t dropped = 0;
    for (const std::uint8_t kept : keep) dropped += kept == 0;
    evicted.reserve(evicted.size() + dropped);
    for (std::size_t seg = 0; seg < segments; ++seg) {
      const auto h = static_cast<int>(seg % static_cast<std::size_t>(shape_.heads_total()));
      for (auto j = static_cast<std::size_t>(offsets[seg]); j < static_cast<std::size_t>(offsets[seg + 1]); ++j)
        if (keep[j] == 0) evicted.push_back({h / shape_.kv_heads, h % shape_.kv_heads, position[j]});
    }
  }

  /// The plan's scores by the observed attention: each active head's window of queries (recorded
  /// by the Cache as its attention ran) staged on the device, then scored there
  /// (cuda/kernels/observed_attention.cuh); plan() selects as for any Scorer.
  void score_observed(Plan& p, std::span<const Request> requests, const std::vector<std::uint8_t>& active,
                      const std::vector<std::int64_t>& length)
    requires observes
  {
    const auto per_seq = static_cast<std::size_t>(shape_.heads_total());
    const auto segments = static_cast<std::size_t>(p.tables.segments);
    const auto group = static_cast<std::size_t>(shape_.group()), d = static_cast<std::size_t>(shape_.head_dim);
    const auto capacity = static_cast<std::size_t>(scorer_.observation_window);
    std::vector<float> queries(segments * group * capacity * d, 0.0f), window;
    std::vector<std::int32_t> position(segments * capacity, 0), count(segments, 0), window_position;
    std::int64_t entries = 0;
    for (std::size_t j = 0; j < p.fired.size(); ++j) {
      const Request& r = requests[p.fired[j]];
      for (std::size_t h = 0; h < per_seq; ++h) {
        const std::size_t seg = j * per_seq + h;
        if (!active[seg]) continue;
        entries += length[seg];
        const int layer = static_cast<int>(h) / shape_.kv_heads, head = static_cast<int>(h) % shape_.kv_heads;
        const ObservedQueries q = r.records->ordered(layer, head, static_cast<int>(group), window, window_position);
        count[seg] = static_cast<std::int32_t>(q.window);
        for (std::size_t g = 0; g < group; ++g)
          for (std::int64_t w = 0; w < q.window; ++w)
            std::copy_n(q.query(static_cast<std::int64_t>(g), w), d,
                        &queries[((seg * group + g) * capacity + static_cast<std::size_t>(w)) * d]);
        std::copy(q.position.begin(), q.position.end(), &position[seg * capacity]);
      }
    }
    if (observed_queries_.size() < queries.size()) observed_queries_ = DeviceArray<float>(queries.size());
    if (observed_position_.size() < position.size()) observed_position_ = DeviceArray<std::int32_t>(position.size());
    if (observed_count_.size() < count.size()) observed_count_ = DeviceArray<std::int32_t>(count.size());
    const auto scratch_bytes = std::max<std::size_t>(static_cast<std::size_t>(entries), 1) * ObservedScratch::bytes_per_entry;
    if (observed_scratch_.size() < scratch_bytes) observed_scratch_ = DeviceArray<unsigned char>(scratch_bytes);
    mem_.upload(observed_queries_.get(), queries.data(), queries.size());
    mem_.upload(observed_position_.get(), position.data(), position.size());
    mem_.upload(observed_count_.get(), count.data(), count.size());
    const auto n = static_cast<std::size_t>(std::max<std::int64_t>(entries, 1));
    auto* base = observed_scratch_.get();
    ObservedScratch x;
    x.sum = reinterpret_cast<double*>(base);
    x.pooled = x.sum + n;
    x.reduced = x.pooled + n;
    x.work = x.reduced + n;
    x.rank = reinterpret_cast<std::int32_t*>(x.work + n);
    x.order = x.rank + n;
    const ObservedWindows windows{observed_queries_.get(), observed_position_.get(), observed_count_.get(),
                                  static_cast<std::int32_t>(group), static_cast<std::int32_t>(capacity)};
    KVPOLICY_CUDA_CHECK(cudaMemsetAsync(p.work.failed, 0, sizeof(int), mem_.stream()),
                        "Cache<cuda_backend>: clearing the plan's NaN flag");
    segment_offsets(p.tables, p.work.active, p.work.offsets, mem_.stream());
    observed_attention_scores(scorer_, kv(), p.tables, p.work.active, p.work.offsets, windows, x, p.work.score,
                              p.work.position, mem_.stream());
  }

  /// The survivors by an Evictor that selects itself, on the host: the plan's offsets, scores and
  /// positions read back, each fired sequence's segments handed to its select() as the CPU planner
  /// hands them (EvictorHooks::select at the sequence's context), the keep flags sent back. A
  /// sharded Evictor's collectives run here, one fired sequence after another in the requests'
  /// order, as on every rank.
  void select_on_host(const Plan& p)
    requires(!evictor_states_selection<E>)
  {
    const auto per_seq = static_cast<std::size_t>(shape_.heads_total());
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(p.tables.segments) + 1);
    mem_.download(offsets.data(), p.work.offsets, offsets.size());
    const auto total = static_cast<std::size_t>(offsets.back());
    std::vector<float> score(total);
    std::vector<std::int32_t> position(total);
    std::vector<std::uint8_t> keep(total, 1);
    mem_.download(score.data(), p.work.score, total);
    mem_.download(position.data(), p.work.position, total);
    std::vector<std::int64_t> local(per_seq + 1);  // one sequence's offsets, from 0
    for (std::size_t j = 0; j < p.fired.size(); ++j) {
      const std::int64_t first = offsets[j * per_seq];
      for (std::size_t h = 0; h <= per_seq; ++h) local[h] = offsets[j * per_seq + h] - first;
      const auto b = static_cast<std::size_t>(first), n = static_cast<std::size_t>(local[per_seq]);
      const SegmentedScores s{std::span<const float>(score).subspan(b, n),
                              std::span<const std::int32_t>(position).subspan(b, n), local};
      EvictorHooks<E>::select(evictor_, shape_, p.contexts[p.fired[j]], s, std::span<std::uint8_t>(keep).subspan(b, n));
    }
    mem_.upload(p.work.keep, keep.data(), total);
  }

  /// Shrinks each head of a sequence to keep_first[i] entries (its first ones).
  void truncate(const Sequence& m, const std::vector<std::int32_t>& keep_first) {
    mem_.truncate(m.slot, keep_first, workspace_.get(), workspace_.size());
  }
  /// Staging buffers for one append's inputs (grown, never shrunk).
  void reserve_staging(std::size_t kv_elements, std::size_t entries) {
    if (stage_keys_.size() < kv_elements) {
      stage_keys_ = DeviceArray<device_type>(kv_elements);
      stage_values_ = DeviceArray<device_type>(kv_elements);
    }
    if (stage_position_.size() < entries) {
      stage_position_ = DeviceArray<std::int32_t>(entries);
      stage_write_score_ = DeviceArray<float>(entries);
      for (const Field f : fields_all)
        if (fields.has(f)) stage_fields_[static_cast<int>(f)] = DeviceArray<float>(entries);
    }
  }
  /// Pages the sequence's heads take to grow by T entries each (the CPU pool's count).
  std::int64_t pages_needed(const Sequence& m, std::int64_t T) const {
    std::int64_t need = 0;
    for (const std::int32_t len : mem_.lengths(m.slot)) need += (len + T + P - 1) / P - (len + P - 1) / P;
    return need;
  }
  void reserve_workspace(std::size_t bytes) {
    if (workspace_.size() < bytes) workspace_ = DeviceArray<unsigned char>(bytes);
  }
  /// The workspace one eviction over `tables` takes (what gpu::evict_step's size query gives).
  std::size_t evict_workspace_bytes(const BlockTableView& tables) const {
    WorkspaceLayout layout;
    detail::carve_evict(layout, nullptr, static_cast<std::int32_t>(evictor_.group_heads(shape_)), kv(), tables);
    return layout.bytes();
  }

  /// About what one head holds after its eviction under the Evictor's stated rule, plus room for a
  /// prefill chunk of a few pages: the initial width of a block-table row (rows widen on demand).
  std::int64_t typical_head_length() const {
    constexpr std::int64_t buffer = 128, chunk = 256;
    if constexpr (!evictor_states_selection<E>) {
      return 1024 + chunk;  // a rule the Evictor does not state (it selects itself)
    } else if constexpr (selects_per_head<E>) {
      const evict::HeadSelection sel = evictor_.selection();
      if (sel.threshold) return 4 * sel.window + chunk;  // entries past the window stay by the bound (WG-KV)
      if (sel.keeps_prompt) return sel.keep + 1024;      // the prompt stays on top of the budget (EpiKV)
      return sel.keep + buffer + chunk;
    } else {
      return evictor_.group_heads(shape_) * (evictor_.selection().budget + buffer) + chunk;
    }
  }

  CacheShape shape_;
  E evictor_;
  S scorer_;
  A admitter_;
  Memory mem_;  // the pool, block tables and free list
  // the host-view API's scratch: staged inputs, queries, the eviction's batch, the kernels' workspace
  DeviceArray<device_type> stage_keys_, stage_values_;
  DeviceArray<std::int32_t> rows_, base_, query_position_, stage_position_, gather_tables_, gather_length_;
  DeviceArray<float> queries_, out_, stage_write_score_;
  DeviceArray<float> stage_fields_[field_count];
  int sm_count_ = 0;
  DeviceArray<std::int64_t> evicted_;
  DeviceArray<StepContext> context_;
  DeviceArray<unsigned char> workspace_;
  // the observed attention's staged windows and scratch (score::ObservedAttention only)
  DeviceArray<float> observed_queries_;
  DeviceArray<std::int32_t> observed_position_, observed_count_;
  DeviceArray<unsigned char> observed_scratch_;
};

}  // namespace kvpolicy::gpu
