/// \file
/// kvpolicy/memory/block_tables.hpp — the per-(sequence, layer, kv head) block tables every
/// allocator keeps: which pages a head owns and how many entries it holds (ragged lengths).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"

namespace kvpolicy::memory {

/// One head's pages in the pool, in order, and how many entries they hold.
struct BlockTable {
  std::vector<std::int32_t> pages;
  std::int64_t length = 0;
};

/// The block table of every (sequence, layer, kv head) an allocator holds.
class BlockTables {
 public:
  void bind(const CacheShape& shape, const char* owner) {
    shape.validate();
    require(sequences_.empty(), owner, "::bind: the allocator already holds ", sequences_.size(), " sequences");
    shape_ = shape;
    owner_ = owner;
  }
  const CacheShape& shape() const { return shape_; }

  std::vector<BlockTable>& add(std::int64_t seq) {
    require(shape_.layers > 0, owner_, ": add_sequence before bind(shape)");
    require(!contains(seq), owner_, ": sequence ", seq, " already exists");
    return sequences_.emplace(seq, std::vector<BlockTable>(static_cast<std::size_t>(shape_.heads_total()))).first->second;
  }
  void erase(std::int64_t seq) { sequences_.erase(seq); }
  bool contains(std::int64_t seq) const { return sequences_.count(seq) != 0; }
  std::int64_t size() const { return static_cast<std::int64_t>(sequences_.size()); }
  std::vector<std::int64_t> ids() const {
    std::vector<std::int64_t> out;
    for (const auto& kv : sequences_) out.push_back(kv.first);
    return out;
  }

  const std::vector<BlockTable>& of(std::int64_t seq) const {
    auto it = sequences_.find(seq);
    if (it == sequences_.end()) fail(owner_, ": unknown sequence ", seq);
    return it->second;
  }
  std::vector<BlockTable>& of(std::int64_t seq) {
    return const_cast<std::vector<BlockTable>&>(static_cast<const BlockTables&>(*this).of(seq));
  }
  const BlockTable& at(std::int64_t seq, int layer, int head) const {
    require(layer >= 0 && layer < shape_.layers, owner_, ": layer ", layer, " out of range [0, ", shape_.layers, ")");
    require(head >= 0 && head < shape_.kv_heads, owner_, ": kv head ", head, " out of range [0, ", shape_.kv_heads, ")");
    return of(seq)[static_cast<std::size_t>(head_index(shape_, layer, head))];
  }
  BlockTable& at(std::int64_t seq, int layer, int head) {
    return const_cast<BlockTable&>(static_cast<const BlockTables&>(*this).at(seq, layer, head));
  }

 private:
  CacheShape shape_{};
  const char* owner_ = "memory";
  std::map<std::int64_t, std::vector<BlockTable>> sequences_;
};

}  // namespace kvpolicy::memory
