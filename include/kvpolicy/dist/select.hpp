/// \file
/// kvpolicy/dist/select.hpp — SPEC §2's pooled selection (DBTrimKV global, layer-wise, the floor)
/// over heads sharded across the ranks of a tensor-parallel group, keeping exactly what one rank
/// holding every head keeps (evict::select_survivors on the unsharded scores).
///
/// The pooled top-k is a distributed radix select on the rank key of SPEC "Ties"
/// (core/rank_key.hpp: score, then position): 8 passes of one byte, each an all-reduce of a
/// 256-bin histogram per pool, find the k-th key of every pool over all ranks. Entries above it are
/// kept; of the entries equal to it (equal score and position, in different heads) the pool keeps
/// those of the lowest global (layer, head) indices, SPEC's tie-break across heads, which a ninth
/// all-reduce of one count per head settles when the equal entries are more than the pool takes.
/// Everything else (window, sinks and AdaKV's guaranteed share protected; the threshold; the floor's
/// per-head quotas) is per head, and a head lives on one rank: no communication. The bytes per
/// selection are 8 x 256 x 8 per pool, plus 8 per head for a tie, whatever the context length.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/rank_key.hpp"
#include "kvpolicy/core/rule.hpp"
#include "kvpolicy/dist/communicator.hpp"
#include "kvpolicy/parts/evict/rank.hpp"
#include "kvpolicy/parts/evict/selection.hpp"

namespace kvpolicy::dist {

/// For every pool g (the global heads [g * group_heads, (g + 1) * group_heads)), keep[i] = 1 for this
/// rank's entries among the pool's top k[g] over every rank: by key (rank::entry_key), then by the
/// lower global head index. key, head: each local entry's key and global head index; pools: the
/// number of pools (every rank passes the same, with the same k). Collective: every rank calls it.
template <Communicator C>
void pooled_top_k(C& comm, std::span<const std::uint64_t> key, std::span<const std::int64_t> head,
                  std::int64_t group_heads, std::int64_t pools, std::span<const std::int64_t> k,
                  std::span<std::uint8_t> keep) {
  require(key.size() == head.size() && key.size() == keep.size(), "dist::pooled_top_k: ", key.size(), " keys, ",
          head.size(), " heads and ", keep.size(), " keep flags differ");
  require(group_heads >= 1 && pools >= 0 && static_cast<std::int64_t>(k.size()) == pools, "dist::pooled_top_k: ",
          "group_heads = ", group_heads, ", pools = ", pools, " and ", k.size(), " budgets");
  const auto P = static_cast<std::size_t>(pools);
  const auto pool_of = [&](std::size_t i) { return static_cast<std::size_t>(head[i] / group_heads); };
  for (std::size_t i = 0; i < head.size(); ++i)
    require(head[i] >= 0 && head[i] < pools * group_heads, "dist::pooled_top_k: entry ", i, " has head ", head[i],
            ", outside the ", pools * group_heads, " heads of the pools");

  // per pool: the key's bytes chosen so far (high first), how many of the entries matching them the
  // pool still takes, and whether the pool is settled (it takes all or none of what is left)
  std::vector<std::uint64_t> prefix(P, 0);
  std::vector<std::int64_t> remaining(k.begin(), k.end()), equal(P, 0);
  std::vector<std::uint8_t> all(P, 0), none(P, 0);
  std::vector<std::int64_t> hist(P * 256);
  for (int pass = 0; pass < 8; ++pass) {
    const int shift = 56 - 8 * pass;
    std::fill(hist.begin(), hist.end(), 0);
    for (std::size_t i = 0; i < key.size(); ++i) {
      const std::size_t g = pool_of(i);
      if (pass > 0 && (key[i] >> (shift + 8)) != (prefix[g] >> (shift + 8))) continue;
      ++hist[g * 256 + ((key[i] >> shift) & 0xff)];
    }
    comm.all_reduce_sum(hist);
    for (std::size_t g = 0; g < P; ++g) {
      if (all[g] || none[g]) continue;
      const std::int64_t* h = &hist[g * 256];
      if (pass == 0) {  // the pool's size over every rank
        std::int64_t total = 0;
        for (int b = 0; b < 256; ++b) total += h[b];
        if (remaining[g] >= total) all[g] = 1;
        if (remaining[g] <= 0) none[g] = 1;
        if (all[g] || none[g]) continue;
      }
      std::int64_t above = 0;
      for (int b = 255; b >= 0; --b) {
        if (above + h[b] >= remaining[g]) {
          prefix[g] |= static_cast<std::uint64_t>(b) << shift;
          remaining[g] -= above;
          equal[g] = h[b];
          break;
        }
        above += h[b];
      }
    }
  }
  // prefix[g] is now the pool's k-th key; remaining[g] of the equal[g] entries equal to it are taken
  std::vector<std::int64_t> ties;  // per head of the pools that need it: its entry equal to the k-th key
  bool any_ties = false;
  for (std::size_t g = 0; g < P; ++g) any_ties = any_ties || (!all[g] && !none[g] && remaining[g] < equal[g]);
  if (any_ties) {
    ties.assign(P * static_cast<std::size_t>(group_heads), 0);
    for (std::size_t i = 0; i < key.size(); ++i)
      if (key[i] == prefix[pool_of(i)]) ++ties[static_cast<std::size_t>(head[i])];
    comm.all_reduce_sum(ties);
  }
  for (std::size_t i = 0; i < key.size(); ++i) {
    const std::size_t g = pool_of(i);
    if (all[g] || none[g]) {
      keep[i] = all[g];
      continue;
    }
    if (key[i] != prefix[g]) {
      keep[i] = key[i] > prefix[g] ? 1 : 0;
      continue;
    }
    if (remaining[g] >= equal[g]) {
      keep[i] = 1;
      continue;
    }
    // positions are unique within a head: one equal entry per head at most; the lower heads first
    std::int64_t before = 0;
    for (std::int64_t h = static_cast<std::int64_t>(g) * group_heads; h < head[i]; ++h) before += ties[static_cast<std::size_t>(h)];
    keep[i] = before < remaining[g] ? 1 : 0;
  }
}

/// The trigger of a pooled Evictor (evict::Global, evict::LayerWise: group_heads of the unsharded
/// shape) over sharded heads: each pool's length summed over every rank (one all-reduce of one
/// count per pool), so every rank takes the same decision, the one evict::trigger_heads takes on the
/// unsharded lengths. lengths[j]: the length of this rank's segment j, global head global_head[j];
/// active[j] = 1 where its pool fires. Returns whether any does. Collective.
template <Communicator C, Evictor E>
bool trigger_pools(C& comm, const E& e, const CacheShape& shape, StepContext c, std::span<const std::int64_t> lengths,
                   std::span<const std::int64_t> global_head, std::span<std::uint8_t> active) {
  require(lengths.size() == global_head.size() && lengths.size() == active.size(), "dist::trigger_pools: ",
          lengths.size(), " lengths, ", global_head.size(), " head indices and ", active.size(), " flags");
  const std::int64_t group = e.group_heads(shape);
  require(group >= 1 && shape.heads_total() % group == 0, "dist::trigger_pools: group_heads = ", group,
          " must divide L x Hkv = ", shape.heads_total());
  std::vector<std::int64_t> total(static_cast<std::size_t>(shape.heads_total() / group), 0);
  for (std::size_t j = 0; j < lengths.size(); ++j) total[static_cast<std::size_t>(global_head[j] / group)] += lengths[j];
  comm.all_reduce_sum(total);
  bool any = false;
  for (std::size_t j = 0; j < lengths.size(); ++j) {
    const bool fires = e.fires(total[static_cast<std::size_t>(global_head[j] / group)], group, c);
    active[j] = fires ? 1 : 0;
    any = any || fires;
  }
  return any;
}

/// A PoolSelection (core/rule.hpp) over this rank's shard: s holds its heads' segments in
/// ascending global order, global_head[j] the global (layer, head) index of segment j, and pools of
/// group_heads consecutive global heads span the ranks. keep[i] = 1 for every survivor: exactly the
/// flags evict::select_survivors gives these entries on the unsharded scores. Collective.
template <Communicator C>
void select_pools(C& comm, const evict::PoolSelection& sel, std::int64_t group_heads, std::int64_t heads_total,
                  const SegmentedScores& s, std::span<const std::int64_t> global_head, std::span<std::uint8_t> keep) {
  require(static_cast<std::int64_t>(global_head.size()) == s.segments(), "dist::select_pools: ", global_head.size(),
          " global head indices for ", s.segments(), " segments");
  require(group_heads >= 1 && heads_total % group_heads == 0, "dist::select_pools: group_heads = ", group_heads,
          " must divide the ", heads_total, " heads");
  require(static_cast<std::int64_t>(keep.size()) == s.offsets.back(), "dist::select_pools: ", keep.size(),
          " keep flags for ", s.offsets.back(), " entries");
  auto score = evict::detail::protected_scores(s, sel.window, sel.sinks);
  evict::detail::protect_guaranteed(s, sel.guaranteed, score);
  std::fill(keep.begin(), keep.end(), std::uint8_t{0});
  if (sel.threshold) {
    rank::keep_at_least(score, sel.bound, keep);
    return;
  }
  const std::int64_t pools = heads_total / group_heads;
  const auto k_pooled = static_cast<std::int64_t>(
      std::floor((1.0 - sel.floor_ratio) * static_cast<double>(group_heads * sel.budget)));
  std::vector<std::uint64_t> key(score.size());
  std::vector<std::int64_t> head(score.size());
  for (std::int64_t h = 0; h < s.segments(); ++h)
    for (std::int64_t i = s.offsets[h]; i < s.offsets[h + 1]; ++i) {
      key[static_cast<std::size_t>(i)] = rank::entry_key(score[static_cast<std::size_t>(i)], s.position[static_cast<std::size_t>(i)]);
      head[static_cast<std::size_t>(i)] = global_head[static_cast<std::size_t>(h)];
    }
  pooled_top_k(comm, key, head, group_heads, pools, std::vector<std::int64_t>(static_cast<std::size_t>(pools), k_pooled),
               keep);
  if (sel.floor_ratio == 0.0) return;
  // the floor (SPEC §2): each head keeps its top (its count among the pooled + floor(M f)); a head is
  // whole on this rank, so its quota is too
  const auto floor_quota = static_cast<std::int64_t>(std::floor(static_cast<double>(sel.budget) * sel.floor_ratio));
  for (std::int64_t h = 0; h < s.segments(); ++h) {
    const auto b = static_cast<std::size_t>(s.offsets[h]);
    const auto n = static_cast<std::size_t>(s.length(h));
    const std::int64_t quota = floor_quota + std::count(keep.begin() + static_cast<std::ptrdiff_t>(b),
                                                        keep.begin() + static_cast<std::ptrdiff_t>(b + n), std::uint8_t{1});
    rank::keep_top_k(std::span<const float>(score).subspan(b, n), s.position.subspan(b, n), quota, keep.subspan(b, n));
  }
}

}  // namespace kvpolicy::dist
