/// \file
/// kvpolicy/cuda/kernels/score.cuh — scoring on the device: the segment offsets of the heads an eviction
/// touches, and the scores of their entries by the very KVPOLICY_HD Scorer the CPU path calls
/// (SPEC §1–2: RetentionDecay, Lookahead(h), KNormRetention; any EntryScorer).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/cuda/primitives/block_select.cuh"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/memory/views.cuh"

namespace kvpolicy::gpu {

namespace detail {

/// One block: offsets[s] = sum of the lengths of the active segments before s (inactive count 0).
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(SelectTuning::threads)
    segment_offsets_kernel(BlockTableView t, const std::uint8_t* active, std::int64_t* offsets) {
  __shared__ typename BlockScanI64::TempStorage scan;
  const long long total = block_exclusive_scan(
      t.segments, [&](long long s) { return (active && !active[s]) ? 0 : t.length[s]; },
      [&](long long s, long long before, long long) { offsets[s] = before; }, scan);
  if (threadIdx.x == 0) offsets[t.segments] = total;
}

/// grid (segments, chunks): score and position of every entry of the active segments, flat.
template <class Scorer>
__global__ void score_kernel(Scorer scorer, EntryMetaView meta, BlockTableView t, std::int32_t page_size,
                             const StepContext* context, std::int32_t segments_per_sequence,
                             const std::uint8_t* active, const std::int64_t* offsets, float* score,
                             std::int32_t* position, int* failed, Status* status) {
  const int seg = static_cast<int>(blockIdx.x);
  if (active && !active[seg]) return;
  StepContext c = context[seg / segments_per_sequence];
  c.head = seg % segments_per_sequence;  // the (layer, kv head) scored, as the host planner sets it
  const long long begin = offsets[seg];
  const long long n = t.length[seg];
  for (long long i = static_cast<long long>(blockIdx.y) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.y) * blockDim.x) {
    const EntryMeta m = meta.entry(t.slot(seg, i, page_size));
    const float s = scorer(m, c);
    score[begin + i] = s;
    position[begin + i] = m.position;
    if (isnan(s)) {  // never ranked: the step that reads `failed` compacts nothing
      if (failed) atomicExch(failed, 1);
      if (status && atomicCAS(&status->code, Status::ok, Status::nan_score) == Status::ok) status->segment = seg;
    }
  }
}

}  // namespace detail

/// offsets [segments + 1] of the active segments' entries (all when active is null).
inline void segment_offsets(const BlockTableView& t, const std::uint8_t* active, std::int64_t* offsets,
                            cudaStream_t stream) {
  t.validate("gpu::segment_offsets");
  require(offsets != nullptr, "gpu::segment_offsets: offsets must be a device pointer");
  detail::segment_offsets_kernel<><<<1, detail::SelectTuning::threads, 0, stream>>>(t, active, offsets);
  check_launch("segment_offsets_kernel", "segments = ", t.segments);
}

/// Scores every entry of the active segments at their sequence's step context (context[s /
/// segments_per_sequence]) into score/position at offsets. max_segment_length bounds the grid
/// only. The Scorer must be an EntryScorer whose operator() is KVPOLICY_HD. A NaN score (only a
/// user-defined Scorer makes one) sets *failed and, if status is given, Status::nan_score.
template <class Scorer>
void score_segments(const Scorer& scorer, const EntryMetaView& meta, const BlockTableView& t, std::int32_t page_size,
                    const StepContext* context, std::int32_t segments_per_sequence, const std::uint8_t* active,
                    const std::int64_t* offsets, float* score, std::int32_t* position,
                    std::int64_t max_segment_length, cudaStream_t stream, int* failed = nullptr,
                    Status* status = nullptr) {
  static_assert(EntryScorer<Scorer>, "gpu::score_segments scores entry by entry: the Scorer must be an EntryScorer");
  constexpr const char* who = "gpu::score_segments";
  scorer.validate();
  t.validate(who);
  require(page_size >= 1, who, ": page_size = ", page_size, " must be >= 1");
  require(segments_per_sequence >= 1 && t.segments % segments_per_sequence == 0, who,
          ": segments_per_sequence = ", segments_per_sequence, " must divide segments = ", t.segments);
  require(context && offsets && score && position && meta.position && meta.write_score, who,
          ": context, offsets, score, position and the metadata must be device pointers");
  for (const Field f : fields_all)
    require(!reads_field<Scorer>(f) || meta.fields[f] != nullptr, who, ": this Scorer ", field_use(f), "; the pool has none");
  constexpr int threads = 256;
  const auto chunks = static_cast<unsigned>(
      max_segment_length <= 0 ? 1 : (max_segment_length + threads - 1) / threads > 1024 ? 1024
                                                                                         : (max_segment_length + threads - 1) / threads);
  detail::score_kernel<Scorer><<<dim3(static_cast<unsigned>(t.segments), chunks), threads, 0, stream>>>(
      scorer, meta, t, page_size, context, segments_per_sequence, active, offsets, score, position, failed, status);
  check_launch("score_kernel", "segments = ", t.segments, ", max_segment_length = ", max_segment_length);
}

}  // namespace kvpolicy::gpu
