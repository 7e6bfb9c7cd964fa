// Two caches compared entry by entry: what each (layer, kv head) of a sequence holds, in storage
// order, and the entries a commit reported evicted (tests of caches that must decide alike).
#pragma once

#include <cstdint>
#include <vector>

#include "kvpolicy/cache/step_state.hpp"

namespace kvpolicy::testing {

/// Every (layer, kv head)'s entries of sequence `seq`, metadata only, in storage order.
template <class C>
std::vector<EntryMeta> entries(const C& cache, std::int64_t seq = 0) {
  std::vector<EntryMeta> out;
  for (int l = 0; l < cache.shape().layers; ++l)
    for (int h = 0; h < cache.shape().kv_heads; ++h)
      for (std::int64_t i = 0; i < cache.length(seq, l, h); ++i) out.push_back(cache.entry(seq, l, h, i));
  return out;
}

inline bool same(const std::vector<EntryMeta>& a, const std::vector<EntryMeta>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].position != b[i].position || a[i].write_score != b[i].write_score || a[i].key_norm != b[i].key_norm ||
        a[i].gate != b[i].gate)
      return false;
  return true;
}

inline bool same(const std::vector<EvictedEntry>& a, const std::vector<EvictedEntry>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].layer != b[i].layer || a[i].head != b[i].head || a[i].position != b[i].position) return false;
  return true;
}

}  // namespace kvpolicy::testing
