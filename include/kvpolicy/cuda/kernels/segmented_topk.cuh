/// \file
/// kvpolicy/cuda/kernels/segmented_topk.cuh — per-head selection (SPEC §1 "Trigger and survivors"): for
/// every segment (one per (sequence, layer, kv head), ragged), mark the survivors the CPU's
/// evict::PerHead::select marks — the top k by (score, larger position on ties), the window's
/// newest w entries protected (+inf), or with the threshold variant every entry scoring >= log alpha.
///
/// One block per segment (cub::BlockScan / radix histograms in shared memory). A segment of up to
/// SelectTuning::tile entries is keyed once into shared memory and selected there; a longer one is selected in
/// the multi-pass path, which re-reads its keys from global memory on each of the 8 histogram
/// passes. Either way the result is exact and deterministic; O(8 n) work per segment.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <climits>

#include "kvpolicy/core/rank_key.hpp"
#include "kvpolicy/core/rule.hpp"
#include "kvpolicy/cuda/primitives/block_select.cuh"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/memory/views.cuh"

namespace kvpolicy::gpu {

/// Ragged segments in flat device arrays: segment s is [offsets[s], offsets[s + 1]) of score,
/// position and keep — the layout of kvpolicy::SegmentedScores. Positions are unique within a
/// segment (as in every cache); scores are never NaN.
struct DeviceSegments {
  const float* score = nullptr;
  const std::int32_t* position = nullptr;
  const std::int64_t* offsets = nullptr;  // segments + 1
  std::int32_t segments = 0;
};

/// What a per-segment selection keeps: the Evictor's HeadSelection as it states it (core/rule.hpp),
/// and where the device finds what that statement refers to.
struct SegmentRule {
  evict::HeadSelection sel;               // keep (top-k), threshold and bound, window, sinks, keeps_prompt;
                                          // guaranteed 0 (raised beforehand)
  const std::int64_t* k_of = nullptr;     // one keep per segment (device) instead of sel.keep, when set
  const std::uint8_t* active = nullptr;   // segments with active[s / active_stride] == 0 keep everything
  std::int32_t active_stride = 1;         // (null: all active)
  /// sel.keeps_prompt (EpiKV, SPEC §4): the prompt entries of a segment (position <
  /// context[s / context_stride].prompt) score +inf and the top k keeps them on top of its k.
  const StepContext* context = nullptr;
  std::int32_t context_stride = 1;
};

namespace detail {

struct TopKShared {
  SelectShared select;
  std::uint64_t keys[SelectTuning::tile];
};

/// The smallest position of the `window` newest entries of a segment (they score +inf), as int64:
/// INT64_MAX protects nothing, INT64_MIN everything.
__device__ inline long long window_cut(const std::int32_t* position, long long n, long long window,
                                       SelectShared& sh) {
  if (window <= 0 || n == 0) return LLONG_MAX;
  if (window >= n) return LLONG_MIN;
  const auto get = [&](long long i) { return rank::ordered_position(position[i]); };
  const std::uint32_t cut = block_radix_select<std::uint32_t>(get, n, window, sh);
  return static_cast<long long>(static_cast<std::int32_t>(cut ^ 0x80000000u));
}

/// The largest position of the `sinks` oldest entries of a segment (they score +inf, SPEC §5), as
/// int64: LLONG_MIN protects nothing, LLONG_MAX everything.
__device__ inline long long sink_last(const std::int32_t* position, long long n, long long sinks, SelectShared& sh) {
  if (sinks <= 0 || n == 0) return LLONG_MIN;
  if (sinks >= n) return LLONG_MAX;
  // the S-th largest of the complemented keys is the S-th smallest position
  const auto get = [&](long long i) { return ~rank::ordered_position(position[i]); };
  const std::uint32_t last = ~block_radix_select<std::uint32_t>(get, n, sinks, sh);
  return static_cast<long long>(static_cast<std::int32_t>(last ^ 0x80000000u));
}

/// A score with the protections applied: the window (position >= cut), the sinks (position <=
/// sink) and EpiKV's prompt (position < prompt) rank above every score.
__device__ inline float protected_score(float score, std::int32_t position, long long cut, long long prompt = LLONG_MIN,
                                        long long sink = LLONG_MIN) {
  return position >= cut || position < prompt || position <= sink ? __int_as_float(0x7f800000) : score;
}

template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(SelectTuning::threads)
    segmented_select_kernel(DeviceSegments s, SegmentRule rule, std::uint8_t* keep) {
  __shared__ TopKShared sh;
  __shared__ typename BlockReduceI64::TempStorage reduce;
  __shared__ long long prompt_entries;
  const int seg = static_cast<int>(blockIdx.x);
  const long long begin = s.offsets[seg];
  const long long n = s.offsets[seg + 1] - begin;
  const float* score = s.score + begin;
  const std::int32_t* position = s.position + begin;
  std::uint8_t* out = keep + begin;
  long long k = rule.k_of ? rule.k_of[seg] : rule.sel.keep;
  const bool keeps_prompt = rule.sel.keeps_prompt;
  const long long prompt = keeps_prompt ? rule.context[seg / rule.context_stride].prompt : LLONG_MIN;
  if (keeps_prompt) {  // k counts the protected prompt entries on top
    long long mine = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) mine += position[i] < prompt;
    const long long total = BlockReduceI64(reduce).Sum(mine);
    if (threadIdx.x == 0) prompt_entries = total;
    __syncthreads();
    k += prompt_entries;
  }

  const auto fill = [&](std::uint8_t v) {
    for (long long i = threadIdx.x; i < n; i += blockDim.x) out[i] = v;
  };
  if (rule.active && !rule.active[seg / rule.active_stride]) return fill(1);
  if (!rule.sel.threshold && k >= n) return fill(1);
  if (!rule.sel.threshold && k <= 0) return fill(0);

  const long long cut = window_cut(position, n, rule.sel.window, sh.select);
  __syncthreads();
  const long long sink = sink_last(position, n, rule.sel.sinks, sh.select);
  __syncthreads();
  if (rule.sel.threshold) {
    for (long long i = threadIdx.x; i < n; i += blockDim.x)
      out[i] = protected_score(score[i], position[i], cut, prompt, sink) >= rule.sel.bound ? 1 : 0;
    return;
  }
  const auto key_at = [&](long long i) {
    return rank::entry_key(protected_score(score[i], position[i], cut, prompt, sink), position[i]);
  };
  std::uint64_t kth;
  if (n <= SelectTuning::tile) {  // keyed once, selected in shared memory
    for (long long i = threadIdx.x; i < n; i += blockDim.x) sh.keys[i] = key_at(i);
    __syncthreads();
    kth = block_radix_select<std::uint64_t>([&](long long i) { return sh.keys[i]; }, n, k, sh.select);
  } else {  // multi-pass: every histogram pass reads the segment again
    kth = block_radix_select<std::uint64_t>(key_at, n, k, sh.select);
  }
  const long long take_equal = sh.select.k;  // keys == kth the top k takes (1 when positions are unique)
  const auto key_of = [&](long long i) { return n <= SelectTuning::tile ? sh.keys[i] : key_at(i); };
  for (long long i = threadIdx.x; i < n; i += blockDim.x) out[i] = key_of(i) > kth ? 1 : 0;
  __syncthreads();
  block_enumerate(
      n, [&](long long i) { return key_of(i) == kth; },
      [&](long long i, long long rank) { out[i] = rank < take_equal ? 1 : 0; }, sh.select.scan);
}

}  // namespace detail

inline void validate_segments(const DeviceSegments& s, const std::uint8_t* keep, const char* who) {
  require(s.segments >= 0, who, ": segments = ", s.segments, " must be >= 0");
  require(s.segments == 0 || (s.score && s.position && s.offsets && keep), who,
          ": score, position, offsets and keep must be device pointers");
}

/// Marks keep[i] for every entry of every segment by `rule` (see SegmentRule), on `stream`.
/// Needs no workspace; asynchronous; an invalid argument throws before anything is launched.
inline void segmented_select(const DeviceSegments& s, const SegmentRule& rule, std::uint8_t* keep,
                             cudaStream_t stream) {
  constexpr const char* who = "gpu::segmented_select";
  validate_segments(s, keep, who);
  require(rule.sel.threshold || rule.k_of || rule.sel.keep >= 0, who, ": keep k = ", rule.sel.keep, " must be >= 0");
  require(rule.active_stride >= 1, who, ": active_stride = ", rule.active_stride, " must be >= 1");
  require(!rule.sel.keeps_prompt || rule.context != nullptr, who,
          ": the selection keeps the prompt (keeps_prompt), so context must be a device pointer");
  require(rule.context_stride >= 1, who, ": context_stride = ", rule.context_stride, " must be >= 1");
  require(rule.sel.window >= 0, who, ": window w = ", rule.sel.window, " must be >= 0");
  require(rule.sel.sinks >= 0, who, ": sinks S = ", rule.sel.sinks, " must be >= 0");
  require(!rule.sel.threshold || rule.sel.bound == rule.sel.bound, who, ": the bound is NaN");
  require(rule.sel.guaranteed == 0, who, ": guaranteed = ", rule.sel.guaranteed,
          ": raise each head's share first (gpu::detail::select_kept does)");
  if (s.segments == 0) return;
  detail::segmented_select_kernel<><<<static_cast<unsigned>(s.segments), detail::SelectTuning::threads, 0, stream>>>(s, rule,
                                                                                                            keep);
  check_launch("segmented_select_kernel", "segments = ", s.segments, ", keep = ", rule.sel.keep, ", window = ", rule.sel.window);
}

}  // namespace kvpolicy::gpu
