/// \file
/// kvpolicy/memory/pool.hpp — the slot pool every allocator stores entries in, and the block-table
/// view attention reads a head through. A slot holds one entry: K [d], V [d] in the storage dtype,
/// and its EntryMeta. Slot s of page g is g * page_size + s (FlashInfer-style paged layout).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <span>
#include <stdexcept>
#include <vector>

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/record.hpp"

namespace kvpolicy::memory {

/// One head's entries as attention sees them: entry i lives in slot
/// block_table[i / page_size] * page_size + i % page_size, for i < length. Ragged: every head has its
/// own length and its own pages.
struct HeadLayout {
  std::span<const std::int32_t> block_table;
  std::int64_t page_size = 0;
  std::int64_t length = 0;
  std::int64_t slot(std::int64_t i) const { return std::int64_t{block_table[i / page_size]} * page_size + i % page_size; }
};

/// Allocates on 64-byte (cache-line) boundaries, so that no K/V row whose size is a multiple of 32
/// bytes straddles two lines: a 32-byte vector load of it is one line, not two (cpu/decode_kernels.hpp).
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlignment); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
};

/// The slots entries are stored in: K and V as Storage, and each entry's metadata (core/entry.hpp).
template <class Storage>
class EntryPool {
  static_assert(is_storage_type_v<Storage>,
                "K/V storage must be float, kvpolicy::half or kvpolicy::bfloat16 (kvpolicy::engine_owned: none, the engine keeps them)");

 public:
  /// Allocates the pool; a pool the machine cannot hold is a kvpolicy::Error naming its size, not
  /// std::bad_alloc, and leaves the old pool as it was.
  void resize(std::int64_t slots, int head_dim) {
    std::vector<Storage, CacheLineAllocator<Storage>> keys, values;
    std::vector<EntryMeta> meta;
    try {
      keys.assign(static_cast<std::size_t>(slots * head_dim), Storage{});
      values.assign(static_cast<std::size_t>(slots * head_dim), Storage{});
      meta.assign(static_cast<std::size_t>(slots), EntryMeta{});
    } catch (const std::bad_alloc&) {
      fail("memory pool: cannot allocate ", slots, " slots x head_dim ", head_dim, " (",
           pool_bytes(slots, head_dim), " bytes): out of host memory");
    } catch (const std::length_error&) {
      fail("memory pool: ", slots, " slots x head_dim ", head_dim, " exceed what one allocation can hold");
    }
    keys_.swap(keys);
    values_.swap(values);
    meta_.swap(meta);
    head_dim_ = head_dim;
  }
  /// Host bytes of a pool of `slots` entries: K and V in the storage dtype plus each entry's
  /// EntryMeta.
  static std::int64_t pool_bytes(std::int64_t slots, int head_dim) {
    return slots * (2 * head_dim * static_cast<std::int64_t>(sizeof(Storage)) + static_cast<std::int64_t>(sizeof(EntryMeta)));
  }
  int head_dim() const { return head_dim_; }
  std::int64_t slots() const { return static_cast<std::int64_t>(meta_.size()); }

  /// The d values in Storage of a slot's key or value, and its metadata: with a HeadLayout, what an
  /// engine's own attention kernel reads over a head after eviction (examples/engine_paged.cpp).
  const Storage* key(std::int64_t slot) const { return keys_.data() + slot * head_dim_; }
  const Storage* value(std::int64_t slot) const { return values_.data() + slot * head_dim_; }
  const EntryMeta& meta(std::int64_t slot) const { return meta_[static_cast<std::size_t>(slot)]; }

  /// Every slot's metadata, for a recording Scorer's hooks to change a field (H2O's attention mass,
  /// SPEC §5; core/record.hpp).
  EntryFields fields() { return EntryFields{meta_}; }
  /// Adds to a field, as the hooks do (for tests and tools that drive a pool directly).
  void add_to_field(std::int64_t slot, Field f, float value) { fields()(slot, f) += value; }
  /// A static score set after append (Cache::set_step_scores, SPEC §4).
  void set_write_score(std::int64_t slot, float score) { meta_[static_cast<std::size_t>(slot)].write_score = score; }

  /// Stores one entry, converting K/V from fp32 to the storage dtype.
  void write(std::int64_t slot, const float* k, const float* v, const EntryMeta& m) {
    Storage* kd = keys_.data() + slot * head_dim_;
    Storage* vd = values_.data() + slot * head_dim_;
    for (int i = 0; i < head_dim_; ++i) {
      kd[i] = from_float<Storage>(k[i]);
      vd[i] = from_float<Storage>(v[i]);
    }
    meta_[static_cast<std::size_t>(slot)] = m;
  }
  void move(std::int64_t dst, std::int64_t src) {
    std::copy_n(keys_.data() + src * head_dim_, head_dim_, keys_.data() + dst * head_dim_);
    std::copy_n(values_.data() + src * head_dim_, head_dim_, values_.data() + dst * head_dim_);
    meta_[static_cast<std::size_t>(dst)] = meta_[static_cast<std::size_t>(src)];
  }

 private:
  int head_dim_ = 0;
  std::vector<Storage, CacheLineAllocator<Storage>> keys_, values_;  // 64-byte aligned: each row's loads stay in its lines
  std::vector<EntryMeta> meta_;
};

/// The pool of a cache over K/V the engine owns (engine_owned): each slot holds its entry's
/// metadata only, never K or V, so the cache costs sizeof(EntryMeta) bytes per entry. Nothing
/// reads K/V from it: a Scorer that reads keys reads the engine's (core/engine_keys.hpp, SPEC §9),
/// and the Cache refuses one that reads values (cache.hpp).
template <>
class EntryPool<engine_owned> {
 public:
  void resize(std::int64_t slots, int head_dim) {
    std::vector<EntryMeta> meta;
    try {
      meta.assign(static_cast<std::size_t>(slots), EntryMeta{});
    } catch (const std::bad_alloc&) {
      fail("memory pool: cannot allocate the metadata of ", slots, " slots (", pool_bytes(slots, head_dim),
           " bytes): out of host memory");
    } catch (const std::length_error&) {
      fail("memory pool: ", slots, " slots exceed what one allocation can hold");
    }
    meta_.swap(meta);
    head_dim_ = head_dim;
  }
  /// Host bytes of a pool of `slots` entries: each entry's EntryMeta, no K/V.
  static std::int64_t pool_bytes(std::int64_t slots, int) { return slots * static_cast<std::int64_t>(sizeof(EntryMeta)); }
  int head_dim() const { return head_dim_; }
  std::int64_t slots() const { return static_cast<std::int64_t>(meta_.size()); }

  const EntryMeta& meta(std::int64_t slot) const { return meta_[static_cast<std::size_t>(slot)]; }
  EntryFields fields() { return EntryFields{meta_}; }
  void add_to_field(std::int64_t slot, Field f, float value) { fields()(slot, f) += value; }
  void set_write_score(std::int64_t slot, float score) { meta_[static_cast<std::size_t>(slot)].write_score = score; }

  /// Stores one entry's metadata; its K/V stay where the engine keeps them.
  void write(std::int64_t slot, const float*, const float*, const EntryMeta& m) { meta_[static_cast<std::size_t>(slot)] = m; }
  void move(std::int64_t dst, std::int64_t src) { meta_[static_cast<std::size_t>(dst)] = meta_[static_cast<std::size_t>(src)]; }

 private:
  int head_dim_ = 0;
  std::vector<EntryMeta> meta_;
};

/// Compaction by hole filling (docs/architecture.md, "Device path"): the survivors above the new length move into
/// the evicted slots below it, so O(evicted) entries move, not O(length). Returns the new length.
template <class Storage>
std::int64_t compact_head(EntryPool<Storage>& pool, const HeadLayout& head, std::span<const std::uint8_t> keep) {
  std::int64_t new_length = 0;
  for (std::int64_t i = 0; i < head.length; ++i) new_length += keep[i] != 0;
  std::int64_t hole = 0, mover = new_length;
  while (true) {
    while (hole < new_length && keep[hole]) ++hole;
    while (mover < head.length && !keep[mover]) ++mover;
    if (hole >= new_length || mover >= head.length) break;
    pool.move(head.slot(hole++), head.slot(mover++));
  }
  return new_length;
}

/// Writes `tokens` entries (keys/values [tokens, d] fp32, meta [tokens]) at indices first.. of a head
/// whose layout already covers them.
template <class Storage>
void write_entries(EntryPool<Storage>& pool, const HeadLayout& head, std::int64_t first, std::int64_t tokens,
                   const float* keys, const float* values, const EntryMeta* meta) {
  const int d = pool.head_dim();
  // values is null over engine-owned K/V (the engine keeps them): no row of it is addressed
  for (std::int64_t i = 0; i < tokens; ++i)
    pool.write(head.slot(first + i), keys + i * d, values != nullptr ? values + i * d : nullptr, meta[i]);
}

/// ||k||_2 of a key as the engine handed it (fp32), for the KNorm scores (SPEC §1).
inline float key_norm(const float* k, int d) {
  double s = 0.0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(k[i]) * k[i];
  return static_cast<float>(std::sqrt(s));
}

/// The value a field takes when its entry is written (core/entry.hpp, Field): from the entry's key
/// as the engine handed it (fp32), the value handed in beside it, or its initial value.
inline float field_at_write(Field f, const float* key, int d, float handed) {
  switch (source_of(f)) {
    case FieldSource::key: return key_norm(key, d);
    case FieldSource::handed: return handed;
    case FieldSource::attention: break;
  }
  return initial_value(f);
}

}  // namespace kvpolicy::memory
