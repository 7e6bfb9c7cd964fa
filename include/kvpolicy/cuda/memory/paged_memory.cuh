/// \file
/// kvpolicy/cuda/memory/paged_memory.cuh — the device memory of a paged cache, owned: the pool (K, V,
/// position, metadata, the key norm where the Scorer reads it), the block tables of every sequence
/// slot (segment = slot * L * Hkv + layer * Hkv + head; a row per head, widened on demand), the free
/// list and a status word the kernels report into; with the host's ways in and out of them (copies
/// that synchronise the stream, a head read back, a head truncated). Cache<…, cuda_backend>
/// (cuda/backend.cuh) is the front that runs steps on it; the kernels see it through views.cuh.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/kernels/compact.cuh"
#include "kvpolicy/cuda/memory/device_array.cuh"
#include "kvpolicy/cuda/memory/views.cuh"
#include "kvpolicy/cache/step_state.hpp"

namespace kvpolicy::gpu {

namespace detail {

template <class Storage>
  requires(is_storage_type_v<Storage>)
using device_storage_t = std::conditional_t<std::is_same_v<Storage, float>, float,
                                            std::conditional_t<std::is_same_v<Storage, half>, __half, __nv_bfloat16>>;

/// Copies `rows` rows of `width` ints between tables of different row strides (widening block-table
/// rows). A kernel rather than cudaMemcpy2DAsync, which GPU simulators such as GPGPU-Sim lack.
template <int = 0>  // header-only: a template kernel links once across translation units
__global__ void copy_rows_kernel(const std::int32_t* from, std::int64_t from_stride, std::int32_t* to,
                                 std::int64_t to_stride, std::int64_t rows, std::int64_t width) {
  const std::int64_t n = rows * width;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    to[i / width * to_stride + i % width] = from[i / width * from_stride + i % width];
}

}  // namespace detail

template <int P, class Storage>
class PagedMemory {
 public:
  using device_type = detail::device_storage_t<Storage>;
  static_assert(sizeof(device_type) == sizeof(Storage), "gpu::PagedMemory: storage sizes differ");

  /// `pages` pages of P slots on the current device, with a column for each of `fields` (the
  /// fields the composition's parts declare); block-table rows wide enough for `head_length_hint`
  /// entries and a page more; 4 sequence slots to start with.
  PagedMemory(const CacheShape& shape, std::int32_t pages, FieldSet fields, std::int64_t head_length_hint,
              cudaStream_t stream)
      : shape_(shape), stream_(stream), pages_(pages) {
    const auto slots = std::size_t(pages_) * P, d = static_cast<std::size_t>(shape_.head_dim);
    keys_ = DeviceArray<device_type>(slots * d);
    values_ = DeviceArray<device_type>(slots * d);
    position_ = DeviceArray<std::int32_t>(slots);
    write_score_ = DeviceArray<float>(slots);
    for (const Field f : fields_all)
      if (fields.has(f)) fields_[static_cast<int>(f)] = DeviceArray<float>(slots);
    free_pages_ = DeviceArray<std::int32_t>(pages_);
    free_count_ = DeviceArray<std::int32_t>(1);
    status_ = DeviceArray<Status>(1);
    std::vector<std::int32_t> free(static_cast<std::size_t>(pages_));
    for (std::int32_t i = 0; i < pages_; ++i) free[static_cast<std::size_t>(i)] = pages_ - 1 - i;  // page 0 on top
    upload(free_pages_.get(), free.data(), free.size());
    upload(free_count_.get(), &pages_, 1);
    reset_status();
    max_pages_ = static_cast<std::int32_t>(std::min<std::int64_t>(pages_, (head_length_hint + 2 * P - 1) / P + 1));
    grow_slots(4);
  }

  // ---- views -------------------------------------------------------------------------------------
  PagedKV<device_type> kv() const {
    PagedKV<device_type> kv{keys_.get(), values_.get(), position_.get(), write_score_.get(), pages_, P, shape_.head_dim};
    for (int f = 0; f < field_count; ++f) kv.fields.column[f] = fields_[f].get();
    return kv;
  }
  /// Every slot's block tables.
  BlockTableView tables_view() const {
    return {tables_.get(), tables_length_.get(), static_cast<std::int32_t>(slot_capacity_ * shape_.heads_total()),
            max_pages_};
  }
  /// One slot's block tables: its L * Hkv rows, contiguous.
  BlockTableView slot_tables(std::int32_t slot) const {
    const std::int64_t first = std::int64_t{slot} * shape_.heads_total();
    return {tables_.get() + first * max_pages_, tables_length_.get() + first,
            static_cast<std::int32_t>(shape_.heads_total()), max_pages_};
  }
  FreeList free_list() const { return {free_pages_.get(), free_count_.get(), pages_}; }
  std::int32_t segment(std::int32_t slot, int layer, int head) const {
    return static_cast<std::int32_t>(std::int64_t{slot} * shape_.heads_total() + head_index(shape_, layer, head));
  }
  std::int32_t max_pages() const { return max_pages_; }
  std::int32_t pages_total() const { return pages_; }
  std::int64_t pages_free() const { return download_one(free_count_.get()); }
  Status* status_word() const { return status_.get(); }
  cudaStream_t stream() const { return stream_; }

  // ---- sequence slots ----------------------------------------------------------------------------
  std::int32_t acquire_slot() {
    if (free_slots_.empty()) grow_slots(slot_capacity_ * 2);
    const std::int32_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  /// The slot's heads must be empty (truncate them first).
  void release_slot(std::int32_t slot) { free_slots_.push_back(slot); }

  // ---- host <-> device, each synchronising the stream ---------------------------------------------
  template <class T>
  void upload(T* dst, const T* src, std::size_t n) const {
    if (n == 0) return;
    KVPOLICY_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, stream_),
                        "Cache<cuda_backend>: copying ", n * sizeof(T), " bytes to the device");
    sync();  // the host buffers are the caller's (or this call's) and may go away
  }
  template <class T>
  void download(T* dst, const T* src, std::size_t n) const {
    if (n == 0) return;
    KVPOLICY_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream_),
                        "Cache<cuda_backend>: copying ", n * sizeof(T), " bytes from the device");
    sync();
  }
  template <class T>
  T download_one(const T* src) const {
    T v{};
    download(&v, src, 1);
    return v;
  }
  /// Device to device, queued on the stream (no synchronisation).
  template <class T>
  void copy(T* dst, const T* src, std::size_t n) const {
    KVPOLICY_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_),
                        "Cache<cuda_backend>: copying ", n * sizeof(T), " bytes on the device");
  }
  void sync() const { KVPOLICY_CUDA_CHECK(cudaStreamSynchronize(stream_), "Cache<cuda_backend>: synchronising its stream"); }
  Status status() const { return download_one(status_.get()); }
  void reset_status() {
    const Status ok{};
    upload(status_.get(), &ok, 1);
  }

  // ---- heads ---------------------------------------------------------------------------------------
  /// Every head's length of a slot, in segment order.
  std::vector<std::int32_t> lengths(std::int32_t slot) const {
    std::vector<std::int32_t> len(static_cast<std::size_t>(shape_.heads_total()));
    download(len.data(), tables_length_.get() + std::int64_t{slot} * shape_.heads_total(), len.size());
    return len;
  }
  std::int32_t length(std::int32_t segment) const { return download_one(tables_length_.get() + segment); }
  /// The positions each head of a slot holds (len[i] entries of head i), in storage order.
  std::vector<std::vector<std::int32_t>> head_positions(std::int32_t slot, const std::vector<std::int32_t>& len) const {
    std::vector<std::int32_t> table(len.size() * static_cast<std::size_t>(max_pages_));
    download(table.data(), tables_.get() + std::int64_t{slot} * shape_.heads_total() * max_pages_, table.size());
    std::vector<std::int32_t> pos(std::size_t(pages_) * P);
    download(pos.data(), position_.get(), pos.size());
    std::vector<std::vector<std::int32_t>> out(len.size());
    for (std::size_t i = 0; i < len.size(); ++i)
      for (std::int32_t j = 0; j < len[i]; ++j) out[i].push_back(pos[std::size_t(table[i * max_pages_ + j / P]) * P + j % P]);
    return out;
  }
  /// Every entry of one head, in storage order: metadata, K and V widened to fp32, a page at a time.
  HeadContents head_contents(std::int32_t segment) const {
    const auto len = static_cast<std::size_t>(length(segment));
    std::vector<std::int32_t> pages((len + P - 1) / P);
    download(pages.data(), tables_.get() + std::size_t(segment) * max_pages_, pages.size());
    const auto d = static_cast<std::size_t>(shape_.head_dim);
    HeadContents c;
    c.meta.resize(len);
    c.keys.resize(len * d);
    c.values.resize(len * d);
    std::vector<std::int32_t> position(P);
    std::vector<float> score(P);
    std::vector<std::vector<float>> field(field_count);
    std::vector<device_type> k(P * d), v(P * d);
    for (std::size_t page = 0; page < pages.size(); ++page) {
      const std::size_t first = std::size_t(pages[page]) * P, used = std::min<std::size_t>(P, len - page * P);
      download(position.data(), position_.get() + first, used);
      download(score.data(), write_score_.get() + first, used);
      for (int f = 0; f < field_count; ++f)
        if (fields_[f].get() != nullptr) {
          field[static_cast<std::size_t>(f)].resize(P);
          download(field[static_cast<std::size_t>(f)].data(), fields_[f].get() + first, used);
        }
      download(k.data(), keys_.get() + first * d, used * d);
      download(v.data(), values_.get() + first * d, used * d);
      for (std::size_t j = 0; j < used; ++j) {
        const std::size_t i = page * P + j;
        c.meta[i].position = position[j];
        c.meta[i].write_score = score[j];
        for (int f = 0; f < field_count; ++f)
          if (fields_[f].get() != nullptr) field_of(c.meta[i], static_cast<Field>(f)) = field[static_cast<std::size_t>(f)][j];
        for (std::size_t e = 0; e < d; ++e) {
          Storage ks, vs;
          std::memcpy(static_cast<void*>(&ks), &k[j * d + e], sizeof ks);  // the same bits
          std::memcpy(static_cast<void*>(&vs), &v[j * d + e], sizeof vs);
          c.keys[i * d + e] = to_float(ks);
          c.values[i * d + e] = to_float(vs);
        }
      }
    }
    return c;
  }
  /// Metadata of entry i of one head (i in range: the caller checks).
  EntryMeta entry(std::int32_t segment, std::int64_t i) const {
    const std::int32_t page = download_one(tables_.get() + std::size_t(segment) * max_pages_ + i / P);
    const std::int64_t slot = std::int64_t{page} * P + i % P;
    EntryMeta m;
    m.position = download_one(position_.get() + slot);
    m.write_score = download_one(write_score_.get() + slot);
    for (int f = 0; f < field_count; ++f)
      if (fields_[f].get() != nullptr) field_of(m, static_cast<Field>(f)) = download_one(fields_[f].get() + slot);
    return m;
  }
  /// Shrinks each head of a slot to keep_first[i] entries (its first ones), returning emptied
  /// pages; `workspace` holds at least compact_workspace_bytes of the slot's entries.
  void truncate(std::int32_t slot, const std::vector<std::int32_t>& keep_first, void* workspace, std::size_t bytes) {
    const std::vector<std::int32_t> len = lengths(slot);
    std::vector<std::int64_t> offsets{0};
    std::vector<std::uint8_t> keep;
    for (std::size_t i = 0; i < len.size(); ++i) {
      for (std::int32_t j = 0; j < len[i]; ++j) keep.push_back(j < keep_first[i] ? 1 : 0);
      offsets.push_back(static_cast<std::int64_t>(keep.size()));
    }
    DeviceArray<std::int64_t> d_offsets(offsets.size());
    DeviceArray<std::uint8_t> d_keep(std::max<std::size_t>(keep.size(), 1));
    upload(d_offsets.get(), offsets.data(), offsets.size());
    upload(d_keep.get(), keep.data(), keep.size());
    require(bytes >= compact_workspace_bytes(offsets.back(), static_cast<std::int32_t>(len.size())),
            "Cache<cuda_backend>: internal: compaction scratch too small");
    compact(workspace, bytes, kv(), slot_tables(slot), d_offsets.get(), d_keep.get(), nullptr, free_list(), nullptr,
            offsets.back(), stream_);
    sync();
  }
  /// Wider block-table rows for every slot (rows copied, the rest unspecified); views taken before
  /// are stale after it.
  void widen_rows(std::int32_t max_pages) {
    if (max_pages <= max_pages_) return;
    const std::size_t rows = std::size_t(slot_capacity_) * static_cast<std::size_t>(shape_.heads_total());
    DeviceArray<std::int32_t> table(rows * static_cast<std::size_t>(max_pages));
    const std::int64_t n = static_cast<std::int64_t>(rows) * max_pages_;
    detail::copy_rows_kernel<><<<std::min<unsigned>(blocks_for(n, 256, "copy_rows_kernel"), 65535), 256, 0, stream_>>>(
        tables_.get(), max_pages_, table.get(), max_pages, static_cast<std::int64_t>(rows), max_pages_);
    check_launch("copy_rows_kernel", "Cache<cuda_backend>: widening the block tables to ", max_pages, " pages per head");
    sync();
    tables_ = std::move(table);
    max_pages_ = max_pages;
  }

 private:
  template <class T>
  using DeviceArray = detail::DeviceArray<T>;

  /// More sequence slots: the tables grow (existing rows copied), new slots are free.
  void grow_slots(std::int32_t capacity) {
    const std::size_t per_slot = static_cast<std::size_t>(shape_.heads_total());
    DeviceArray<std::int32_t> table(std::size_t(capacity) * per_slot * max_pages_), length(std::size_t(capacity) * per_slot);
    KVPOLICY_CUDA_CHECK(cudaMemsetAsync(length.get(), 0, length.size() * sizeof(std::int32_t), stream_), "tables");
    if (slot_capacity_ > 0) {
      copy(table.get(), tables_.get(), tables_.size());
      copy(length.get(), tables_length_.get(), tables_length_.size());
    }
    sync();
    for (std::int32_t s = capacity - 1; s >= slot_capacity_; --s) free_slots_.push_back(s);
    slot_capacity_ = capacity;
    tables_ = std::move(table);
    tables_length_ = std::move(length);
  }

  CacheShape shape_;
  cudaStream_t stream_;
  std::int32_t pages_;
  std::int32_t max_pages_ = 0;
  std::int32_t slot_capacity_ = 0;
  DeviceArray<device_type> keys_, values_;
  DeviceArray<std::int32_t> position_, free_pages_, free_count_, tables_, tables_length_;
  DeviceArray<float> write_score_;
  DeviceArray<float> fields_[field_count];  // a column per declared field (core/entry.hpp)
  DeviceArray<Status> status_;
  std::vector<std::int32_t> free_slots_;
};

}  // namespace kvpolicy::gpu
