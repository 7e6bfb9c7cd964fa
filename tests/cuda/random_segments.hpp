// Random ragged segments for the selection tests: lengths across the kernels' paths (empty, one
// entry, the shared-memory tile's edge, beyond 64K), scores drawn to tie often (and -0, ±inf),
// positions distinct within a segment and spread over the whole int32 range.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kvpolicy/core/entry.hpp"

namespace cudatest {

struct Segments {
  std::vector<float> score;
  std::vector<std::int32_t> position;
  std::vector<std::int64_t> offsets{0};

  std::int64_t segments() const { return static_cast<std::int64_t>(offsets.size()) - 1; }
  std::int64_t max_length() const {
    std::int64_t m = 0;
    for (std::int64_t s = 0; s < segments(); ++s) m = std::max(m, offsets[s + 1] - offsets[s]);
    return m;
  }
  /// The CPU's view of segments [first, last), rebased to start at 0.
  struct Slice {
    std::vector<float> score;
    std::vector<std::int32_t> position;
    std::vector<std::int64_t> offsets;
    kvpolicy::SegmentedScores view() const { return {score, position, offsets}; }
  };
  Slice slice(std::int64_t first, std::int64_t last) const {
    Slice s;
    const auto b = offsets[first], e = offsets[last];
    s.score.assign(score.begin() + b, score.begin() + e);
    s.position.assign(position.begin() + b, position.begin() + e);
    for (std::int64_t i = first; i <= last; ++i) s.offsets.push_back(offsets[i] - b);
    return s;
  }
};

inline std::int64_t random_length(std::mt19937_64& rng, std::int64_t big) {
  const int mode = std::uniform_int_distribution<int>(0, 99)(rng);
  if (mode < 10) return std::uniform_int_distribution<std::int64_t>(0, 2)(rng);
  if (mode < 70) return std::uniform_int_distribution<std::int64_t>(0, 64)(rng);
  if (mode < 90) return std::uniform_int_distribution<std::int64_t>(1000, 2100)(rng);  // the tile's edge (2048)
  return std::uniform_int_distribution<std::int64_t>(2049, std::max<std::int64_t>(2049, big))(rng);
}

inline float random_score(std::mt19937_64& rng, int style) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  static const float ties[] = {-inf, -2.0f, -1.0f, -0.0f, 0.0f, 0.5f, 1.0f, inf};
  if (style == 0) return ties[std::uniform_int_distribution<int>(0, 7)(rng)];
  if (style == 1) return static_cast<float>(std::uniform_int_distribution<int>(-20, 0)(rng)) * 0.25f;
  return std::normal_distribution<float>(0.0f, 100.0f)(rng);
}

inline void append_segment(Segments& s, std::mt19937_64& rng, std::int64_t n, int style) {
  // distinct positions: a shuffled run starting anywhere in int32, or a sparse random set
  const std::int64_t lo = std::numeric_limits<std::int32_t>::min(), hi = std::numeric_limits<std::int32_t>::max();
  const std::int64_t base = std::uniform_int_distribution<std::int64_t>(lo, hi - 3 * n - 1)(rng);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) pos[i] = static_cast<std::int32_t>(base + 3 * i + (i % 2));
  std::shuffle(pos.begin(), pos.end(), rng);
  for (std::int64_t i = 0; i < n; ++i) {
    s.score.push_back(random_score(rng, style));
    s.position.push_back(pos[i]);
  }
  s.offsets.push_back(static_cast<std::int64_t>(s.score.size()));
}

}  // namespace cudatest
