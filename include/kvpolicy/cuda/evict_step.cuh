/// \file
/// kvpolicy/cuda/evict_step.cuh — one eviction step on the device: trigger, score, select, compact
/// (SPEC §1 per head, SPEC §2 global and layer-wise), all on one stream, scratch from a workspace
/// sized up front, no allocation and no host synchronisation. The CUDA twin of the planning and
/// compaction Cache::commit does with evict::PerHead / evict::LayerWise / evict::Global.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/cuda/compact.cuh"
#include "kvpolicy/cuda/pooled_topk.cuh"
#include "kvpolicy/cuda/score.cuh"
#include "kvpolicy/cuda/segmented_topk.cuh"
#include "kvpolicy/cuda/views.cuh"

namespace kvpolicy::cuda {

/// Which heads trigger together and rank together: TRIM-KV per head (SPEC §1), DBTrimKV layer-wise
/// and global (SPEC §2), WG-KV's ring and promotion (SPEC §3, evict::WriteGated) and EpiKV's budget
/// over generated tokens (SPEC §4, evict::Generated), the last two per head.
enum class Scope { per_head, layer_wise, global, write_gated, generated };

/// The evictor's parameters, as evict::PerHead / LayerWise / Global take them (SPEC §1–2).
struct EvictionRule {
  Scope scope = Scope::per_head;
  std::int32_t layers = 0;    // L
  std::int32_t kv_heads = 0;  // Hkv
  std::int64_t budget = 1024; // M per head
  std::int64_t buffer = 128;  // B
  std::int64_t window = 0;    // w
  std::int64_t sinks = 0;     // S oldest entries of each head protected (SPEC §5), every scope
  double threshold = 0.0;     // alpha; 0 = top-k
  double floor_ratio = 0.0;   // f (pooled scopes)
  std::int64_t local = 256;   // W_local (write_gated)
  double tau = 0.1;           // write_gated: kept past the ring iff the score (g) >= tau
  std::int64_t recency = -1;  // R (generated): -1 = min(128, K / 4); budget is K there

  std::int64_t recent() const { return recency >= 0 ? recency : std::min<std::int64_t>(128, budget / 4); }

  KVPOLICY_HD std::int32_t segments_per_group() const {
    return scope == Scope::global ? layers * kv_heads : scope == Scope::layer_wise ? kv_heads : 1;
  }
  void validate(const char* who) const {
    require(layers >= 1 && kv_heads >= 1, who, ": layers = ", layers, " and kv_heads = ", kv_heads, " must be >= 1");
    require(sinks >= 0 && sinks <= INT32_MAX, who, ": sinks S = ", sinks, " must be in [0, 2^31 - 1]");
    if (scope == Scope::write_gated) {
      require(local >= 1 && local <= INT32_MAX, who, ": W_local = ", local, " must be in [1, 2^31 - 1]");
      require(std::isfinite(tau) && tau > 0.0 && tau <= 1.0, who, ": tau = ", tau, " must be in (0, 1]");
      return;
    }
    if (scope == Scope::generated) {
      require(budget >= 1 && budget <= INT32_MAX, who, ": budget K = ", budget, " must be in [1, 2^31 - 1]");
      require(recency >= -1 && recency <= budget, who, ": recency R = ", recency, " must be -1 or in [0, K = ", budget,
              "]");
      return;
    }
    require(budget >= 1, who, ": budget M = ", budget, " must be >= 1");
    require(buffer >= 1, who, ": buffer B = ", buffer, " must be >= 1");
    require(budget <= INT32_MAX - buffer, who, ": budget M = ", budget, " plus buffer B = ", buffer,
            " exceeds 2^31 - 1 entries per head");
    require(window >= 0 && window <= budget, who, ": window w = ", window, " must be in [0, budget M = ", budget, "]");
    require(threshold == 0.0 || (std::isfinite(threshold) && threshold > 0.0), who, ": threshold alpha = ", threshold,
            " must be > 0 and finite (0 disables the threshold variant)");
    require(floor_ratio >= 0.0 && floor_ratio < 1.0, who, ": floor_ratio f = ", floor_ratio, " must be in [0, 1)");
    require(!(floor_ratio > 0.0 && threshold > 0.0), who, ": floor_ratio and threshold are exclusive variants");
    require(!(floor_ratio > 0.0 && scope == Scope::per_head), who, ": floor_ratio applies to the pooled scopes only");
  }
};

namespace detail {

/// One block per group: the group's trigger (SPEC §1: a head at M + B; §2 layer-wise: a layer over
/// Hkv (M + B); §2 global: a sequence at L Hkv (M + B)), written to every segment of it.
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(kSelectThreads)
    trigger_kernel(BlockTables t, EvictionRule r, const StepContext* context, std::uint8_t* group_active,
                   std::uint8_t* active) {
  __shared__ typename BlockReduceI64::TempStorage reduce;
  __shared__ int fires;
  const int per = r.segments_per_group();
  const long long first = static_cast<long long>(blockIdx.x) * per;
  long long sum = 0;
  for (int j = threadIdx.x; j < per; j += blockDim.x) sum += t.length[first + j];
  const long long total = BlockReduceI64(reduce).Sum(sum);
  if (threadIdx.x == 0) {
    const long long bound = static_cast<long long>(per) * (r.budget + r.buffer);
    if (r.scope == Scope::write_gated)  // a head longer than its ring (per = 1)
      fires = total > r.local;
    else if (r.scope == Scope::generated)  // more than K generated entries (per = 1)
      fires = total - context[first / (static_cast<long long>(r.layers) * r.kv_heads)].prompt > r.budget;
    else
      fires = r.scope == Scope::layer_wise ? total > bound : total >= bound;
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
EvictWork carve_evict(WorkspaceLayout& layout, void* base, const EvictionRule& r, const PagedKV<T>& kv,
                      const BlockTables& t) {
  EvictWork w{};
  const std::int32_t groups = t.segments / r.segments_per_group();
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
  pr.segments_per_group = r.segments_per_group();
  pooled_select(nullptr, bytes, none, pr, nullptr, 0, nullptr);
  w.pooled_bytes = bytes;
  w.pooled = layout.take<char>(base, static_cast<std::int64_t>(bytes));
  w.compact_bytes = compact_workspace_bytes(kv.slots(), t.segments);
  w.compact = layout.take<char>(base, static_cast<std::int64_t>(w.compact_bytes));
  return w;
}

}  // namespace detail

/// One eviction step over every sequence slot of the tables (segments = slots * L * Hkv): the
/// heads the rule triggers for are scored by `scorer` at their sequence's context (context[slot]),
/// their survivors selected, and compacted; emptied pages return to the free list. evicted
/// (optional, device, [segments]) receives each head's evicted count. A NaN score (only a
/// user-defined Scorer makes one) is never ranked: the step then changes nothing and reports
/// Status::nan_score in *status (optional, device). Two-phase: with
/// workspace == nullptr sets workspace_bytes (it grows with the pool's slots) and returns.
template <class Scorer, class T>
void evict_step(void* workspace, std::size_t& workspace_bytes, const Scorer& scorer, const EvictionRule& r,
                const PagedKV<T>& kv, const BlockTables& t, FreeList free, const StepContext* context,
                std::int64_t* evicted, Status* status, cudaStream_t stream) {
  constexpr const char* who = "cuda::evict_step";
  r.validate(who);
  kv.validate(who);
  t.validate(who);
  // what the Scorer reads must be in the pool (else every score would read 0: a silent recency)
  if (Scorer::needs_key_norm) require(kv.key_norm != nullptr, who, ": this Scorer reads key_norm; the pool has none");
  if constexpr (scorer_needs_attention_mass<Scorer>)
    require(kv.attention_mass != nullptr, who, ": this Scorer ranks by attention_mass (H2O); the pool has none");
  const std::int32_t per_sequence = r.layers * r.kv_heads;
  require(t.segments % per_sequence == 0, who, ": segments = ", t.segments, " is not a multiple of L x Hkv = ",
          per_sequence);
  WorkspaceLayout layout;
  detail::carve_evict(layout, nullptr, r, kv, t);
  if (size_query(workspace, workspace_bytes, layout.bytes(), who)) return;
  free.validate(who);
  require(context != nullptr, who, ": context must be a device pointer");
  WorkspaceLayout carve;
  const detail::EvictWork w = detail::carve_evict(carve, workspace, r, kv, t);
  const std::int32_t groups = t.segments / r.segments_per_group();
  const std::int64_t max_length = r.budget + r.buffer;  // a grid hint: longer heads are strided over
  KVPOLICY_CUDA_CHECK(cudaMemsetAsync(w.failed, 0, sizeof(int), stream), "cuda::evict_step: clearing its NaN flag");

  detail::trigger_kernel<><<<static_cast<unsigned>(groups), detail::kSelectThreads, 0, stream>>>(t, r, context,
                                                                                                   w.group_active, w.active);
  check_launch("trigger_kernel", "segments = ", t.segments, ", groups = ", groups);
  segment_offsets(t, w.active, w.offsets, stream);
  score_segments(scorer, kv.metadata(), t, kv.page_size, context, per_sequence, w.active, w.offsets, w.score,
                 w.position, max_length, stream, w.failed, status);
  DeviceSegments s{w.score, w.position, w.offsets, t.segments};
  const bool threshold = r.threshold > 0.0;
  const auto log_alpha = static_cast<float>(std::log(r.threshold));
  if (r.scope == Scope::write_gated) {  // SPEC §3: the ring (the W_local newest) and g >= tau
    SegmentRule rule;
    rule.window = r.local;
    rule.sinks = r.sinks;
    rule.threshold = true;
    rule.log_alpha = static_cast<float>(r.tau);
    rule.active = w.active;
    segmented_select(s, rule, w.keep, stream);
  } else if (r.scope == Scope::generated) {  // SPEC §4: prompt + the R newest protected, prompt + K kept
    SegmentRule rule;
    rule.k = r.budget;
    rule.window = std::max(r.recent(), r.window);
    rule.sinks = r.sinks;
    rule.active = w.active;
    rule.prompt_of = context;
    rule.context_stride = per_sequence;
    segmented_select(s, rule, w.keep, stream);
  } else if (r.scope == Scope::per_head) {
    SegmentRule rule;
    rule.k = r.budget;
    rule.window = r.window;
    rule.sinks = r.sinks;
    rule.threshold = threshold;
    rule.log_alpha = log_alpha;
    rule.active = w.active;
    segmented_select(s, rule, w.keep, stream);
  } else {
    PooledRule pr;
    pr.segments_per_group = r.segments_per_group();
    pr.pool_budget = std::int64_t{pr.segments_per_group} * r.budget;
    pr.per_head_budget = r.budget;
    pr.floor_ratio = r.floor_ratio;
    pr.window = r.window;
    pr.sinks = r.sinks;
    pr.threshold = threshold;
    pr.log_alpha = log_alpha;
    pr.group_active = w.group_active;
    std::size_t bytes = w.pooled_bytes;
    pooled_select(w.pooled, bytes, s, pr, w.keep, max_length, stream);
  }
  std::size_t bytes = w.compact_bytes;
  compact(w.compact, bytes, kv, t, w.offsets, w.keep, w.active, free, evicted, kv.slots(), stream, w.failed);
}

}  // namespace kvpolicy::cuda
