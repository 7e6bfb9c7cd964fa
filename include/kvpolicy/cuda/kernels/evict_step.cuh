/// \file
/// kvpolicy/cuda/kernels/evict_step.cuh — one eviction step on the device: trigger, score, select, compact
/// (SPEC §1 per head, SPEC §2 global and layer-wise, §3 WG-KV's ring, §4 EpiKV's budget), all on one
/// stream, scratch from a workspace sized up front, no allocation and no host synchronisation.
/// Templated on the Evictor: it runs the rule the Evictor states once (core/rule.hpp) — its
/// trigger kernel calls the Evictor's fires(), its selection kernels read the Evictor's
/// selection() as it is — the statement the host's evict::select_survivors runs too.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/cuda/kernels/compact.cuh"
#include "kvpolicy/cuda/kernels/pooled_topk.cuh"
#include "kvpolicy/cuda/kernels/score.cuh"
#include "kvpolicy/cuda/kernels/segmented_topk.cuh"
#include "kvpolicy/cuda/memory/views.cuh"
#include "kvpolicy/core/rule.hpp"

namespace kvpolicy::gpu {

namespace detail {

/// One block per group of `per` consecutive segments (the Evictor's group_heads): the group's
/// trigger, the Evictor's own fires() on the group's total length, written to every segment of it.
template <class E>
__global__ void __launch_bounds__(SelectTuning::threads)
    trigger_kernel(BlockTableView t, E evictor, std::int32_t per, std::int32_t per_sequence, const StepContext* context,
                   std::uint8_t* group_active, std::uint8_t* active) {
  __shared__ typename BlockReduceI64::TempStorage reduce;
  __shared__ int fires;
  const long long first = static_cast<long long>(blockIdx.x) * per;
  long long sum = 0;
  for (int j = threadIdx.x; j < per; j += blockDim.x) sum += t.length[first + j];
  const long long total = BlockReduceI64(reduce).Sum(sum);
  if (threadIdx.x == 0) {
    fires = evictor.fires(total, per, context[first / per_sequence]);
    group_active[blockIdx.x] = static_cast<std::uint8_t>(fires);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < per; j += blockDim.x) active[first + j] = static_cast<std::uint8_t>(fires);
}

struct EvictWork {
  int* failed;  // a NaN score: the step compacts nothing
  std::uint8_t* group_active;
  std::uint8_t* active;
  std::int64_t* offsets;
  float* score;
  std::int32_t* position;
  std::uint8_t* keep;
  void* pooled;
  std::size_t pooled_bytes;
  void* compact;
  std::size_t compact_bytes;
};

template <class T>
EvictWork carve_evict(WorkspaceLayout& layout, void* base, std::int32_t per_group, const PagedKV<T>& kv,
                      const BlockTableView& t) {
  EvictWork w{};
  const std::int32_t groups = t.segments / per_group;
  w.failed = layout.take<int>(base, 1);
  w.group_active = layout.take<std::uint8_t>(base, groups);
  w.active = layout.take<std::uint8_t>(base, t.segments);
  w.offsets = layout.take<std::int64_t>(base, std::int64_t{t.segments} + 1);
  w.score = layout.take<float>(base, kv.slots());
  w.position = layout.take<std::int32_t>(base, kv.slots());
  w.keep = layout.take<std::uint8_t>(base, kv.slots());
  std::size_t bytes = 0;
  DeviceSegments none;
  none.segments = t.segments;
  PooledRule pr;
  pr.segments_per_group = per_group;
  pooled_select(nullptr, bytes, none, pr, nullptr, 0, nullptr);
  w.pooled_bytes = bytes;
  w.pooled = layout.take<char>(base, static_cast<std::int64_t>(bytes));
  w.compact_bytes = compact_workspace_bytes(kv.slots(), t.segments);
  w.compact = layout.take<char>(base, static_cast<std::int64_t>(w.compact_bytes));
  return w;
}

}  // namespace detail

/// About how long a head is when its eviction runs (a budget plus a default buffer of 128): the
/// grid hint of the scoring and pooled selection kernels, which stride over longer heads. An
/// Evictor that selects itself (on the host, dist::Sharded) states no budget: 1024 then.
template <class E>
std::int64_t eviction_length_hint(const E& evictor) {
  constexpr std::int64_t buffer = 128;
  if constexpr (!evictor_states_selection<E>) {
    return 1024 + buffer;
  } else if constexpr (selects_per_head<E>) {
    const evict::HeadSelection sel = evictor.selection();
    return std::max(sel.keep, sel.window) + buffer;
  } else {
    return evictor.selection().budget + buffer;
  }
}

namespace detail {

/// The trigger of an eviction step: the Evictor's fires() over its groups of heads, into w.active
/// (per segment) and w.group_active (per group). A caller that knows the lengths on the host (the
/// Cache) runs evict::trigger_heads there instead and uploads the same flags.
template <class Evictor>
void trigger_heads(const EvictWork& w, const Evictor& evictor, const CacheShape& shape, const BlockTableView& t,
                   const StepContext* context, std::int32_t per_group, cudaStream_t stream) {
  const auto per_sequence = static_cast<std::int32_t>(shape.heads_total());
  const std::int32_t groups = t.segments / per_group;
  trigger_kernel<Evictor><<<static_cast<unsigned>(groups), SelectTuning::threads, 0, stream>>>(
      t, evictor, per_group, per_sequence, context, w.group_active, w.active);
  check_launch("trigger_kernel", "segments = ", t.segments, ", groups = ", groups);
}

/// Raises the scores of the entries `marked` flags to +inf (the first `*total` of them): a
/// selection's guaranteed share ranks above every score.
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void raise_marked_kernel(float* score, const std::uint8_t* marked, const std::int64_t* total) {
  const long long n = *total;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    if (marked[i]) score[i] = __int_as_float(0x7f800000);
}

/// A selection's guaranteed share (core/rule.hpp): each active head's best `share.sel.keep`
/// entries, protections first, marked in w.keep and raised to +inf in w.score.
inline void raise_guaranteed(const EvictWork& w, const DeviceSegments& s, const SegmentRule& share,
                             std::int64_t max_length, cudaStream_t stream) {
  segmented_select(s, share, w.keep, stream);
  const unsigned blocks = std::min(blocks_for(std::max<std::int64_t>(max_length * s.segments, 1),
                                              SelectTuning::threads, "raise_marked_kernel"), 1024u);
  raise_marked_kernel<><<<blocks, SelectTuning::threads, 0, stream>>>(w.score, w.keep, w.offsets + s.segments);
  check_launch("raise_marked_kernel", "segments = ", s.segments);
}

/// The survivors of the scored active heads (w.offsets, w.score, w.position), as the Evictor's
/// selection() states, into w.keep. Writes only the workspace.
template <class Evictor>
void select_kept(const EvictWork& w, const Evictor& evictor, const CacheShape& shape, const BlockTableView& t,
                 const StepContext* context, std::int32_t per_group, cudaStream_t stream) {
  const auto per_sequence = static_cast<std::int32_t>(shape.heads_total());
  const std::int64_t max_length = eviction_length_hint(evictor);
  DeviceSegments s{w.score, w.position, w.offsets, t.segments};
  if constexpr (selects_per_head<Evictor>) {
    SegmentRule rule;
    rule.sel = evictor.selection();
    rule.active = w.active;
    rule.context = context;
    rule.context_stride = per_sequence;
    if (rule.sel.guaranteed > 0) {  // the head's best `guaranteed` (past the prompt, as keep) stay
      SegmentRule share = rule;
      share.sel.threshold = false;
      share.sel.keep = rule.sel.guaranteed;
      share.sel.guaranteed = 0;
      raise_guaranteed(w, s, share, max_length, stream);
      rule.sel.guaranteed = 0;
    }
    segmented_select(s, rule, w.keep, stream);
  } else {
    PooledRule pr;
    pr.sel = evictor.selection();
    pr.segments_per_group = per_group;
    pr.group_active = w.group_active;
    if (pr.sel.guaranteed > 0) {  // each head's best `guaranteed` (protections first) rank above the pool
      SegmentRule share;
      share.sel.keep = pr.sel.guaranteed;
      share.sel.window = pr.sel.window;
      share.sel.sinks = pr.sel.sinks;
      share.active = w.active;
      raise_guaranteed(w, s, share, max_length, stream);
      pr.sel.guaranteed = 0;
    }
    std::size_t bytes = w.pooled_bytes;
    pooled_select(w.pooled, bytes, s, pr, w.keep, max_length, stream);
  }
}

/// The scores of an eviction step, once w.active holds the trigger: the active heads' offsets, and
/// their entries' scores and positions at their sequence's context. It writes only the workspace w
/// (and the NaN flag, with Status::nan_score in *status when a score is NaN).
template <class Scorer, class Evictor, class T>
void score_active(const EvictWork& w, const Scorer& scorer, const Evictor& evictor, const CacheShape& shape,
                  const PagedKV<T>& kv, const BlockTableView& t, const StepContext* context, Status* status,
                  cudaStream_t stream) {
  const auto per_sequence = static_cast<std::int32_t>(shape.heads_total());
  KVPOLICY_CUDA_CHECK(cudaMemsetAsync(w.failed, 0, sizeof(int), stream), "gpu::evict_step: clearing its NaN flag");
  segment_offsets(t, w.active, w.offsets, stream);
  score_segments(scorer, kv.metadata(), t, kv.page_size, context, per_sequence, w.active, w.offsets, w.score,
                 w.position, eviction_length_hint(evictor), stream, w.failed, status);
}

/// The plan of an eviction step (llama.cpp's prepare, before its apply), once w.active and
/// w.group_active hold the trigger: the active heads' scores at their sequence's context, and their
/// survivors as the Evictor's selection() states. It writes only the workspace w (offsets, scores,
/// positions, the keep mask, and the NaN flag, with Status::nan_score in *status when a score is
/// NaN); the pool, the block tables and the free list are as they were.
template <class Scorer, class Evictor, class T>
void select_survivors(const EvictWork& w, const Scorer& scorer, const Evictor& evictor, const CacheShape& shape,
                      const PagedKV<T>& kv, const BlockTableView& t, const StepContext* context,
                      std::int32_t per_group, Status* status, cudaStream_t stream) {
  score_active(w, scorer, evictor, shape, kv, t, context, status, stream);
  select_kept(w, evictor, shape, t, context, per_group, stream);
}

/// The apply of a planned step, the one launch that changes memory: the active heads compacted to
/// the entries w.keep marks, emptied pages back to the free list, each head's evicted count in
/// evicted (optional). It changes nothing when the plan met a NaN score (w.failed, read on the device).
template <class T>
void apply_eviction(const EvictWork& w, const PagedKV<T>& kv, const BlockTableView& t, FreeList free,
                    std::int64_t* evicted, cudaStream_t stream) {
  std::size_t bytes = w.compact_bytes;
  compact(w.compact, bytes, kv, t, w.offsets, w.keep, w.active, free, evicted, kv.slots(), stream, w.failed);
}

}  // namespace detail

/// One eviction step over every sequence slot of the tables (segments = slots * L * Hkv): the
/// heads the Evictor's rule triggers for (its fires() over groups of group_heads(shape) heads) are
/// scored by `scorer` at their sequence's context (context[slot]), their survivors selected as the
/// Evictor's selection() states, and compacted; emptied pages return to the
/// free list. evicted (optional, device, [segments]) receives each head's evicted count. A NaN score
/// (only a user-defined Scorer makes one) is never ranked: the step then changes nothing and reports
/// Status::nan_score in *status (optional, device). Two-phase: with workspace == nullptr sets
/// workspace_bytes (it grows with the pool's slots) and returns. context is [slots] StepContext on
/// the device. Throws for an Evictor config out of range (its own validate(shape) and message), for
/// segments not a multiple of L * Hkv, and when the pool lacks a field the Scorer reads (key_norm,
/// attention_mass). Its building blocks (segment_offsets and score_segments, cuda/kernels/score.cuh;
/// segmented_select, segmented_topk.cuh; pooled_select, pooled_topk.cuh; compact, compact.cuh) can
/// also be called on their own.
template <class Scorer, class Evictor, class T>
  requires evictor_states_selection<Evictor>
void evict_step(void* workspace, std::size_t& workspace_bytes, const Scorer& scorer, const Evictor& evictor,
                const CacheShape& shape, const PagedKV<T>& kv, const BlockTableView& t, FreeList free,
                const StepContext* context, std::int64_t* evicted, Status* status, cudaStream_t stream) {
  constexpr const char* who = "gpu::evict_step";
  evictor.validate(shape);
  kv.validate(who);
  t.validate(who);
  // what the Scorer reads must be in the pool (else every score would read 0: a silent recency)
  for (const Field f : fields_all)
    require(!reads_field<Scorer>(f) || kv.fields[f] != nullptr, who, ": this Scorer ", field_use(f), "; the pool has none");
  const auto per_sequence = static_cast<std::int32_t>(shape.heads_total());
  require(t.segments % per_sequence == 0, who, ": segments = ", t.segments, " is not a multiple of L x Hkv = ",
          per_sequence);
  const std::int64_t group = evictor.group_heads(shape);
  require(group >= 1 && per_sequence % group == 0, who, ": the Evictor's group_heads = ", group,
          " must divide L x Hkv = ", per_sequence, " (heads trigger together within one sequence)");
  const auto per_group = static_cast<std::int32_t>(group);
  WorkspaceLayout layout;
  detail::carve_evict(layout, nullptr, per_group, kv, t);
  if (size_query(workspace, workspace_bytes, layout.bytes(), who)) return;
  free.validate(who);
  require(context != nullptr, who, ": context must be a device pointer");
  WorkspaceLayout carve;
  const detail::EvictWork w = detail::carve_evict(carve, workspace, per_group, kv, t);
  detail::trigger_heads(w, evictor, shape, t, context, per_group, stream);
  detail::select_survivors(w, scorer, evictor, shape, kv, t, context, per_group, status, stream);
  detail::apply_eviction(w, kv, t, free, evicted, stream);
}

}  // namespace kvpolicy::gpu
