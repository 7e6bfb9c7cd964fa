/// \file
/// kvpolicy/cuda/kernels/compact.cuh — compaction by hole filling (docs/architecture.md, "Device path"): each head keeps
/// the entries its keep flags mark; the j-th survivor at or above the new length moves into the
/// j-th evicted slot below it (the pairing memory::compact_head makes, so both paths leave the same
/// layout); emptied pages go back to the free list in the order memory::Paged returns them.
/// Data movement is O(evicted) per head: survivors below the new length never move.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvpolicy/cuda/primitives/block_select.cuh"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/memory/views.cuh"

namespace kvpolicy::gpu {

namespace detail {

KVPOLICY_HD std::int64_t pages_for(std::int64_t entries, std::int32_t page_size) {
  return (entries + page_size - 1) / page_size;
}

struct CompactWork {
  std::int32_t* hole;        // [entries] index of the r-th hole of a segment, at offsets[seg] + r
  std::int32_t* new_length;  // [segments]
};

/// One block per segment: pairs holes with movers in index order, then moves the pairs (the block's
/// threads along the pairs' rows, 16 bytes each).
template <class T>
__global__ void __launch_bounds__(SelectTuning::threads)
    compact_kernel(PagedKV<T> kv, BlockTableView t, const std::int64_t* offsets, const std::uint8_t* keep,
                   const std::uint8_t* active, const int* skip, CompactWork w) {
  __shared__ typename BlockScanI64::TempStorage scan;
  __shared__ long long survivors;
  const int seg = static_cast<int>(blockIdx.x);
  const std::int32_t n = t.length[seg];
  if ((active && !active[seg]) || (skip && *skip)) {
    if (threadIdx.x == 0) w.new_length[seg] = n;
    return;
  }
  const long long begin = offsets[seg];
  const std::uint8_t* k = keep + begin;
  std::int32_t* hole = w.hole + begin;
  const long long kept = block_enumerate(n, [&](long long i) { return k[i] != 0; }, [](long long, long long) {}, scan);
  if (threadIdx.x == 0) survivors = kept;
  __syncthreads();
  const long long m = survivors;
  block_enumerate(m, [&](long long i) { return k[i] == 0; },
                  [&](long long i, long long r) { hole[r] = static_cast<std::int32_t>(i); }, scan);
  // movers: survivors at index >= m, paired with the hole of the same rank
  __shared__ std::int32_t mover_of[SelectTuning::threads];
  // K/V rows move in 16-byte units (a row is head_dim x sizeof(T), a multiple of 16 bytes), a thread
  // per unit, UNROLL units loaded before any is stored so that loads overlap; sources (survivors at
  // index >= m) and destinations (holes below m) are distinct slots, so no copy reads another's
  // destination. A pool or row not 16-byte aligned moves element by element.
  constexpr int UNROLL = 4;
  const bool wide = ((reinterpret_cast<std::uintptr_t>(kv.keys) | reinterpret_cast<std::uintptr_t>(kv.values) |
                      static_cast<std::uintptr_t>(kv.head_dim * sizeof(T))) % 16) == 0;
  const int row_units = wide ? kv.head_dim * static_cast<int>(sizeof(T)) / 16 : kv.head_dim;
  long long base_rank = 0;
  for (long long base = m; base < n; base += blockDim.x) {
    const long long i = base + threadIdx.x;
    const long long f = (i < n && k[i]) ? 1 : 0;
    long long r = 0, total = 0;
    BlockScanI64(scan).ExclusiveSum(f, r, total);
    mover_of[threadIdx.x] = -1;
    __syncthreads();
    if (f) mover_of[r] = static_cast<std::int32_t>(i);
    __syncthreads();
    // unit u: pair u / (2 row_units), keys or values, unit u % row_units of the row
    const long long units = total * 2 * row_units;
    for (long long u0 = threadIdx.x; u0 < units; u0 += std::int64_t{blockDim.x} * UNROLL) {
      std::int64_t dst[UNROLL];
      int4 v4[UNROLL];
      T v1[UNROLL];
#pragma unroll
      for (int x = 0; x < UNROLL; ++x) {
        const long long u = u0 + std::int64_t{x} * blockDim.x;
        dst[x] = -1;
        if (u >= units) continue;
        const long long j = u / (2 * row_units);
        const int half = static_cast<int>(u / row_units % 2), c = static_cast<int>(u % row_units);
        const std::int64_t src = t.slot(seg, mover_of[j], kv.page_size);
        const std::int64_t to = t.slot(seg, hole[base_rank + j], kv.page_size);
        T* rows = half ? kv.values : kv.keys;
        if (wide) {
          v4[x] = reinterpret_cast<const int4*>(rows + src * kv.head_dim)[c];
          dst[x] = to * kv.head_dim * static_cast<std::int64_t>(sizeof(T)) + std::int64_t{c} * 16 + half;  // bit 0: values
        } else {
          v1[x] = rows[src * kv.head_dim + c];
          dst[x] = (to * kv.head_dim + c) * 2 + half;
        }
        if (u % (2 * row_units) == 0) {  // one thread a pair moves the entry's metadata
          kv.position[to] = kv.position[src];
          kv.write_score[to] = kv.write_score[src];
          kv.fields.move(to, src);
        }
      }
#pragma unroll
      for (int x = 0; x < UNROLL; ++x) {
        if (dst[x] < 0) continue;
        T* rows = (dst[x] & 1) ? kv.values : kv.keys;
        if (wide)
          *reinterpret_cast<int4*>(reinterpret_cast<char*>(rows) + (dst[x] & ~std::int64_t{1})) = v4[x];
        else
          rows[dst[x] >> 1] = v1[x];
      }
    }
    base_rank += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) w.new_length[seg] = static_cast<std::int32_t>(m);
}

/// One block: returns each segment's emptied pages to the free list in segment order, the last page
/// of a head first (memory::Paged::compact's order), and sets the new lengths.
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void __launch_bounds__(SelectTuning::threads)
    release_pages_kernel(BlockTableView t, std::int32_t page_size, FreeList free, CompactWork w, std::int64_t* evicted,
                         const int* skip) {
  __shared__ typename BlockScanI64::TempStorage scan;
  if (skip && *skip) return;
  const std::int32_t base = *free.count;
  __syncthreads();
  const long long released = block_exclusive_scan(
      t.segments,
      [&](long long s) { return pages_for(t.length[s], page_size) - pages_for(w.new_length[s], page_size); },
      [&](long long s, long long before, long long count) {
        const long long old_pages = pages_for(t.length[s], page_size);
        const std::int32_t* row = t.table + s * t.max_pages;
        for (long long j = 0; j < count; ++j) free.pages[base + before + j] = row[old_pages - 1 - j];
        if (evicted) evicted[s] = t.length[s] - w.new_length[s];
        t.length[s] = w.new_length[s];
      },
      scan);
  if (threadIdx.x == 0) *free.count = base + static_cast<std::int32_t>(released);
}

}  // namespace detail

/// Bytes of workspace compact() needs for `entries` entries in the segments being compacted.
inline std::size_t compact_workspace_bytes(std::int64_t entries, std::int32_t segments) {
  WorkspaceLayout layout;
  layout.take<std::int32_t>(nullptr, entries);
  layout.take<std::int32_t>(nullptr, segments);
  return layout.bytes();
}

/// Compacts every segment with active[s] != 0 (all when active is null) to the entries keep marks.
/// keep is flat: segment s's flags are keep[offsets[s] .. offsets[s] + length[s]), offsets as
/// segment_offsets() builds them (inactive segments may have 0 flags). evicted (optional, device,
/// [segments]) receives each segment's evicted count. `entries` bounds offsets[segments]: the
/// pool's slots always do. With skip set (device) and *skip != 0 nothing changes (evict_step's
/// NaN guard). Two-phase (workspace == nullptr: sets workspace_bytes and returns).
template <class T>
void compact(void* workspace, std::size_t& workspace_bytes, const PagedKV<T>& kv, const BlockTableView& t,
             const std::int64_t* offsets, const std::uint8_t* keep, const std::uint8_t* active, FreeList free,
             std::int64_t* evicted, std::int64_t entries, cudaStream_t stream, const int* skip = nullptr) {
  constexpr const char* who = "gpu::compact";
  require(entries >= 0, who, ": entries = ", entries, " must be >= 0");
  if (size_query(workspace, workspace_bytes, compact_workspace_bytes(entries, t.segments), who)) return;
  kv.validate(who);
  t.validate(who);
  free.validate(who);
  require(offsets && keep, who, ": offsets and keep must be device pointers");
  WorkspaceLayout layout;
  detail::CompactWork w{layout.take<std::int32_t>(workspace, entries), layout.take<std::int32_t>(workspace, t.segments)};
  const std::string shapes = "segments = " + std::to_string(t.segments) + ", page_size = " +
                             std::to_string(kv.page_size) + ", head_dim = " + std::to_string(kv.head_dim);
  detail::compact_kernel<T><<<static_cast<unsigned>(t.segments), detail::SelectTuning::threads, 0, stream>>>(kv, t, offsets,
                                                                                                        keep, active, skip, w);
  check_launch("compact_kernel", shapes);
  detail::release_pages_kernel<><<<1, detail::SelectTuning::threads, 0, stream>>>(t, kv.page_size, free, w, evicted, skip);
  check_launch("release_pages_kernel", shapes);
}

}  // namespace kvpolicy::gpu
