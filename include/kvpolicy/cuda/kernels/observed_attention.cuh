/// \file
/// kvpolicy/cuda/kernels/observed_attention.cuh — score::ObservedAttention on the device (SPEC §5: SnapKV's
/// score, TOVA's with a window of one query and no pooling, AdaKV's under its pooled rule): for each
/// active head, per query head g of its group, the softmax over the head's entries of each
/// observed query (causal, scaled by 1/sqrt(d)) summed over the window, pooled along positions over
/// the entries outside the observation window, and reduced over the group (mean or max) — the
/// host's score_window, from the scorer's own settings (its data), in double as there.
///
/// One block per segment. The queries of each active head's window come from the host (the Scorer's
/// record keeps them as the Cache attends, memory::LayerQueryWindows) in `ObservedWindows`. The
/// summation order of the softmax differs from the host's, so a score may differ from the host's in
/// its last bits (equal keys still score equal); the ranking differs only between entries whose
/// scores are that close.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include <cub/block/block_reduce.cuh>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/cuda/memory/views.cuh"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/primitives/dtype.cuh"
#include "kvpolicy/cuda/tuning.cuh"
#include "kvpolicy/parts/score/observed_attention.hpp"

namespace kvpolicy::gpu {

/// The observed queries of every segment, each in a slot of `capacity` queries: queries
/// [segments, group, capacity, head_dim] fp32, position [segments, capacity], count [segments] (the
/// queries segment s observed, oldest first, at most capacity).
struct ObservedWindows {
  const float* queries = nullptr;
  const std::int32_t* position = nullptr;
  const std::int32_t* count = nullptr;
  std::int32_t group = 0;
  std::int32_t capacity = 0;
};

/// Per entry of the active segments (at their offsets): what the scoring works in.
struct ObservedScratch {
  double* sum = nullptr;      // the softmax summed over the window, for the current query head
  double* pooled = nullptr;   // after pooling
  double* reduced = nullptr;  // over the group
  double* work = nullptr;     // one query's logits, then its probabilities
  std::int32_t* rank = nullptr;   // rank by position within the head
  std::int32_t* order = nullptr;  // the entry at each rank
  static constexpr std::size_t bytes_per_entry = 4 * sizeof(double) + 2 * sizeof(std::int32_t);
};

namespace detail {

using BlockReduceF64 = cub::BlockReduce<double, ObservedTuning::threads>;
struct MaxF64 {
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};

template <class T>
__global__ void __launch_bounds__(ObservedTuning::threads)
    observed_attention_kernel(score::ObservedAttention s, PagedKV<T> kv, BlockTableView t, const std::uint8_t* active,
                              const std::int64_t* offsets, ObservedWindows q, ObservedScratch x, float* score,
                              std::int32_t* position) {
  __shared__ typename BlockReduceF64::TempStorage reduce;
  __shared__ double shared_value;
  const int seg = static_cast<int>(blockIdx.x);
  if (active != nullptr && !active[seg]) return;
  const long long n = t.length[seg], begin = offsets[seg];
  if (n == 0) return;
  const int d = kv.head_dim;
  const double scale = 1.0 / sqrt(static_cast<double>(d));
  std::int32_t* pos = position + begin;
  double *sum = x.sum + begin, *pooled = x.pooled + begin, *reduced = x.reduced + begin, *work = x.work + begin;
  std::int32_t *rank = x.rank + begin, *order = x.order + begin;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) pos[i] = kv.position[t.slot(seg, i, kv.page_size)];
  __syncthreads();
  const bool pools = s.pool_kernel > 1;  // without pooling (TOVA) the position order is never read
  if (pools)
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {  // positions are unique within a head: O(n^2 / threads)
      long long r = 0;
      for (long long j = 0; j < n; ++j) r += pos[j] < pos[i];
      rank[i] = static_cast<std::int32_t>(r);
      order[r] = static_cast<std::int32_t>(i);
    }
  const bool mean = s.group_reduce == score::GroupReduce::mean;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) reduced[i] = mean ? 0.0 : -INFINITY;
  const long long prefix = n > s.observation_window ? n - s.observation_window : 0;
  const long long radius = s.pool_kernel / 2;
  const int window = q.count[seg];
  __syncthreads();
  for (int g = 0; g < q.group; ++g) {
    for (long long i = threadIdx.x; i < n; i += blockDim.x) sum[i] = 0.0;
    for (int w = 0; w < window; ++w) {
      const float* query = q.queries + ((static_cast<long long>(seg) * q.group + g) * q.capacity + w) * d;
      const std::int32_t q_pos = q.position[static_cast<long long>(seg) * q.capacity + w];
      double local_max = -INFINITY;
      for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        double logit = -INFINITY;
        if (pos[i] <= q_pos) {
          const T* key = kv.keys + t.slot(seg, i, kv.page_size) * d;
          double dot = 0.0;
          for (int c = 0; c < d; ++c) dot += static_cast<double>(query[c]) * static_cast<double>(to_float(key[c]));
          logit = dot * scale;
        }
        work[i] = logit;
        local_max = fmax(local_max, logit);
      }
      const double block_max = BlockReduceF64(reduce).Reduce(local_max, MaxF64{});
      if (threadIdx.x == 0) shared_value = block_max;
      __syncthreads();
      const double mx = shared_value;
      __syncthreads();
      if (mx == -INFINITY) continue;  // this query sees no key of the head: it adds nothing
      double local_total = 0.0;
      for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        const double e = exp(work[i] - mx);  // exp(-inf) = 0 for the keys it may not see
        work[i] = e;
        local_total += e;
      }
      const double block_total = BlockReduceF64(reduce).Sum(local_total);
      if (threadIdx.x == 0) shared_value = block_total;
      __syncthreads();
      const double total = shared_value;
      for (long long i = threadIdx.x; i < n; i += blockDim.x) sum[i] += work[i] / total;
      __syncthreads();
    }
    // pooled along positions over the prefix (stride 1, the length kept): avg with zero padding
    // counted, or max; the observation window's keys keep their sums
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
      if (!pools) {  // a kernel of 1 pools nothing: every entry keeps its sum
        pooled[i] = sum[i];
        continue;
      }
      const long long r = rank[i];
      if (r >= prefix) {
        pooled[i] = sum[i];
        continue;
      }
      const long long lo = r - radius > 0 ? r - radius : 0, hi = r + radius < prefix - 1 ? r + radius : prefix - 1;
      double v = s.pooling == score::Pooling::avg ? 0.0 : sum[order[r]];
      for (long long k = lo; k <= hi; ++k)
        v = s.pooling == score::Pooling::avg ? v + sum[order[k]] : fmax(v, sum[order[k]]);
      pooled[i] = s.pooling == score::Pooling::avg ? v / s.pool_kernel : v;
    }
    __syncthreads();
    for (long long i = threadIdx.x; i < n; i += blockDim.x)
      reduced[i] = mean ? reduced[i] + pooled[i] : fmax(reduced[i], pooled[i]);
    __syncthreads();
  }
  for (long long i = threadIdx.x; i < n; i += blockDim.x)
    score[begin + i] = q.group > 0 ? static_cast<float>(mean ? reduced[i] / static_cast<double>(q.group) : reduced[i])
                                   : 0.0f;
}

}  // namespace detail

/// Scores every entry of the active segments by `s` into score/position at offsets (offsets
/// [segments + 1], as segment_offsets gives them), from the observed queries `q`; `x` holds
/// ObservedScratch::bytes_per_entry for each of those entries. Asynchronous on `stream`.
template <class T>
void observed_attention_scores(const score::ObservedAttention& s, const PagedKV<T>& kv, const BlockTableView& t,
                               const std::uint8_t* active, const std::int64_t* offsets, const ObservedWindows& q,
                               const ObservedScratch& x, float* score, std::int32_t* position, cudaStream_t stream) {
  constexpr const char* who = "gpu::observed_attention_scores";
  s.validate();
  kv.validate(who);
  t.validate(who);
  require(offsets && score && position, who, ": offsets, score and position must be device pointers");
  require(q.group >= 1 && q.capacity >= 1, who, ": group = ", q.group, " and capacity = ", q.capacity,
          " must be >= 1");
  require(q.queries && q.position && q.count, who, ": the observed queries must be device pointers");
  require(x.sum && x.pooled && x.reduced && x.work && x.rank && x.order, who, ": the scratch must be device pointers");
  if (t.segments == 0) return;
  detail::observed_attention_kernel<T><<<static_cast<unsigned>(t.segments), detail::ObservedTuning::threads, 0, stream>>>(
      s, kv, t, active, offsets, q, x, score, position);
  check_launch("observed_attention_kernel", "segments = ", t.segments, ", group = ", q.group, ", capacity = ", q.capacity);
}

}  // namespace kvpolicy::gpu
