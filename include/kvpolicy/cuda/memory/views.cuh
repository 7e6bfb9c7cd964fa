/// \file
/// kvpolicy/cuda/memory/views.cuh — non-owning views of device memory the engine owns (docs/architecture.md,
/// "Device path"): a paged K/V pool with per-entry metadata, block tables per (sequence, layer, kv head),
/// the pool's free list, and a status word the kernels report device-side failures in.
///
/// Layout, the CPU path's (memory/paged.hpp) on the device:
///   keys, values   [pages, page_size, head_dim], storage dtype T (float, __half, __nv_bfloat16)
///   position       [pages * page_size] int32        — EntryMeta::position
///   write_score    [pages * page_size] fp32         — EntryMeta::write_score (log_beta, or a static score)
///   fields[f]      [pages * page_size] fp32 per Field f (core/entry.hpp) a part of the composition
///                  declares, null for the others — ||k||_2 for the KNorm scores, WG-KV's gate,
///                  H2O's accumulated mass
///   slot of entry i of a head = table[i / page_size] * page_size + i % page_size
/// A segment is one (sequence slot, layer, kv head); segment = slot * L * Hkv + layer * Hkv + head,
/// the CPU path's head_index order within a sequence.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/math.hpp"

namespace kvpolicy::gpu {

/// The per-entry field columns of a pool, one per Field (core/entry.hpp): [pages * page_size] fp32
/// each, null for a field no part of the composition declares. Kernels carry every column there is,
/// by its Field alone.
struct FieldColumns {
  float* column[field_count] = {};

  KVPOLICY_HD float* operator[](Field f) const { return column[static_cast<int>(f)]; }
  KVPOLICY_HD float*& operator[](Field f) { return column[static_cast<int>(f)]; }
  /// The entry's fields from the columns there are (the others keep their initial values).
  KVPOLICY_HD void read(EntryMeta& m, std::int64_t slot) const {
    for (int f = 0; f < field_count; ++f)
      if (column[f] != nullptr) field_of(m, static_cast<Field>(f)) = column[f][slot];
  }
  /// Every column's value moves from slot src to slot dst (compaction).
  KVPOLICY_HD void move(std::int64_t dst, std::int64_t src) const {
    for (int f = 0; f < field_count; ++f)
      if (column[f] != nullptr) column[f][dst] = column[f][src];
  }
};

/// The per-entry metadata of a pool, without its K/V: what scoring and selection read.
struct EntryMetaView {
  std::int32_t* position = nullptr;
  float* write_score = nullptr;
  FieldColumns fields{};

  KVPOLICY_HD EntryMeta entry(std::int64_t slot) const {
    EntryMeta m;
    m.position = position[slot];
    m.write_score = write_score[slot];
    fields.read(m, slot);
    return m;
  }
};

/// A paged K/V pool on the device as the kernels read it: K, V and each slot's metadata.
template <class T>
struct PagedKV {
  T* keys = nullptr;
  T* values = nullptr;
  std::int32_t* position = nullptr;
  float* write_score = nullptr;
  std::int32_t pages = 0;
  std::int32_t page_size = 0;
  std::int32_t head_dim = 0;
  FieldColumns fields{};  ///< the declared fields' columns (null: the field is not carried)

  KVPOLICY_HD std::int64_t slots() const { return std::int64_t{pages} * page_size; }
  KVPOLICY_HD EntryMetaView metadata() const { return {position, write_score, fields}; }

  void validate(const char* who) const {
    require(keys && values && position && write_score, who,
            ": the K/V pool needs keys, values, position and write_score");
    require(pages >= 1, who, ": pages = ", pages, " must be >= 1");
    require(page_size >= 1, who, ": page_size = ", page_size, " must be >= 1");
    require(head_dim >= 1, who, ": head_dim = ", head_dim, " must be >= 1");
    require(slots() <= std::int64_t{INT32_MAX}, who, ": ", pages, " pages x ", page_size,
            " slots exceed 2^31 - 1 entries");
  }
};

/// A view of block tables in device memory (engine-owned; memory::BlockTables is the host's, which
/// owns its rows): table [segments, max_pages] int32 page ids; length [segments] int32 entries. A
/// segment holds exactly ceil(length / page_size) pages; the rest of its row is unspecified.
struct BlockTableView {
  std::int32_t* table = nullptr;
  std::int32_t* length = nullptr;
  std::int32_t segments = 0;
  std::int32_t max_pages = 0;

  KVPOLICY_HD std::int64_t slot(std::int32_t segment, std::int64_t i, std::int32_t page_size) const {
    return std::int64_t{table[std::int64_t{segment} * max_pages + i / page_size]} * page_size + i % page_size;
  }
  void validate(const char* who) const {
    require(table && length, who, ": block tables need table and length");
    require(segments >= 1, who, ": segments = ", segments, " must be >= 1");
    require(max_pages >= 1, who, ": max_pages = ", max_pages, " must be >= 1");
  }
};

/// The pool's free pages as a stack: pages[0, *count) are free; pop takes pages[*count - 1] first,
/// as memory::Paged pops the back of its free list (so both hand out the same page ids).
struct FreeList {
  std::int32_t* pages = nullptr;
  std::int32_t* count = nullptr;
  std::int32_t capacity = 0;

  void validate(const char* who) const {
    require(pages && count, who, ": the free list needs pages and count");
    require(capacity >= 1, who, ": free list capacity = ", capacity, " must be >= 1");
  }
};

/// What a device-side check found (no host synchronisation in a step: the engine reads it when it
/// synchronises anyway). code == 0: every call since the last reset succeeded. The first failure
/// sticks; a failed call changed nothing.
struct Status {
  enum Code : std::int32_t { ok = 0, out_of_pages = 1, table_full = 2, nan_score = 3 };
  std::int32_t code = ok;
  std::int32_t segment = -1;   // the segment that failed (table_full, nan_score); -1 for out_of_pages
  std::int64_t needed = 0;     // pages the call needed
  std::int64_t available = 0;  // free pages (out_of_pages) or the table's max_pages (table_full)
};

/// The words every two-phase call carves its scratch from (ask for the size, then run, as CUB):
/// sizes are rounded up to 256 bytes so every array is aligned for any type.
class WorkspaceLayout {
 public:
  template <class U>
  U* take(void* base, std::int64_t count) {
    const std::size_t at = bytes_;
    bytes_ += round_up(static_cast<std::size_t>(count < 0 ? 0 : count) * sizeof(U));
    return base ? reinterpret_cast<U*>(static_cast<char*>(base) + at) : nullptr;
  }
  std::size_t bytes() const { return bytes_ == 0 ? 256 : bytes_; }

 private:
  static std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }
  std::size_t bytes_ = 0;
};

/// The two-phase contract: with workspace == nullptr, sets bytes and returns true (nothing runs);
/// otherwise requires bytes to be at least what is needed.
inline bool size_query(void* workspace, std::size_t& bytes, std::size_t needed, const char* who) {
  if (workspace == nullptr) {
    bytes = needed;
    return true;
  }
  require(bytes >= needed, who, ": workspace of ", bytes, " bytes, ", needed, " needed (ask with workspace = nullptr)");
  return false;
}

}  // namespace kvpolicy::gpu
