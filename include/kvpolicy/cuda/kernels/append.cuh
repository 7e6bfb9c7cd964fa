/// \file
/// kvpolicy/cuda/kernels/append.cuh — appending a decode token or a prefill chunk to many heads at once,
/// pages taken from the device free list (memory::Paged::append on the device).
/// Two kernels: one block reserves the pages of every row in row order (all or nothing: a call that
/// would run out of pages, or overflow a block table, reports it in the Status word and changes
/// nothing), then one block per (row, token) writes the entry. No host synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvpolicy/cuda/primitives/block_select.cuh"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/kernels/compact.cuh"
#include "kvpolicy/cuda/primitives/dtype.cuh"
#include "kvpolicy/cuda/memory/views.cuh"

namespace kvpolicy::gpu {

/// `tokens` new entries for each of `rows` segments (distinct): row r goes to segment[r];
/// keys/values [rows, tokens, head_dim] in the pool's dtype (not fp32), position (int32) and
/// write_score (fp32) [rows, tokens].
template <class T>
struct AppendRows {
  const std::int32_t* segment = nullptr;
  std::int32_t rows = 0;
  std::int32_t tokens = 0;
  const T* keys = nullptr;
  const T* values = nullptr;
  const std::int32_t* position = nullptr;
  const float* write_score = nullptr;
  /// [rows, tokens] per Field, the value each carried field takes (memory::field_at_write of the
  /// key as handed in, or the value handed in beside it); null: a field drawn from the key is
  /// computed from the stored key, any other takes its initial value.
  const float* fields[field_count] = {};
};

namespace detail {

/// One block: checks every row, then (if all fit) assigns pages and grows the lengths. first[r]
/// receives row r's old length; *ok whether the call goes ahead.
template <class T>
__global__ void __launch_bounds__(SelectTuning::threads)
    reserve_pages_kernel(AppendRows<T> a, BlockTableView t, std::int32_t page_size, FreeList free, Status* status,
                         std::int32_t* first, std::int32_t* ok) {
  __shared__ typename BlockScanI64::TempStorage scan;
  __shared__ int table_full;  // the lowest row that overflows its block table, INT_MAX if none
  if (threadIdx.x == 0) table_full = INT_MAX;
  __syncthreads();
  const std::int32_t available = *free.count;
  const auto need = [&](long long r) {
    const std::int32_t len = t.length[a.segment[r]];
    return pages_for(std::int64_t{len} + a.tokens, page_size) - pages_for(len, page_size);
  };
  for (long long r = threadIdx.x; r < a.rows; r += blockDim.x) {
    const std::int64_t after = std::int64_t{t.length[a.segment[r]]} + a.tokens;
    if (after > INT32_MAX || pages_for(after, page_size) > t.max_pages) atomicMin(&table_full, static_cast<int>(r));
  }
  __syncthreads();
  const long long total = block_exclusive_scan(a.rows, need, [](long long, long long, long long) {}, scan);
  // out of pages takes precedence: a wider block table would not help then
  const bool full = table_full != INT_MAX && total <= available;
  const bool fits = table_full == INT_MAX && total <= available;
  if (threadIdx.x == 0) {
    *ok = fits ? 1 : 0;
    if (!fits && atomicCAS(&status->code, Status::ok, full ? Status::table_full : Status::out_of_pages) == Status::ok) {
      status->segment = full ? a.segment[table_full] : -1;
      status->needed = full ? pages_for(std::int64_t{t.length[a.segment[table_full]]} + a.tokens, page_size) : total;
      status->available = full ? t.max_pages : available;
    }
  }
  // A join before the uniform return: without it nvcc folds the return into both arms of the
  // thread-0 branch, whose reconvergence point becomes the kernel's exit. Hardware converges the
  // warp at the scan's shfl.sync anyway (its member mask); GPGPU-Sim, which reconverges only at
  // immediate post-dominators, would run the scan with lane 0 alone (tests/cuda/probes/reconverge.cu).
  __syncthreads();
  if (!fits) return;
  block_exclusive_scan(
      a.rows, need,
      [&](long long r, long long before, long long count) {
        const std::int32_t seg = a.segment[r];
        const std::int32_t len = t.length[seg];
        std::int32_t* row = t.table + std::int64_t{seg} * t.max_pages;
        const std::int64_t have = pages_for(len, page_size);
        for (long long j = 0; j < count; ++j) row[have + j] = free.pages[available - 1 - (before + j)];
        first[r] = len;
        t.length[seg] = len + a.tokens;
      },
      scan);
  if (threadIdx.x == 0) *free.count = available - static_cast<std::int32_t>(total);
}

/// One block per (row, token): K/V row, metadata, and every carried field: the value handed in, or
/// for a field drawn from the key without one, ||k||_2 of the stored key — accumulated in double in
/// index order, as memory::key_norm does (for fp32 storage both give the same bits; for fp16/bf16
/// the device's is the norm of the rounded key the pool holds).
template <class T>
__global__ void write_entries_kernel(PagedKV<T> kv, BlockTableView t, AppendRows<T> a, const std::int32_t* first,
                                     const std::int32_t* ok) {
  if (!*ok) return;
  const long long r = blockIdx.x / a.tokens, tok = blockIdx.x % a.tokens;
  const std::int32_t seg = a.segment[r];
  const std::int64_t slot = t.slot(seg, std::int64_t{first[r]} + tok, kv.page_size);
  const long long src = (r * a.tokens + tok) * kv.head_dim;
  for (int c = threadIdx.x; c < kv.head_dim; c += blockDim.x) {
    kv.keys[slot * kv.head_dim + c] = a.keys[src + c];
    kv.values[slot * kv.head_dim + c] = a.values[src + c];
  }
  if (threadIdx.x == 0) {
    const long long at = r * a.tokens + tok;
    for (int f = 0; f < field_count; ++f) {
      float* column = kv.fields.column[f];
      if (column == nullptr) continue;
      const Field field = static_cast<Field>(f);
      if (a.fields[f] != nullptr) {
        column[slot] = a.fields[f][at];
      } else if (source_of(field) == FieldSource::key) {  // ||k||_2 of the stored key
        double sq = 0.0;
        for (int c = 0; c < kv.head_dim; ++c) {
          const double x = to_float(a.keys[src + c]);
          sq = __dadd_rn(sq, __dmul_rn(x, x));
        }
        column[slot] = static_cast<float>(sqrt(sq));
      } else {
        column[slot] = initial_value(field);
      }
    }
    kv.position[slot] = a.position[at];
    kv.write_score[slot] = a.write_score[at];
  }
}

}  // namespace detail

inline std::size_t append_workspace_bytes(std::int32_t rows) {
  WorkspaceLayout layout;
  layout.take<std::int32_t>(nullptr, rows);
  layout.take<std::int32_t>(nullptr, 1);
  return layout.bytes();
}

/// Appends a.tokens entries to each of a.rows segments. A call that does not fit (free pages, a
/// block table's max_pages) writes the first such failure to *status and changes nothing; the
/// engine reads *status whenever it synchronises. Two-phase (workspace == nullptr: size only). Throws
/// for rows or tokens below 0, for rows x tokens > 2^31 - 1, and for null pointers.
template <class T>
void append(void* workspace, std::size_t& workspace_bytes, const PagedKV<T>& kv, const BlockTableView& t, FreeList free,
            const AppendRows<T>& a, Status* status, cudaStream_t stream) {
  constexpr const char* who = "gpu::append";
  require(a.rows >= 0, who, ": rows = ", a.rows, " must be >= 0");
  require(a.tokens >= 0, who, ": tokens = ", a.tokens, " must be >= 0");
  require(std::int64_t{a.rows} * a.tokens <= INT32_MAX, who, ": rows x tokens = ", std::int64_t{a.rows} * a.tokens,
          " exceeds a grid");
  if (size_query(workspace, workspace_bytes, append_workspace_bytes(a.rows), who)) return;
  kv.validate(who);
  t.validate(who);
  free.validate(who);
  require(status != nullptr, who, ": status must be a device pointer");
  if (a.rows == 0 || a.tokens == 0) return;
  require(a.segment && a.keys && a.values && a.position && a.write_score, who,
          ": segment, keys, values, position and write_score must be device pointers");
  WorkspaceLayout layout;
  std::int32_t* first = layout.take<std::int32_t>(workspace, a.rows);
  std::int32_t* ok = layout.take<std::int32_t>(workspace, 1);
  const std::string shapes = "rows = " + std::to_string(a.rows) + ", tokens = " + std::to_string(a.tokens) +
                             ", head_dim = " + std::to_string(kv.head_dim) + ", page_size = " + std::to_string(kv.page_size);
  detail::reserve_pages_kernel<T><<<1, detail::SelectTuning::threads, 0, stream>>>(a, t, kv.page_size, free, status, first, ok);
  check_launch("reserve_pages_kernel", shapes);
  detail::write_entries_kernel<T><<<static_cast<unsigned>(a.rows * a.tokens), 128, 0, stream>>>(kv, t, a, first, ok);
  check_launch("write_entries_kernel", shapes);
}

}  // namespace kvpolicy::gpu
