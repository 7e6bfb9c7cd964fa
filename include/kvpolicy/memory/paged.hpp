/// \file
/// kvpolicy/memory/paged.hpp — the paged allocator: one pool of fixed-size pages shared by every
/// sequence, a free list, and a block table per (sequence, layer, kv head) with its own ragged
/// length. Pages go back to the pool as soon as compaction empties them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <new>
#include <span>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/memory/block_tables.hpp"
#include "kvpolicy/memory/pool.hpp"

namespace kvpolicy::memory {

namespace detail {
/// A mutex an allocator can hold and still be moved into its Cache: a copy or a move makes a new,
/// unlocked mutex (an allocator is moved before any thread uses it).
struct MovableMutex {
  mutable std::mutex m;
  MovableMutex() = default;
  MovableMutex(const MovableMutex&) {}
  MovableMutex& operator=(const MovableMutex&) { return *this; }
};
}  // namespace detail

/// The paged allocator (this file's comment): pages of PageSize entries from one pool, a block table per
/// head. The Cache calls bind, add_sequence, append and compact: do not call them on an allocator a
/// Cache owns; read it through cache.allocator(). layout throws for an unknown sequence or a layer or
/// head out of range, pages_used for an unknown sequence. pages_free() and the page moves (taken at
/// append, given back at compaction and remove_sequence) hold the pool's mutex; the rest follows the
/// Cache's thread rules.
template <int PageSize = 16, class Storage = float>
class Paged {
  static_assert(PageSize >= 1, "memory::Paged: PageSize must be >= 1");

 public:
  using storage_type = Storage;
  static constexpr int page_size = PageSize;

  /// Throws unless pages is in [1, 2^31 - 1].
  explicit Paged(std::int64_t pages) : pages_(pages) {
    require(pages >= 1 && pages <= std::int64_t{INT32_MAX}, "memory::Paged: pages = ", pages,
            " must be in [1, 2^31 - 1]");
  }

  /// Sizes the pool for a model geometry; called once by the Cache that owns this allocator. Throws if
  /// the pool's size overflows, or if the host cannot hold it (a kvpolicy::Error naming the bytes).
  void bind(const CacheShape& shape) {
    tables_.bind(shape, "memory::Paged");
    require(pages_ <= INT64_MAX / 4 / PageSize / shape.head_dim, "memory::Paged: ", pages_, " pages x ", PageSize,
            " slots x head_dim ", shape.head_dim, " overflows the pool's size");
    pool_.resize(pages_ * PageSize, shape.head_dim);
    try {
      free_.resize(static_cast<std::size_t>(pages_));
    } catch (const std::bad_alloc&) {
      fail("memory::Paged: cannot allocate the free list of ", pages_, " pages: out of host memory");
    }
    // Pop from the back, so page 0 is handed out first.
    for (std::int64_t i = 0; i < pages_; ++i) free_[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(pages_ - 1 - i);
  }

  /// Pages for `sequences` sequences whose every (layer, kv head) holds up to `entries_per_head`
  /// entries. The policy presets size by their own bound: trimkv_pages, dbtrimkv_pages,
  /// baseline_pages. Throws for negative arguments.
  static std::int64_t pages_for(const CacheShape& shape, std::int64_t entries_per_head, std::int64_t sequences = 1) {
    require(entries_per_head >= 0 && sequences >= 0, "memory::Paged::pages_for: entries_per_head = ", entries_per_head,
            " and sequences = ", sequences, " must be >= 0");
    return sequences * shape.heads_total() * ((entries_per_head + PageSize - 1) / PageSize);
  }
  /// Host bytes of a pool of `pages` pages for this geometry: each slot's K and V in Storage and its
  /// EntryMeta, plus the free list.
  static std::int64_t bytes_for(const CacheShape& shape, std::int64_t pages) {
    return EntryPool<Storage>::pool_bytes(pages * PageSize, shape.head_dim) +
           pages * static_cast<std::int64_t>(sizeof(std::int32_t));
  }

  void add_sequence(std::int64_t seq) { tables_.add(seq); }
  void remove_sequence(std::int64_t seq) {
    const std::lock_guard lock(free_mutex_.m);
    for (auto& t : tables_.of(seq)) free_.insert(free_.end(), t.pages.rbegin(), t.pages.rend());
    tables_.erase(seq);
  }
  bool has_sequence(std::int64_t seq) const { return tables_.contains(seq); }
  std::vector<std::int64_t> sequence_ids() const { return tables_.ids(); }

  std::int64_t length(std::int64_t seq, int layer, int head) const { return tables_.at(seq, layer, head).length; }

  /// Pages appending `tokens` entries to every head of `seq` (or of one layer) would take.
  std::int64_t pages_needed(std::int64_t seq, std::int64_t tokens, int layer = -1) const {
    const auto& tables = tables_.of(seq);
    const int heads = tables_.shape().kv_heads;
    const std::size_t first = layer < 0 ? 0 : static_cast<std::size_t>(layer) * heads;
    const std::size_t last = layer < 0 ? tables.size() : first + heads;
    std::int64_t need = 0;
    for (std::size_t h = first; h < last; ++h)
      need += pages_for(tables[h].length + tokens) - static_cast<std::int64_t>(tables[h].pages.size());
    return need;
  }
  bool can_append(std::int64_t seq, std::int64_t tokens, int layer = -1) const {
    return pages_needed(seq, tokens, layer) <= pages_free();
  }

  /// Appends `tokens` entries to one head: keys/values [tokens, d] fp32, meta [tokens]. Checks the
  /// pool first, so running out of pages throws and changes nothing.
  void append(std::int64_t seq, int layer, int head, std::int64_t tokens, const float* keys, const float* values,
              const EntryMeta* meta) {
    require(tokens >= 0, "memory::Paged::append: tokens = ", tokens, " must be >= 0");
    BlockTable& t = tables_.at(seq, layer, head);
    const std::int64_t need = pages_for(t.length + tokens) - static_cast<std::int64_t>(t.pages.size());
    {
      const std::lock_guard lock(free_mutex_.m);  // the free list is every sequence's (docs/concurrency.md)
      const auto free = static_cast<std::int64_t>(free_.size());
      require(need <= free, "memory::Paged: out of pages: appending ", tokens, " entries to sequence ", seq, " layer ",
              layer, " head ", head, " needs ", need, " pages, ", free, " of ", pages_, " are free");
      t.pages.reserve(t.pages.size() + static_cast<std::size_t>(std::max<std::int64_t>(need, 0)));
      for (std::int64_t i = 0; i < need; ++i) {
        t.pages.push_back(free_.back());
        free_.pop_back();
      }
    }
    write_entries(pool_, HeadLayout{t.pages, PageSize, t.length + tokens}, t.length, tokens, keys, values, meta);
    t.length += tokens;
  }

  HeadLayout layout(std::int64_t seq, int layer, int head) const {
    const BlockTable& t = tables_.at(seq, layer, head);
    return HeadLayout{t.pages, PageSize, t.length};
  }

  /// Keeps the entries with keep[i] != 0 (i < length), by hole filling; frees the emptied pages.
  /// Returns the number of entries evicted.
  std::int64_t compact(std::int64_t seq, int layer, int head, std::span<const std::uint8_t> keep) {
    BlockTable& t = tables_.at(seq, layer, head);
    require(static_cast<std::int64_t>(keep.size()) == t.length, "memory::Paged::compact: keep has ", keep.size(),
            " flags, the head holds ", t.length, " entries");
    const std::int64_t new_length = compact_head(pool_, HeadLayout{t.pages, PageSize, t.length}, keep);
    const std::int64_t evicted = t.length - new_length;
    t.length = new_length;
    const std::lock_guard lock(free_mutex_.m);
    while (static_cast<std::int64_t>(t.pages.size()) > pages_for(new_length)) {
      free_.push_back(t.pages.back());
      t.pages.pop_back();
    }
    return evicted;
  }

  const EntryPool<Storage>& pool() const { return pool_; }
  /// Mutable only for the metadata a Scorer's hooks change (EntryMeta::attention_mass, EntryPool::fields).
  EntryPool<Storage>& pool() { return pool_; }
  std::int64_t pages_total() const { return pages_; }
  std::int64_t pages_free() const {
    const std::lock_guard lock(free_mutex_.m);
    return static_cast<std::int64_t>(free_.size());
  }
  std::int64_t pages_used(std::int64_t seq) const {
    std::int64_t used = 0;
    for (const auto& t : tables_.of(seq)) used += static_cast<std::int64_t>(t.pages.size());
    return used;
  }

 private:
  static std::int64_t pages_for(std::int64_t entries) { return (entries + PageSize - 1) / PageSize; }

  std::int64_t pages_;
  BlockTables tables_;
  EntryPool<Storage> pool_;
  std::vector<std::int32_t> free_;
  detail::MovableMutex free_mutex_;  // guards free_: sequences on different threads share it
};

static_assert(Allocator<Paged<16, float>>, "memory::Paged must model kvpolicy::Allocator");

}  // namespace kvpolicy::memory

namespace kvpolicy {

/// Pages a paged pool of `page_size` needs so that `sequences` sequences each hold up to
/// `entries_per_head` entries in every (layer, kv head): memory::Paged<P>::pages_for with the page
/// size as a value, for a tool that picks it at run time. Throws for negative arguments or
/// page_size < 1.
inline std::int64_t pages_for(const CacheShape& shape, std::int64_t entries_per_head, std::int64_t sequences,
                              std::int64_t page_size) {
  require(page_size >= 1 && entries_per_head >= 0 && sequences >= 0, "pages_for: page_size = ", page_size,
          " must be >= 1, entries_per_head = ", entries_per_head, " and sequences = ", sequences, " >= 0");
  return sequences * shape.heads_total() * ((entries_per_head + page_size - 1) / page_size);
}

}  // namespace kvpolicy
