/// \file
/// kvpolicy/cache/position_runs.hpp — a commit's evictions as an engine applies them: runs of
/// consecutive positions. An engine over its own K/V (storage engine_owned) frees what the policy
/// evicted: llama.cpp removes a run [first, end) of a sequence with one llama_memory_seq_rm call; a
/// paged engine frees the slots of a (layer, kv head)'s run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include "kvpolicy/cache/step_state.hpp"

namespace kvpolicy {

/// Positions [first, end) of one (layer, kv head), or of every head (layer = head = -1).
struct PositionRun {
  int layer = -1;
  int head = -1;
  std::int32_t first = 0;
  std::int32_t end = 0;
  friend bool operator==(const PositionRun&, const PositionRun&) = default;
};

namespace detail {
/// Sorted (layer, head, position) -> maximal runs of consecutive positions within a (layer, head).
inline std::vector<PositionRun> runs_of_sorted(const std::vector<EvictedEntry>& e) {
  std::vector<PositionRun> runs;
  for (const EvictedEntry& x : e) {
    if (!runs.empty() && runs.back().layer == x.layer && runs.back().head == x.head && runs.back().end == x.position) {
      ++runs.back().end;
      continue;
    }
    if (!runs.empty() && runs.back().layer == x.layer && runs.back().head == x.head && runs.back().end > x.position)
      continue;  // a position listed twice
    runs.push_back({x.layer, x.head, x.position, x.position + 1});
  }
  return runs;
}
}  // namespace detail

/// Each (layer, kv head)'s evicted positions as maximal runs, in (layer, head, first) order.
inline std::vector<PositionRun> head_runs(std::span<const EvictedEntry> evicted) {
  std::vector<EvictedEntry> e(evicted.begin(), evicted.end());
  std::sort(e.begin(), e.end(), [](const EvictedEntry& a, const EvictedEntry& b) {
    return std::tie(a.layer, a.head, a.position) < std::tie(b.layer, b.head, b.position);
  });
  return detail::runs_of_sorted(e);
}

/// The positions any head evicted, as maximal runs in ascending order (layer = head = -1). In the
/// token-level mode (SPEC §8) every head evicts the same positions: these are the tokens that leave
/// a cell-per-token engine (llama.cpp).
inline std::vector<PositionRun> token_runs(std::span<const EvictedEntry> evicted) {
  std::vector<EvictedEntry> e;
  e.reserve(evicted.size());
  for (const EvictedEntry& x : evicted) e.push_back({-1, -1, x.position});
  std::sort(e.begin(), e.end(), [](const EvictedEntry& a, const EvictedEntry& b) { return a.position < b.position; });
  return detail::runs_of_sorted(e);
}

}  // namespace kvpolicy
