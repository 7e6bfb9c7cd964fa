// The check both dist tests run: a random pooled selection (DBTrimKV global or layer-wise, with the
// floor, window, sinks, threshold, ties in score and position across heads), selected by
// dist::select_pools on this rank's shard of kv heads (tensor parallel: kv heads
// [r * Hkv / TP, (r + 1) * Hkv / TP) of every layer), against evict::select_survivors on the
// unsharded scores. Every rank draws the same case from the seed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kvpolicy/dist/select.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/evict/selection.hpp"

namespace disttest {

using namespace kvpolicy;

struct Case {
  CacheShape shape;
  evict::Global global;
  evict::LayerWise layer_wise;
  bool layer = false;
  std::vector<float> score;
  std::vector<std::int32_t> position;
  std::vector<std::int64_t> offsets;  // heads_total + 1
};

/// The case of `seed` for a group of `ranks` ranks (Hkv a multiple of it).
inline Case draw(std::uint64_t seed, int ranks) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Case c;
  c.shape = CacheShape{pick(1, 4), ranks * pick(1, 2), 0, 8};
  c.shape.q_heads = c.shape.kv_heads;
  const std::int64_t budget = pick(1, 16);
  const double floor = std::array{0.0, 0.0, 0.25, 0.5}[static_cast<std::size_t>(pick(0, 3))];
  const std::int64_t window = pick(0, 3) == 0 ? pick(1, 3) : 0, sinks = pick(0, 3) == 0 ? pick(1, 2) : 0;
  const double threshold = floor == 0.0 && pick(0, 9) == 0 ? 0.5 : 0.0;
  const std::int64_t min_tokens = threshold > 0.0 && pick(0, 1) == 0 ? pick(1, 5) : 0;  // the threshold's floor
  c.global = evict::Global{budget, 4, floor, window, threshold, sinks, 0, min_tokens};
  c.layer_wise = evict::LayerWise{budget, 4, floor, window, threshold, sinks, 0, min_tokens};
  c.layer = pick(0, 1) == 1;
  // scores from a few values (ties within and across heads), or from a continuum
  const bool tied = pick(0, 2) != 0;
  const std::array<float, 7> few{-1.5f, -0.0f, 0.0f, 0.25f, 1.0f, 3.0f, std::numeric_limits<float>::infinity()};
  c.offsets.push_back(0);
  for (std::int64_t h = 0; h < c.shape.heads_total(); ++h) {
    const int n = pick(0, 40);
    std::vector<std::int32_t> pos(64);
    std::iota(pos.begin(), pos.end(), 0);
    std::shuffle(pos.begin(), pos.end(), rng);  // distinct within the head, in storage order
    for (int i = 0; i < n; ++i) {
      c.position.push_back(pos[static_cast<std::size_t>(i)]);
      c.score.push_back(tied ? few[static_cast<std::size_t>(pick(0, 5 + (pick(0, 20) == 0)))]
                             : std::uniform_real_distribution<float>(-4.0f, 4.0f)(rng));
    }
    c.offsets.push_back(c.offsets.back() + n);
  }
  return c;
}

/// The unsharded survivors of the case (one rank holding every head).
inline std::vector<std::uint8_t> oracle(const Case& c) {
  std::vector<std::uint8_t> keep(c.score.size());
  const SegmentedScores s{c.score, c.position, c.offsets};
  if (c.layer)
    evict::select_survivors(c.layer_wise, c.shape, StepContext{}, s, keep);
  else
    evict::select_survivors(c.global, c.shape, StepContext{}, s, keep);
  return keep;
}

/// This rank's shard: its heads' segments in global order, their global indices, and where each of
/// its entries sits in the unsharded arrays.
struct Shard {
  std::vector<float> score;
  std::vector<std::int32_t> position;
  std::vector<std::int64_t> offsets{0}, global_head, index;
};

inline Shard shard(const Case& c, int rank, int ranks) {
  Shard s;
  const int per = c.shape.kv_heads / ranks;
  for (int l = 0; l < c.shape.layers; ++l)
    for (int h = rank * per; h < (rank + 1) * per; ++h) {
      const std::int64_t g = head_index(c.shape, l, h);
      for (std::int64_t i = c.offsets[static_cast<std::size_t>(g)]; i < c.offsets[static_cast<std::size_t>(g) + 1]; ++i) {
        s.score.push_back(c.score[static_cast<std::size_t>(i)]);
        s.position.push_back(c.position[static_cast<std::size_t>(i)]);
        s.index.push_back(i);
      }
      s.offsets.push_back(static_cast<std::int64_t>(s.score.size()));
      s.global_head.push_back(g);
    }
  return s;
}

/// Entries of this rank's shard whose fate differs from the unsharded selection's, plus heads whose
/// trigger differs from the unsharded trigger's.
template <class Comm>
std::int64_t mismatches(Comm& comm, const Case& c) {
  const Shard s = shard(c, comm.rank(), comm.size());
  std::int64_t bad = 0;
  {  // the trigger: each pool's length summed over the ranks
    std::vector<std::int64_t> all_lengths, lengths;
    for (std::size_t h = 0; h + 1 < c.offsets.size(); ++h) all_lengths.push_back(c.offsets[h + 1] - c.offsets[h]);
    for (std::size_t j = 0; j + 1 < s.offsets.size(); ++j) lengths.push_back(s.offsets[j + 1] - s.offsets[j]);
    std::vector<std::uint8_t> want(all_lengths.size()), got(lengths.size());
    if (c.layer) {
      evict::trigger_heads(c.layer_wise, c.shape, StepContext{}, all_lengths, want);
      dist::trigger_pools(comm, c.layer_wise, c.shape, StepContext{}, lengths, s.global_head, got);
    } else {
      evict::trigger_heads(c.global, c.shape, StepContext{}, all_lengths, want);
      dist::trigger_pools(comm, c.global, c.shape, StepContext{}, lengths, s.global_head, got);
    }
    for (std::size_t j = 0; j < got.size(); ++j) bad += got[j] != want[static_cast<std::size_t>(s.global_head[j])];
  }
  std::vector<std::uint8_t> keep(s.score.size());
  const SegmentedScores local{s.score, s.position, s.offsets};
  if (c.layer)
    dist::select_pools(comm, c.layer_wise.selection(), c.layer_wise.group_heads(c.shape), c.shape.heads_total(), local,
                       s.global_head, keep);
  else
    dist::select_pools(comm, c.global.selection(), c.global.group_heads(c.shape), c.shape.heads_total(), local,
                       s.global_head, keep);
  const auto want = oracle(c);
  for (std::size_t i = 0; i < keep.size(); ++i) bad += keep[i] != want[static_cast<std::size_t>(s.index[i])];
  return bad;
}

}  // namespace disttest
