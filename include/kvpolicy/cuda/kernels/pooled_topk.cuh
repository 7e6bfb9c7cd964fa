/// \file
/// kvpolicy/cuda/kernels/pooled_topk.cuh — selection over a pool of heads (SPEC §2 "Global trigger and
/// survivors"): DBTrimKV's global top-K over every layer and head of a sequence, and the layer-wise
/// variant over the heads of a layer. Marks the survivors evict::Global / evict::LayerWise mark:
/// the pooled top K by (score, larger position, lower head index), the window protected; with
/// floor_ratio f > 0 the pooled top floor((1-f) K) and then each head its top (count among those +
/// floor(M f)); with the threshold variant every entry scoring >= log alpha.
///
/// A device-wide radix select per pool: 8 histogram passes over the pool's 64-bit rank keys
/// (every block of a pass histograms a chunk of one segment in shared memory and adds it to the
/// pool's global histogram; one block per pool then picks the digit), then the keys equal to the
/// K-th go to the lowest head indices (a scan over the pool's heads in order).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <algorithm>

#include "kvpolicy/core/rank_key.hpp"
#include "kvpolicy/core/rule.hpp"
#include "kvpolicy/cuda/primitives/block_select.cuh"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/kernels/segmented_topk.cuh"
#include "kvpolicy/cuda/memory/views.cuh"

namespace kvpolicy::gpu {

/// What a pooled selection keeps: the Evictor's PoolSelection as it states it (core/rule.hpp), over
/// pools that are runs of segments_per_group consecutive segments (L * Hkv for the global rule of
/// one sequence, Hkv for a layer): the pool keeps K = segments_per_group * sel.budget.
struct PooledRule {
  evict::PoolSelection sel;
  std::int32_t segments_per_group = 1;
  const std::uint8_t* group_active = nullptr;  // pools with 0 keep everything (null: all active)

  std::int64_t pool_budget() const { return std::int64_t{segments_per_group} * sel.budget; }
};

namespace detail {

struct PoolState {
  unsigned long long prefix;
  unsigned long long mask;
  long long k;     // rank still wanted below the prefix
  int mode;        // 0: select, 1: keep all, 2: keep none
};

struct PoolWork {
  PoolState* state;                // [groups]
  unsigned long long* hist;        // [groups, 256]
  std::int64_t* cut;               // [segments] window cut
  std::int64_t* sink;              // [segments] the last sink position (sink_last)
  std::int64_t* ties;              // [segments] keys equal to the K-th
  std::int64_t* pooled;            // [segments] survivors of the pooled ranking (then the quota)
};

__device__ inline std::uint64_t pool_key(const DeviceSegments& s, const PoolWork& w, int seg, long long i) {
  const long long at = s.offsets[seg] + i;
  return rank::entry_key(protected_score(s.score[at], s.position[at], w.cut[seg], LLONG_MIN, w.sink[seg]), s.position[at]);
}

template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(SelectTuning::threads) window_cut_kernel(DeviceSegments s, long long window, long long sinks, PoolWork w) {
  __shared__ SelectShared sh;
  const int seg = static_cast<int>(blockIdx.x);
  const long long begin = s.offsets[seg];
  const long long cut = window_cut(s.position + begin, s.offsets[seg + 1] - begin, window, sh);
  __syncthreads();
  const long long sink = sink_last(s.position + begin, s.offsets[seg + 1] - begin, sinks, sh);
  if (threadIdx.x == 0) {
    w.cut[seg] = cut;
    w.sink[seg] = sink;
    w.ties[seg] = 0;
    w.pooled[seg] = 0;
  }
}

template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void pool_init_kernel(DeviceSegments s, PooledRule r, long long k_pooled, PoolWork w, int groups) {
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= groups) return;
  const long long total = s.offsets[(g + 1) * r.segments_per_group] - s.offsets[g * r.segments_per_group];
  const long long k = k_pooled < total ? k_pooled : total;
  PoolState st{0ull, 0ull, k, 0};
  if ((r.group_active && !r.group_active[g]) || k >= total) st.mode = 1;
  else if (k <= 0) st.mode = 2;
  w.state[g] = st;
  for (int b = 0; b < SelectTuning::radix_bins; ++b) w.hist[static_cast<long long>(g) * SelectTuning::radix_bins + b] = 0ull;
}

/// One histogram pass: grid (segments, chunks); blocks stride over a segment's chunks.
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(SelectTuning::threads)
    pool_histogram_kernel(DeviceSegments s, PooledRule r, PoolWork w, int shift) {
  constexpr int bins = SelectTuning::radix_bins, chunk = SelectTuning::pool_chunk;
  __shared__ unsigned int hist[bins];
  const int seg = static_cast<int>(blockIdx.x);
  const int g = seg / r.segments_per_group;
  const PoolState st = w.state[g];
  if (st.mode != 0) return;
  const long long n = s.offsets[seg + 1] - s.offsets[seg];
  for (int b = threadIdx.x; b < bins; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  for (long long base = static_cast<long long>(blockIdx.y) * chunk; base < n;
       base += static_cast<long long>(gridDim.y) * chunk) {
    const long long end = base + chunk < n ? base + chunk : n;
    for (long long i = base + threadIdx.x; i < end; i += blockDim.x) {
      const std::uint64_t key = pool_key(s, w, seg, i);
      if ((key & st.mask) == st.prefix) atomicAdd(&hist[static_cast<int>((key >> shift) & 0xff)], 1u);
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
    if (hist[b]) atomicAdd(&w.hist[static_cast<long long>(g) * bins + b], static_cast<unsigned long long>(hist[b]));
}

/// One block per pool: the pass's digit, then the histogram cleared for the next pass.
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(SelectTuning::threads) pool_pick_kernel(PoolWork w, int shift) {
  __shared__ typename BlockScanI64::TempStorage scan;
  __shared__ int digit;
  __shared__ long long k_in_digit;
  const int g = static_cast<int>(blockIdx.x);
  PoolState& st = w.state[g];
  if (st.mode != 0) return;
  unsigned long long* hist = w.hist + static_cast<long long>(g) * SelectTuning::radix_bins;
  pick_digit(hist, st.k, scan, &digit, &k_in_digit);
  hist[threadIdx.x] = 0ull;
  if (threadIdx.x == 0) {
    st.prefix |= static_cast<unsigned long long>(digit) << shift;
    st.mask |= 0xffull << shift;
    st.k = k_in_digit;
  }
}

/// Counts, per segment, the keys above the pool's K-th (pooled) and equal to it (ties).
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(SelectTuning::threads) pool_count_kernel(DeviceSegments s, PooledRule r, PoolWork w) {
  using Reduce = BlockReduceI64;
  __shared__ typename Reduce::TempStorage reduce;
  const int seg = static_cast<int>(blockIdx.x);
  const PoolState st = w.state[seg / r.segments_per_group];
  const long long n = s.offsets[seg + 1] - s.offsets[seg];
  long long above = 0, equal = 0;
  if (st.mode == 0) {
    for (long long base = static_cast<long long>(blockIdx.y) * SelectTuning::pool_chunk; base < n;
         base += static_cast<long long>(gridDim.y) * SelectTuning::pool_chunk) {
      const long long end = base + SelectTuning::pool_chunk < n ? base + SelectTuning::pool_chunk : n;
      for (long long i = base + threadIdx.x; i < end; i += blockDim.x) {
        const std::uint64_t key = pool_key(s, w, seg, i);
        above += key > st.prefix;
        equal += key == st.prefix;
      }
    }
  } else if (st.mode == 1 && blockIdx.y == 0 && threadIdx.x == 0) {
    above = n;
  }
  const long long a = Reduce(reduce).Sum(above);
  __syncthreads();
  const long long e = Reduce(reduce).Sum(equal);
  if (threadIdx.x == 0) {
    if (a) atomicAdd(reinterpret_cast<unsigned long long*>(&w.pooled[seg]), static_cast<unsigned long long>(a));
    if (e) atomicAdd(reinterpret_cast<unsigned long long*>(&w.ties[seg]), static_cast<unsigned long long>(e));
  }
}

/// One block per pool: the keys equal to the K-th go to the lowest head indices (SPEC, Ties);
/// ties[seg] becomes how many of its equal keys the segment keeps, pooled[seg] its survivors of the
/// pooled ranking plus floor_quota (its quota when floor_ratio > 0).
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(SelectTuning::threads)
    pool_ties_kernel(PooledRule r, PoolWork w, long long floor_quota) {
  __shared__ typename BlockScanI64::TempStorage scan;
  const int g = static_cast<int>(blockIdx.x);
  const PoolState st = w.state[g];
  const long long first = static_cast<long long>(g) * r.segments_per_group;
  block_exclusive_scan(
      r.segments_per_group, [&](long long j) { return st.mode == 0 ? w.ties[first + j] : 0; },
      [&](long long j, long long before, long long ties) {
        long long take = st.k - before;
        take = take < 0 ? 0 : (take > ties ? ties : take);
        w.ties[first + j] = take;
        w.pooled[first + j] += take + floor_quota;
      },
      scan);
}

/// Without floor quotas: keep the keys above the K-th and the segment's share of the equal ones.
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(SelectTuning::threads)
    pool_mark_kernel(DeviceSegments s, PooledRule r, PoolWork w, std::uint8_t* keep) {
  const int seg = static_cast<int>(blockIdx.x);
  const PoolState st = w.state[seg / r.segments_per_group];
  const long long begin = s.offsets[seg];
  const long long n = s.offsets[seg + 1] - begin;
  for (long long i = static_cast<long long>(blockIdx.y) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.y) * blockDim.x) {
    std::uint8_t k = st.mode == 1 ? 1 : 0;
    if (st.mode == 0) {
      const std::uint64_t key = pool_key(s, w, seg, i);
      // positions are unique in a segment: it holds at most one key equal to the K-th
      k = key > st.prefix || (key == st.prefix && w.ties[seg] > 0);
    }
    keep[begin + i] = k;
  }
}

inline PoolWork carve(WorkspaceLayout& layout, void* base, int groups, int segments) {
  PoolWork w{};
  w.state = layout.take<PoolState>(base, groups);
  w.hist = layout.take<unsigned long long>(base, std::int64_t{groups} * SelectTuning::radix_bins);
  w.cut = layout.take<std::int64_t>(base, segments);
  w.sink = layout.take<std::int64_t>(base, segments);
  w.ties = layout.take<std::int64_t>(base, segments);
  w.pooled = layout.take<std::int64_t>(base, segments);
  return w;
}

}  // namespace detail

/// Marks keep[i] for every entry by the pooled rule. Two-phase: with workspace == nullptr sets
/// workspace_bytes and returns. max_segment_length bounds the grid only (any length is handled).
/// Asynchronous on `stream`; no allocation, no synchronisation.
inline void pooled_select(void* workspace, std::size_t& workspace_bytes, const DeviceSegments& s,
                          const PooledRule& r, std::uint8_t* keep, std::int64_t max_segment_length,
                          cudaStream_t stream) {
  constexpr const char* who = "gpu::pooled_select";
  require(r.segments_per_group >= 1, who, ": segments_per_group = ", r.segments_per_group, " must be >= 1");
  require(s.segments % r.segments_per_group == 0, who, ": segments = ", s.segments,
          " is not a multiple of segments_per_group = ", r.segments_per_group);
  require(r.pool_budget() >= 0, who, ": pool budget K = ", r.pool_budget(), " must be >= 0");
  require(r.sel.budget >= 0, who, ": per-head budget M = ", r.sel.budget, " must be >= 0");
  require(r.sel.floor_ratio >= 0.0 && r.sel.floor_ratio < 1.0, who, ": floor_ratio f = ", r.sel.floor_ratio,
          " must be in [0, 1)");
  require(!(r.sel.threshold && r.sel.floor_ratio > 0.0), who, ": floor_ratio and threshold are exclusive variants");
  require(r.sel.window >= 0, who, ": window w = ", r.sel.window, " must be >= 0");
  require(r.sel.sinks >= 0, who, ": sinks S = ", r.sel.sinks, " must be >= 0");
  require(r.sel.guaranteed == 0, who, ": guaranteed = ", r.sel.guaranteed,
          ": raise each head's share above the pool first (gpu::detail::select_kept does)");
  require(max_segment_length >= 0, who, ": max_segment_length = ", max_segment_length, " must be >= 0");
  const int groups = s.segments / r.segments_per_group;
  WorkspaceLayout layout;
  detail::carve(layout, nullptr, groups, s.segments);
  if (size_query(workspace, workspace_bytes, layout.bytes(), who)) return;
  validate_segments(s, keep, who);
  if (s.segments == 0) return;

  if (r.sel.threshold) {  // elementwise on the protected scores
    SegmentRule rule;
    rule.sel.window = r.sel.window;
    rule.sel.sinks = r.sel.sinks;
    rule.sel.threshold = true;
    rule.sel.bound = r.sel.bound;
    rule.active = r.group_active;  // an inactive pool keeps everything
    rule.active_stride = r.segments_per_group;
    segmented_select(s, rule, keep, stream);
    return;
  }
  WorkspaceLayout carve_again;
  const detail::PoolWork w = detail::carve(carve_again, workspace, groups, s.segments);
  const auto k_pooled = static_cast<long long>(std::floor((1.0 - r.sel.floor_ratio) * static_cast<double>(r.pool_budget())));
  const auto floor_quota = static_cast<long long>(std::floor(static_cast<double>(r.sel.budget) * r.sel.floor_ratio));
  constexpr int chunk = detail::SelectTuning::pool_chunk;
  const auto chunks = static_cast<unsigned>(
      std::min<std::int64_t>(std::max<std::int64_t>((max_segment_length + chunk - 1) / chunk, 1), 65535));
  const dim3 pass_grid(static_cast<unsigned>(s.segments), chunks);
  const auto shapes = [&] { return " (segments = " + std::to_string(s.segments) + ", groups = " + std::to_string(groups) + ")"; };

  detail::window_cut_kernel<><<<static_cast<unsigned>(s.segments), detail::SelectTuning::threads, 0, stream>>>(s, r.sel.window, r.sel.sinks, w);
  check_launch("window_cut_kernel", shapes());
  detail::pool_init_kernel<><<<blocks_for(groups, 128, "pool_init_kernel"), 128, 0, stream>>>(s, r, k_pooled, w, groups);
  check_launch("pool_init_kernel", shapes());
  for (int shift = 56; shift >= 0; shift -= 8) {
    detail::pool_histogram_kernel<><<<pass_grid, detail::SelectTuning::threads, 0, stream>>>(s, r, w, shift);
    check_launch("pool_histogram_kernel", shapes(), ", shift = ", shift);
    detail::pool_pick_kernel<><<<static_cast<unsigned>(groups), detail::SelectTuning::threads, 0, stream>>>(w, shift);
    check_launch("pool_pick_kernel", shapes(), ", shift = ", shift);
  }
  detail::pool_count_kernel<><<<pass_grid, detail::SelectTuning::threads, 0, stream>>>(s, r, w);
  check_launch("pool_count_kernel", shapes());
  detail::pool_ties_kernel<><<<static_cast<unsigned>(groups), detail::SelectTuning::threads, 0, stream>>>(
      r, w, r.sel.floor_ratio > 0.0 ? floor_quota : 0);
  check_launch("pool_ties_kernel", shapes());
  if (r.sel.floor_ratio > 0.0) {  // each head keeps its top (pooled count + floor(M f))
    SegmentRule rule;
    rule.k_of = w.pooled;
    rule.sel.window = r.sel.window;
    rule.sel.sinks = r.sel.sinks;
    segmented_select(s, rule, keep, stream);
  } else {
    detail::pool_mark_kernel<><<<pass_grid, detail::SelectTuning::threads, 0, stream>>>(s, r, w, keep);
    check_launch("pool_mark_kernel", shapes());
  }
}

}  // namespace kvpolicy::gpu
