/// \file
/// kvpolicy/memory/contiguous.hpp — the contiguous allocator: every (sequence, layer, kv head) owns
/// one fixed region of `capacity` slots. It is the paged layout with one page per head and
/// page_size = capacity, so attention and compaction read it through the same HeadLayout.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/memory/block_tables.hpp"
#include "kvpolicy/memory/pool.hpp"

namespace kvpolicy::memory {

/// The contiguous allocator (this file's comment): one region of `capacity` entries per head.
template <class Storage = float>
class Contiguous {
 public:
  using storage_type = Storage;

  /// capacity: entries per head (for TRIM-KV at least M + B - 1 plus the largest prefill chunk);
  /// max_sequences: how many sequences the pool holds at once. Throws unless both are >= 1. Binding
  /// throws on overflow or allocation failure; add_sequence throws once all max_sequences regions
  /// are in use, and a step that would overfill a head throws "out of memory" (the Cache checks
  /// can_append first).
  Contiguous(std::int64_t capacity, std::int64_t max_sequences) : capacity_(capacity), max_sequences_(max_sequences) {
    require(capacity >= 1, "memory::Contiguous: capacity = ", capacity, " must be >= 1");
    require(max_sequences >= 1, "memory::Contiguous: max_sequences = ", max_sequences, " must be >= 1");
  }

  void bind(const CacheShape& shape) {
    tables_.bind(shape, "memory::Contiguous");
    const std::int64_t regions = max_sequences_ * shape.heads_total();
    require(regions <= std::int64_t{INT32_MAX}, "memory::Contiguous: ", regions, " regions exceed 2^31 - 1");
    require(capacity_ <= INT64_MAX / 4 / regions / shape.head_dim, "memory::Contiguous: capacity ", capacity_, " x ",
            regions, " regions x head_dim ", shape.head_dim, " overflows the pool's size");
    pool_.resize(regions * capacity_, shape.head_dim);
    free_.clear();
    for (std::int64_t s = max_sequences_ - 1; s >= 0; --s) free_.push_back(s);
  }

  void add_sequence(std::int64_t seq) {
    require(!free_.empty() || tables_.contains(seq), "memory::Contiguous: cannot add sequence ", seq, ": all ",
            max_sequences_, " sequence regions are in use");
    auto& tables = tables_.add(seq);
    const std::int64_t base = free_.back() * tables_.shape().heads_total();
    free_.pop_back();
    for (std::size_t h = 0; h < tables.size(); ++h) tables[h].pages = {static_cast<std::int32_t>(base + std::int64_t(h))};
  }
  void remove_sequence(std::int64_t seq) {
    free_.push_back(tables_.of(seq).front().pages.front() / tables_.shape().heads_total());
    tables_.erase(seq);
  }
  bool has_sequence(std::int64_t seq) const { return tables_.contains(seq); }
  std::vector<std::int64_t> sequence_ids() const { return tables_.ids(); }

  std::int64_t length(std::int64_t seq, int layer, int head) const { return tables_.at(seq, layer, head).length; }
  /// Whether every head of `seq` (or of one layer) has room for `tokens` more entries.
  bool can_append(std::int64_t seq, std::int64_t tokens, int layer = -1) const {
    const auto& tables = tables_.of(seq);
    const int heads = tables_.shape().kv_heads;
    const std::size_t first = layer < 0 ? 0 : static_cast<std::size_t>(layer) * heads;
    const std::size_t last = layer < 0 ? tables.size() : first + heads;
    for (std::size_t h = first; h < last; ++h)
      if (tables[h].length + tokens > capacity_) return false;
    return true;
  }

  void append(std::int64_t seq, int layer, int head, std::int64_t tokens, const float* keys, const float* values,
              const EntryMeta* meta) {
    require(tokens >= 0, "memory::Contiguous::append: tokens = ", tokens, " must be >= 0");
    BlockTable& t = tables_.at(seq, layer, head);
    require(t.length + tokens <= capacity_, "memory::Contiguous: out of capacity: appending ", tokens,
            " entries to sequence ", seq, " layer ", layer, " head ", head, " holding ", t.length, " of ", capacity_);
    write_entries(pool_, HeadLayout{t.pages, capacity_, t.length + tokens}, t.length, tokens, keys, values, meta);
    t.length += tokens;
  }

  HeadLayout layout(std::int64_t seq, int layer, int head) const {
    const BlockTable& t = tables_.at(seq, layer, head);
    return HeadLayout{t.pages, capacity_, t.length};
  }

  std::int64_t compact(std::int64_t seq, int layer, int head, std::span<const std::uint8_t> keep) {
    BlockTable& t = tables_.at(seq, layer, head);
    require(static_cast<std::int64_t>(keep.size()) == t.length, "memory::Contiguous::compact: keep has ", keep.size(),
            " flags, the head holds ", t.length, " entries");
    const std::int64_t new_length = compact_head(pool_, HeadLayout{t.pages, capacity_, t.length}, keep);
    const std::int64_t evicted = t.length - new_length;
    t.length = new_length;
    return evicted;
  }

  const EntryPool<Storage>& pool() const { return pool_; }
  /// Mutable only for the metadata a Scorer's hooks change (EntryMeta::attention_mass, EntryPool::fields).
  EntryPool<Storage>& pool() { return pool_; }
  std::int64_t capacity() const { return capacity_; }
  /// One "page" per head region: the accounting matches the paged allocator's.
  std::int64_t pages_total() const { return max_sequences_ * tables_.shape().heads_total(); }
  std::int64_t pages_free() const { return static_cast<std::int64_t>(free_.size()) * tables_.shape().heads_total(); }
  std::int64_t pages_used(std::int64_t seq) const { return static_cast<std::int64_t>(tables_.of(seq).size()); }

 private:
  std::int64_t capacity_;
  std::int64_t max_sequences_;
  BlockTables tables_;
  EntryPool<Storage> pool_;
  std::vector<std::int64_t> free_;  // free sequence regions
};

static_assert(Allocator<Contiguous<float>>, "memory::Contiguous must model kvpolicy::Allocator");

}  // namespace kvpolicy::memory
