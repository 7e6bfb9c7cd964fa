/// \file
/// kvpolicy/parts/evict/rank.hpp — the one ordering every top-k of the library uses (SPEC, Ties), and the
/// host reference selections built on it. Higher score first; among equal scores the larger
/// position (the newer token) first; across heads, equal score and position go to the lower
/// (layer, head) index.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "kvpolicy/core/math.hpp"

namespace kvpolicy::rank {

KVPOLICY_HD bool above(float score_a, std::int32_t pos_a, float score_b, std::int32_t pos_b) {
  return score_a > score_b || (score_a == score_b && pos_a > pos_b);
}
KVPOLICY_HD bool above(float score_a, std::int32_t pos_a, std::int64_t head_a, float score_b, std::int32_t pos_b,
                       std::int64_t head_b) {
  if (score_a != score_b) return score_a > score_b;
  if (pos_a != pos_b) return pos_a > pos_b;
  return head_a < head_b;
}

namespace detail {
/// The `count` entries of a head that come first under `before` (positions are unique within a head)
/// score +inf.
template <class Before>
void protect_first(std::span<const std::int32_t> position, std::int64_t count, Before before, std::span<float> score) {
  const auto len = static_cast<std::int64_t>(position.size());
  if (count <= 0 || len == 0) return;
  if (count >= len) {
    std::fill(score.begin(), score.end(), std::numeric_limits<float>::infinity());
    return;
  }
  std::vector<std::int32_t> p(position.begin(), position.end());
  std::nth_element(p.begin(), p.begin() + (count - 1), p.end(), before);
  const std::int32_t cut = p[static_cast<std::size_t>(count - 1)];
  for (std::int64_t i = 0; i < len; ++i)
    if (!before(cut, position[i])) score[i] = std::numeric_limits<float>::infinity();
}
}  // namespace detail

/// Sink protection (SPEC §5, "Protection, for every evictor"): the `sinks` entries of a head with
/// the smallest positions score +inf (the attention sinks at the sequence's start).
inline void protect_sinks(std::span<const std::int32_t> position, std::int64_t sinks, std::span<float> score) {
  detail::protect_first(position, sinks, std::less<>(), score);
}

/// Sliding-window protection (SPEC §1): the `window` entries of a head with the largest positions
/// score +inf.
inline void protect_window(std::span<const std::int32_t> position, std::int64_t window, std::span<float> score) {
  detail::protect_first(position, window, std::greater<>(), score);
}

/// keep[i] = 1 for the k entries of the segment that rank highest; others untouched (set to 0).
inline void keep_top_k(std::span<const float> score, std::span<const std::int32_t> position, std::int64_t k,
                       std::span<std::uint8_t> keep) {
  const auto len = static_cast<std::int64_t>(score.size());
  std::fill(keep.begin(), keep.end(), std::uint8_t{0});
  if (k >= len) {
    std::fill(keep.begin(), keep.end(), std::uint8_t{1});
    return;
  }
  if (k <= 0) return;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(len));
  std::iota(idx.begin(), idx.end(), std::int64_t{0});
  std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), [&](std::int64_t a, std::int64_t b) {
    return above(score[a], position[a], score[b], position[b]);
  });
  for (std::int64_t j = 0; j < k; ++j) keep[idx[static_cast<std::size_t>(j)]] = 1;
}

/// Threshold variant (SPEC §1–2): keep every entry with score >= log(alpha).
inline void keep_at_least(std::span<const float> score, float log_alpha, std::span<std::uint8_t> keep) {
  for (std::size_t i = 0; i < score.size(); ++i) keep[i] = score[i] >= log_alpha ? 1 : 0;
}

}  // namespace kvpolicy::rank
