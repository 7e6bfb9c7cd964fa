/// \file
/// kvpolicy/cuda/cache.cuh — the Cache composition on the device: with `cuda_backend` as its
/// Backend, `Cache<Scorer, admit::All, Evictor, memory::Paged<P, Storage>, cuda_backend>` (so
/// `TrimKVCache<cuda_backend>`, `DBTrimKVCache<cuda_backend>`, …) keeps its pool, block tables
/// and free list in device memory it owns, on top of the views of views.cuh, and runs every step
/// with the CUDA kernels: append, paged decode attention, and one evict_step per commit (trigger,
/// score, select, compact). Its API is the CPU Cache's (host fp32 views in and out, the same
/// validation and errors), so an engine can switch backends with one template argument and the
/// differential tests can drive both with the same calls.
///
/// The host-view API copies its inputs to the device and, at each call's end, synchronises the
/// cache's stream to report errors the device found (out of pages, a NaN score) as exceptions —
/// the convenience an engine has on the CPU. An engine whose tensors already live on the GPU calls
/// the kernels itself over this cache's views (kv(), tables(), free_list()), as
/// examples/engine_cuda.cu does, and pays neither.
///
/// What this composition runs: EntryScorers (RetentionDecay, Lookahead, KNormRetention, Frozen,
/// the training-free EntryScorers); admit::All; every Evictor that states its rule as data
/// (core/rule.hpp): evict::PerHead, LayerWise and Global (TRIM-KV, DBTrimKV),
/// evict::WriteGated (WGKVCache: the ring, promotion and the vertical-slash mask in the attention),
/// evict::Generated (EpiKVCache) and evict::PromptEnd. The whole API of the CPU Cache: the layer
/// calls, step() and step_batch() (every eviction of a batch planned before any step closes: one
/// evict_step over the batch), and attend() for decode tokens and prefill chunks alike (causal
/// inside the chunk, by each query's position).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/cuda/append.cuh"
#include "kvpolicy/cuda/attention.cuh"
#include "kvpolicy/cuda/check.cuh"
#include "kvpolicy/cuda/compact.cuh"
#include "kvpolicy/cuda/device_array.cuh"
#include "kvpolicy/cuda/paged_memory.cuh"
#include "kvpolicy/cuda/evict_step.cuh"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policy/admit.hpp"
#include "kvpolicy/policy/evict.hpp"

namespace kvpolicy {

/// The Backend that puts a Cache on the GPU (this file's partial specialisation of Cache).
struct cuda_backend {
  static constexpr const char* name = "cuda";
  static constexpr bool emits_attention_mass = false;
};


template <Scorer S, Admitter A, Evictor E, int P, class Storage>
class Cache<S, A, E, memory::Paged<P, Storage>, cuda_backend> {
  static_assert(EntryScorer<S>, "kvpolicy::Cache<cuda_backend>: the device scores entry by entry (an EntryScorer)");
  static_assert(!scorer_needs_attention_mass<S>,
                "kvpolicy::Cache<cuda_backend>: this Scorer ranks by attention mass (H2O), which this Backend's "
                "attention does not emit");
  static_assert(std::is_same_v<A, admit::All>, "kvpolicy::Cache<cuda_backend>: the device cache admits every token");
  static_assert(evictor_states_selection<E>,
                "kvpolicy::Cache<cuda_backend>: the device runs an Evictor that states its selection as data "
                "(core/rule.hpp: selection() returns a HeadSelection or a PoolSelection)");
  static_assert(P == 16 || P == 32 || P == 64, "kvpolicy::Cache<cuda_backend>: page size must be 16, 32 or 64");
  using Memory = gpu::PagedMemory<P, Storage>;
  using device_type = typename Memory::device_type;
  template <class T>
  using DeviceArray = gpu::detail::DeviceArray<T>;

 public:
  using scorer_type = S;
  using admitter_type = A;
  using evictor_type = E;
  using allocator_type = memory::Paged<P, Storage>;
  using backend_type = cuda_backend;
  using storage_type = Storage;

  /// One sequence's whole forward step (engine/step_state.hpp), as the CPU Cache takes it.
  using SequenceStep = kvpolicy::SequenceStep;

  /// Allocates the pool (allocator.pages_total() pages of P slots) and the cache's scratch on the
  /// current device; `stream` runs every call (default: the legacy default stream).
  Cache(CacheShape shape, allocator_type allocator, E evictor = {}, S scorer = {}, A admitter = {},
        cudaStream_t stream = nullptr)
      : shape_(shape), checks_{shape}, evictor_(evictor), scorer_(scorer), admitter_(admitter),
        validated_(validate()),  // before the first allocation
        mem_(shape_, static_cast<std::int32_t>(allocator.pages_total()), S::needs_key_norm,
             std::min<std::int64_t>(allocator.pages_total() * P, typical_head_length()), stream) {
    const int d = shape_.head_dim;
    int device = 0;
    KVPOLICY_CUDA_CHECK(cudaGetDevice(&device), "Cache<cuda_backend>: the current device");
    KVPOLICY_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device),
                        "Cache<cuda_backend>: device ", device);
    const int per_seq = static_cast<int>(shape_.heads_total());
    rows_ = DeviceArray<std::int32_t>(static_cast<std::size_t>(shape_.kv_heads));
    evicted_ = DeviceArray<std::int64_t>(static_cast<std::size_t>(per_seq));
    context_ = DeviceArray<StepContext>(1);
    base_ = DeviceArray<std::int32_t>(1);
    query_position_ = DeviceArray<std::int32_t>(1);
    queries_ = DeviceArray<float>(std::size_t(shape_.q_heads) * d);
    out_ = DeviceArray<float>(queries_.size());
    std::size_t bytes = gpu::append_workspace_bytes(shape_.kv_heads);
    std::size_t evict_bytes = 0;
    gpu::evict_step(nullptr, evict_bytes, scorer_, evictor_, shape_, kv(), mem_.slot_tables(0), free_list(),
                    context_.get(), nullptr, nullptr, mem_.stream());
    bytes = std::max(bytes, evict_bytes);
    const gpu::DecodeBatch one{queries_.get(), base_.get(), 1, shape_.q_heads, shape_.kv_heads, out_.get()};
    bytes = std::max(bytes, gpu::decode_attention_workspace_bytes(one, std::int64_t{pages_total()} * P, P, sm_count_));
    workspace_ = DeviceArray<unsigned char>(bytes);
  }
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;
  Cache(Cache&&) noexcept = default;
  Cache& operator=(Cache&&) noexcept = default;

  const CacheShape& shape() const { return shape_; }
  const E& evictor() const { return evictor_; }
  const S& scorer() const { return scorer_; }

  // ---- sequences ---------------------------------------------------------------------------------
  void add_sequence(std::int64_t seq, std::int64_t prompt_tokens = -1) {
    Sequence st = seqs_.make(seq, shape_.layers, prompt_tokens);
    st.first.assign(static_cast<std::size_t>(shape_.heads_total()), 0);
    st.slot = mem_.acquire_slot();
    seqs_.insert(seq, std::move(st));
  }
  void remove_sequence(std::int64_t seq) {
    Sequence& st = state_of(seq);
    truncate(st, std::vector<std::int32_t>(static_cast<std::size_t>(shape_.heads_total()), 0));
    mem_.release_slot(st.slot);
    seqs_.erase(seq);
  }
  bool has_sequence(std::int64_t seq) const { return seqs_.contains(seq); }
  std::int64_t tokens(std::int64_t seq) const { return state_of(seq).n; }
  std::int64_t prompt_tokens(std::int64_t seq) const { return state_of(seq).prompt_tokens(); }
  std::int64_t length(std::int64_t seq, int layer, int head) const {
    checks_.layer(layer, "length");
    checks_.head(head, "length");
    return mem_.lengths(state_of(seq).slot)[static_cast<std::size_t>(head_index(shape_, layer, head))];
  }
  std::int64_t total_length(std::int64_t seq) const {
    std::int64_t total = 0;
    for (const auto len : mem_.lengths(state_of(seq).slot)) total += len;
    return total;
  }
  /// Metadata of entry i of a head, in storage order (the CPU cache's order: both compact alike).
  EntryMeta entry(std::int64_t seq, int layer, int head, std::int64_t i) const {
    const Sequence& st = state_of(seq);
    checks_.layer(layer, "entry");
    checks_.head(head, "entry");
    const auto seg = segment(st, layer, head);
    const std::int32_t len = mem_.length(seg);
    require(i >= 0 && i < len, "Cache::entry: index ", i, " out of range [0, ", len, ")");
    return mem_.entry(seg, i);
  }
  /// Every entry of a head, in storage order: metadata, K and V (read back from the device).
  HeadContents head_contents(std::int64_t seq, int layer, int head) const {
    const Sequence& st = state_of(seq);
    checks_.layer(layer, "head_contents");
    checks_.head(head, "head_contents");
    return mem_.head_contents(segment(st, layer, head));
  }
  std::int64_t pages_free() const { return mem_.pages_free(); }
  std::int64_t pages_total() const { return mem_.pages_total(); }

  // ---- one step, layer by layer ------------------------------------------------------------------
  /// keys/values [Hkv, T, d], log_beta [Hkv, T], host fp32, as the CPU cache takes them; gate
  /// [Hkv, T] optional and checked as there, not stored (the device admits every token, and no
  /// policy it runs reads g).
  void append(std::int64_t seq, int layer, View<const float, 3> keys, View<const float, 3> values,
              View<const float, 2> log_beta, View<const float, 2> gate = {}) {
    Sequence& st = state_of(seq);
    const std::int64_t T = keys.dim(1);
    checks_.append(seq, st, layer, T);  // the CPU cache's checks and messages (engine/step_state.hpp)
    checks_.layer_inputs(layer, T, st.n, keys, values, log_beta, gate);
    write_layer(seq, layer, T, keys, values, log_beta);
  }

 private:
  /// append() after its checks: stages the layer's entries and appends them on the device.
  void write_layer(std::int64_t seq, int layer, std::int64_t T, View<const float, 3> keys,
                   View<const float, 3> values, View<const float, 2> log_beta) {
    Sequence& st = state_of(seq);
    const int d = shape_.head_dim;
    std::vector<device_type> k(static_cast<std::size_t>(keys.size())), v(k.size());
    for (std::int64_t i = 0; i < keys.size(); ++i) {
      const Storage ks = from_float<Storage>(keys.data[i]), vs = from_float<Storage>(values.data[i]);
      std::memcpy(static_cast<void*>(&k[static_cast<std::size_t>(i)]), &ks, sizeof ks);  // the same bits
      std::memcpy(static_cast<void*>(&v[static_cast<std::size_t>(i)]), &vs, sizeof vs);
    }
    std::vector<std::int32_t> pos(static_cast<std::size_t>(shape_.kv_heads * T)), rows(static_cast<std::size_t>(shape_.kv_heads));
    for (std::int64_t h = 0; h < shape_.kv_heads; ++h) {
      rows[static_cast<std::size_t>(h)] = segment(st, layer, static_cast<int>(h));
      for (std::int64_t t = 0; t < T; ++t) pos[static_cast<std::size_t>(h * T + t)] = static_cast<std::int32_t>(st.n + t);
    }
    stage(k.size(), pos.size());
    mem_.upload(stage_keys_.get(), k.data(), k.size());
    mem_.upload(stage_values_.get(), v.data(), v.size());
    mem_.upload(stage_position_.get(), pos.data(), pos.size());
    mem_.upload(stage_write_score_.get(), log_beta.data, pos.size());
    mem_.upload(rows_.get(), rows.data(), rows.size());
    if (st.pending == 0) st.first = mem_.lengths(st.slot);  // where this step's entries begin, for abort_step
    gpu::AppendRows<device_type> a{rows_.get(), shape_.kv_heads, static_cast<std::int32_t>(T), stage_keys_.get(),
                                    stage_values_.get(), stage_position_.get(), stage_write_score_.get()};
    if constexpr (S::needs_key_norm) {  // ||k|| of the fp32 key as handed in, as the CPU cache stores it
      std::vector<float> norm(pos.size());
      for (std::int64_t h = 0; h < shape_.kv_heads; ++h)
        for (std::int64_t t = 0; t < T; ++t) {
          norm[static_cast<std::size_t>(h * T + t)] = memory::key_norm(&keys(h, t, 0), d);  // finite: checked
        }
      mem_.upload(stage_norm_.get(), norm.data(), norm.size());
      a.key_norm = stage_norm_.get();
    }
    gpu::Status s{};
    while (true) {
      std::size_t bytes = workspace_.size();
      gpu::append(workspace_.get(), bytes, kv(), tables_view(), free_list(), a, mem_.status_word(), mem_.stream());
      s = mem_.status();
      if (s.code != gpu::Status::table_full || mem_.max_pages() >= mem_.pages_total()) break;
      mem_.reset_status();  // a head outgrew its block-table row: widen every row, try again (nothing was written)
      const std::int64_t wider = std::max<std::int64_t>(2 * std::int64_t{mem_.max_pages()}, s.needed);
      mem_.widen_rows(static_cast<std::int32_t>(std::min<std::int64_t>(mem_.pages_total(), wider)));
    }
    if (s.code == gpu::Status::out_of_pages || s.code == gpu::Status::table_full) {
      mem_.reset_status();
      fail("Cache::append: out of memory: sequence ", seq, " layer ", layer, " cannot take ", T,
           " more entries per head (", s.code == gpu::Status::table_full ? "a head's block table is full: " : "",
           s.needed, " pages needed, ", s.available, s.code == gpu::Status::table_full ? " per head)" : " free)");
    }
    st.pending = T;
    st.appended[static_cast<std::size_t>(layer)] = 1;
  }

 public:

  /// queries [Hq, T, d] of this step's T tokens at `layer` (appended already) -> out [Hq, T, d],
  /// causal inside the chunk (SPEC §6) as on the CPU: the chunk's T rows go to the decode kernel
  /// as a batch of T queries over the same heads, each at its own position.
  void attend(std::int64_t seq, int layer, View<const float, 3> queries, View<float, 3> out) {
    const Sequence& st = state_of(seq);
    checks_.layer(layer, "attend");
    require(st.appended[static_cast<std::size_t>(layer)], "Cache::attend: layer ", layer, " of sequence ", seq,
            " has not been appended in this step");
    const std::array<std::int64_t, 3> qshape{shape_.q_heads, st.pending, shape_.head_dim};
    require_shape(queries, qshape, "Cache::attend: queries");
    require_shape(View<const float, 3>(out), qshape, "Cache::attend: out");
    checks_.queries(queries, layer);
    attend_layer(st, layer, queries, out);
  }

  /// Closes the step: n += T, then the Evictor's trigger and, if it fires, one evict_step over the
  /// sequence (SPEC §1–2 on the device: score, select, compact). A NaN score leaves the step open
  /// and the cache as it was, as on the CPU.
  EvictionReport commit(std::int64_t seq, std::vector<EvictedEntry>* evicted = nullptr) {
    const Sequence& st = state_of(seq);
    checks_.commit(seq, st, false);
    return close_steps(std::span<const std::int64_t>(&seq, 1), evicted).front();
  }

  /// Discards the open step of `seq`: its entries leave, their pages return to the pool.
  void abort_step(std::int64_t seq) {
    Sequence& st = state_of(seq);
    if (st.pending == 0) return;
    truncate(st, st.first);
    st.end();
  }

  /// append every layer, attend each when queries are given, commit. Validated whole, every layer
  /// and the pool's room for it, before anything is written (the CPU cache's checks,
  /// engine/step_state.hpp).
  EvictionReport step(const SequenceStep& s, std::vector<EvictedEntry>* evicted = nullptr) {
    checks_.step(s, state_of(s.seq), false);
    const std::int64_t T = s.keys.dim(2);
    require(pages_needed(state_of(s.seq), T) <= pages_free(), "Cache::step: out of memory: sequence ", s.seq,
            " cannot take ", T, " more entries in every head (", pages_free(), " of ", pages_total(), " pages free)");
    try {
      write_and_attend(s);
      return commit(s.seq, evicted);
    } catch (...) {
      abort_step(s.seq);
      throw;
    }
  }
  EvictionReport step(std::int64_t seq, View<const float, 4> keys, View<const float, 4> values,
                      View<const float, 3> log_beta, View<const float, 4> queries = {}, View<float, 4> out = {},
                      std::vector<EvictedEntry>* evicted = nullptr) {
    return step(SequenceStep{seq, keys, values, log_beta, queries, out}, evicted);
  }

  /// A batch of sequences, each with its own T, under the CPU cache's contract: validated whole
  /// (distinct sequences, shapes, values, the pool's room for all of it) before any write, and every
  /// sequence's eviction planned before any step closes — one evict_step over the batch, so a NaN
  /// score anywhere (a user-defined Scorer) compacts nothing and takes back every step.
  std::vector<EvictionReport> step_batch(std::span<const SequenceStep> batch) {
    std::int64_t needed = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      checks_.step(batch[i], state_of(batch[i].seq), false);
      for (std::size_t j = 0; j < i; ++j)
        require(batch[j].seq != batch[i].seq, "Cache::step_batch: sequence ", batch[i].seq, " appears twice");
      needed += pages_needed(state_of(batch[i].seq), batch[i].keys.dim(2));
    }
    require(needed <= pages_free(), "Cache::step_batch: out of memory: the batch needs ", needed, " pages, ",
            pages_free(), " of ", pages_total(), " are free");
    std::vector<std::int64_t> seqs;
    for (const auto& s : batch) seqs.push_back(s.seq);
    std::size_t started = 0;
    try {
      for (const auto& s : batch) {
        ++started;
        write_and_attend(s);
      }
      return close_steps(seqs, nullptr);
    } catch (...) {
      for (std::size_t i = started; i-- > 0;) abort_step(batch[i].seq);  // last first, as on the CPU
      throw;
    }
  }

  // ---- the device views, for an engine that drives the kernels itself ----------------------------
  gpu::PagedKV<device_type> kv() const { return mem_.kv(); }
  /// Every sequence slot's block tables: segment = slot * L * Hkv + layer * Hkv + head.
  gpu::BlockTableView tables_view() const { return mem_.tables_view(); }
  gpu::FreeList free_list() const { return mem_.free_list(); }
  /// Block-table rows of at least max_pages pages (capped at the pool), for an engine that appends
  /// through the kernels itself: rows start at what the rule lets a head hold plus a chunk, and an
  /// append through this cache widens them when a head needs more. Widening reallocates the tables:
  /// views taken before it (tables_view(), slot tables) are stale after it.
  void reserve_rows(std::int32_t max_pages) { mem_.widen_rows(std::min(max_pages, mem_.pages_total())); }
  std::int32_t max_pages_per_head() const { return mem_.max_pages(); }
  /// The slot of a sequence in tables_view().
  std::int32_t slot(std::int64_t seq) const { return state_of(seq).slot; }
  cudaStream_t stream() const { return mem_.stream(); }

 private:
  /// The shared step state (engine/step_state.hpp) and where the sequence lives on the device.
  struct Sequence : detail::StepState {
    std::int32_t slot = 0;
    std::vector<std::int32_t> first;  // per head: its length when the open step began
  };

  const Sequence& state_of(std::int64_t seq) const { return seqs_.at(seq); }
  Sequence& state_of(std::int64_t seq) { return seqs_.at(seq); }
  std::int32_t segment(const Sequence& st, int layer, int head) const { return mem_.segment(st.slot, layer, head); }
  /// Shrinks each head of a sequence to keep_first[i] entries (its first ones).
  void truncate(const Sequence& st, const std::vector<std::int32_t>& keep_first) {
    mem_.truncate(st.slot, keep_first, workspace_.get(), workspace_.size());
  }
  /// Staging buffers for one append's inputs (grown, never shrunk).
  void stage(std::size_t kv_elements, std::size_t entries) {
    if (stage_keys_.size() < kv_elements) {
      stage_keys_ = DeviceArray<device_type>(kv_elements);
      stage_values_ = DeviceArray<device_type>(kv_elements);
    }
    if (stage_position_.size() < entries) {
      stage_position_ = DeviceArray<std::int32_t>(entries);
      stage_write_score_ = DeviceArray<float>(entries);
      if (S::needs_key_norm) stage_norm_ = DeviceArray<float>(entries);
    }
  }
  void write_and_attend(const SequenceStep& s) {
    detail::for_each_layer(
        s, shape_.layers,
        [&](int l, auto keys, auto values, auto log_beta, auto) { write_layer(s.seq, l, s.keys.dim(2), keys, values, log_beta); },
        [&](int l, auto queries, auto out) { attend_layer(state_of(s.seq), l, queries, out); });
  }

  /// attend() after its checks. The device batch is [T, Hq, d] (the host view is [Hq, T, d]).
  void attend_layer(const Sequence& st, int layer, View<const float, 3> queries, View<float, 3> out) {
    const std::int64_t T = st.pending;
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
    const std::vector<std::int32_t> base(static_cast<std::size_t>(T), segment(st, layer, 0));
    std::vector<std::int32_t> q_pos(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) q_pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(st.n + t);
    mem_.upload(queries_.get(), rows.data(), rows.size());
    mem_.upload(base_.get(), base.data(), base.size());
    mem_.upload(query_position_.get(), q_pos.data(), q_pos.size());
    gpu::DecodeBatch batch{queries_.get(), base_.get(), static_cast<std::int32_t>(T), shape_.q_heads, shape_.kv_heads,
                            out_.get()};
    batch.query_position = query_position_.get();  // causal inside the chunk
    batch.mask = composed_attention_mask(evictor_, admitter_);  // WG-KV's vertical-slash mask, SPEC §3
    const std::vector<std::int32_t> len = mem_.lengths(st.slot);  // the split follows the layer's longest head
    const auto layer_first = len.begin() + head_index(shape_, layer, 0);
    const std::int64_t longest = *std::max_element(layer_first, layer_first + shape_.kv_heads);
    std::size_t bytes = gpu::decode_attention_workspace_bytes(batch, longest, P, sm_count_);
    reserve_workspace(bytes);
    gpu::decode_attention(workspace_.get(), bytes, kv(), tables_view(), batch, longest, mem_.stream(), sm_count_);
    mem_.download(rows.data(), out_.get(), rows.size());
    for (std::size_t h = 0; h < Hq; ++h)
      for (std::int64_t t = 0; t < T; ++t)
        std::memcpy(&out(static_cast<std::int64_t>(h), t, 0), &rows[(static_cast<std::size_t>(t) * Hq + h) * d],
                    d * sizeof(float));
  }

  /// Pages the sequence's heads take to grow by T entries each (the CPU pool's count).
  std::int64_t pages_needed(const Sequence& st, std::int64_t T) const {
    std::int64_t need = 0;
    for (const std::int32_t len : mem_.lengths(st.slot)) need += (len + T + P - 1) / P - (len + P - 1) / P;
    return need;
  }

  void reserve_workspace(std::size_t bytes) {
    if (workspace_.size() < bytes) workspace_ = DeviceArray<unsigned char>(bytes);
  }

  /// Closes the open steps of `seqs` (every layer appended): each sequence's trigger (the Evictor's
  /// rule, on the host as on the device), then one evict_step over the sequences it fires for —
  /// their block-table rows side by side, gathered when there are several — so a NaN score in any
  /// of them compacts nothing in all of them (the step_batch contract); then every step closes.
  std::vector<EvictionReport> close_steps(std::span<const std::int64_t> seqs, std::vector<EvictedEntry>* evicted) {
    const auto per_seq = static_cast<std::size_t>(shape_.heads_total());
    std::vector<EvictionReport> reports(seqs.size());
    std::vector<StepContext> contexts;
    std::vector<std::size_t> fired;  // indices into seqs
    std::vector<std::vector<std::int32_t>> before(seqs.size());
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      const Sequence& st = state_of(seqs[i]);
      before[i] = mem_.lengths(st.slot);
      std::vector<std::int64_t> lens(before[i].begin(), before[i].end());
      std::vector<std::uint8_t> active(lens.size());
      StepContext ctx = st.context();  // the CPU cache's context (engine/step_state.hpp)
      for (const auto len : lens) ctx.entries += len;
      contexts.push_back(ctx);
      reports[i].triggered = evict::trigger(evictor_, shape_, ctx, lens, active);
      if (reports[i].triggered) fired.push_back(i);
    }
    std::vector<std::vector<std::vector<std::int32_t>>> positions_before(seqs.size());
    if (evicted != nullptr)
      for (const std::size_t i : fired) positions_before[i] = mem_.head_positions(state_of(seqs[i]).slot, before[i]);
    if (!fired.empty()) {
      const auto k = fired.size();
      std::vector<StepContext> ctx;
      for (const std::size_t i : fired) ctx.push_back(contexts[i]);
      if (context_.size() < k) context_ = DeviceArray<StepContext>(k);
      if (evicted_.size() < k * per_seq) evicted_ = DeviceArray<std::int64_t>(k * per_seq);
      mem_.upload(context_.get(), ctx.data(), k);
      // one sequence's rows are contiguous in the tables; several are gathered side by side
      const std::size_t row_ints = per_seq * static_cast<std::size_t>(mem_.max_pages());
      gpu::BlockTableView t = mem_.slot_tables(state_of(seqs[fired[0]]).slot);
      if (k > 1) {
        if (gather_tables_.size() < k * row_ints) gather_tables_ = DeviceArray<std::int32_t>(k * row_ints);
        if (gather_length_.size() < k * per_seq) gather_length_ = DeviceArray<std::int32_t>(k * per_seq);
        for (std::size_t j = 0; j < k; ++j) {
          const gpu::BlockTableView from = mem_.slot_tables(state_of(seqs[fired[j]]).slot);
          mem_.copy(gather_tables_.get() + j * row_ints, from.table, row_ints);
          mem_.copy(gather_length_.get() + j * per_seq, from.length, per_seq);
        }
        t = {gather_tables_.get(), gather_length_.get(), static_cast<std::int32_t>(k * per_seq), mem_.max_pages()};
      }
      std::size_t bytes = 0;
      gpu::evict_step(nullptr, bytes, scorer_, evictor_, shape_, kv(), t, free_list(), context_.get(), nullptr,
                       nullptr, mem_.stream());
      reserve_workspace(bytes);
      bytes = workspace_.size();
      gpu::evict_step(workspace_.get(), bytes, scorer_, evictor_, shape_, kv(), t, free_list(), context_.get(),
                       evicted_.get(), mem_.status_word(), mem_.stream());
      const gpu::Status s = mem_.status();
      if (s.code == gpu::Status::nan_score) {  // nothing was compacted: every step is still open
        mem_.reset_status();
        const std::size_t i = fired[static_cast<std::size_t>(s.segment) / per_seq];
        const auto head = static_cast<std::int32_t>(static_cast<std::size_t>(s.segment) % per_seq);
        fail("Cache::commit: the scorer returned NaN for sequence ", seqs[i], " (layer ", head / shape_.kv_heads,
             " head ", head % shape_.kv_heads, ", n = ", contexts[i].n, "); a NaN score never enters a ranking");
      }
      if (k > 1)
        for (std::size_t j = 0; j < k; ++j) {
          const gpu::BlockTableView to = mem_.slot_tables(state_of(seqs[fired[j]]).slot);
          mem_.copy(to.table, gather_tables_.get() + j * row_ints, row_ints);
          mem_.copy(to.length, gather_length_.get() + j * per_seq, per_seq);
        }
      std::vector<std::int64_t> gone(k * per_seq);
      mem_.download(gone.data(), evicted_.get(), gone.size());
      for (std::size_t j = 0; j < k; ++j)
        for (std::size_t h = 0; h < per_seq; ++h) reports[fired[j]].evicted += gone[j * per_seq + h];
    }
    // the steps close before anything else can throw: the heads are compacted already
    for (std::size_t i = 0; i < seqs.size(); ++i) state_of(seqs[i]).commit(contexts[i]);
    if (evicted != nullptr)
      for (const std::size_t i : fired) {
        const Sequence& st = state_of(seqs[i]);
        const auto after = mem_.head_positions(st.slot, mem_.lengths(st.slot));
        for (std::size_t h = 0; h < after.size(); ++h) {
          std::vector<std::int32_t> kept = after[h];
          std::sort(kept.begin(), kept.end());
          for (const std::int32_t p : positions_before[i][h])
            if (!std::binary_search(kept.begin(), kept.end(), p))
              evicted->push_back({static_cast<int>(h) / shape_.kv_heads, static_cast<int>(h) % shape_.kv_heads, p});
        }
      }
    return reports;
  }

  /// About what one head holds after its eviction under the Evictor's stated rule, plus room for a
  /// prefill chunk of a few pages: the initial width of a block-table row (rows widen on demand).
  std::int64_t typical_head_length() const {
    constexpr std::int64_t buffer = 128, chunk = 256;
    if constexpr (selects_per_head<E>) {
      const evict::HeadSelection sel = evictor_.selection();
      if (sel.threshold) return 4 * sel.window + chunk;  // entries past the window stay by the bound (WG-KV)
      if (sel.keeps_prompt) return sel.keep + 1024;      // the prompt stays on top of the budget (EpiKV)
      return sel.keep + buffer + chunk;
    } else {
      return evictor_.group_heads(shape_) * (evictor_.selection().budget + buffer) + chunk;
    }
  }
  /// The checks of the CPU Cache's constructor, and the device's head widths.
  bool validate() const {
    evictor_.validate(shape_);
    scorer_.validate();
    if constexpr (admitter_validates<A>) admitter_.validate();
    // as on the CPU (cache.hpp): an evictor's config may not name a scorer the cache was not given
    if constexpr (evictor_checks_scorer<E, S>) evictor_.validate_scorer(scorer_);
    const int d = shape_.head_dim;
    require(d == 64 || d == 128 || d == 256, "Cache<cuda_backend>: head_dim = ", d, " has no kernel (64, 128 or 256)");
    return true;
  }

  CacheShape shape_;
  detail::StepChecks<S, A, Storage> checks_;
  E evictor_;
  S scorer_;
  A admitter_;
  bool validated_;
  Memory mem_;  // the pool, block tables and free list
  // the host-view API's scratch: staged inputs, queries, the eviction's batch, the kernels' workspace
  DeviceArray<device_type> stage_keys_, stage_values_;
  DeviceArray<std::int32_t> rows_, base_, query_position_, stage_position_, gather_tables_, gather_length_;
  DeviceArray<float> queries_, out_, stage_write_score_, stage_norm_;
  int sm_count_ = 0;
  DeviceArray<std::int64_t> evicted_;
  DeviceArray<StepContext> context_;
  DeviceArray<unsigned char> workspace_;
  detail::Sequences<Sequence> seqs_;
};

}  // namespace kvpolicy
