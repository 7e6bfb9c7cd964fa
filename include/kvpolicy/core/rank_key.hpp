/// \file
/// kvpolicy/core/rank_key.hpp — the ranking of SPEC "Ties" as one unsigned integer, for radix
/// selection (the CUDA top-K kernels): key(a) > key(b) exactly when rank::above(a, b) within a head.
///   high 32 bits: the score, order-preserving (-0 is folded onto +0, since -0 == +0 ranks by position);
///   low 32 bits:  the position, order-preserving (larger position = newer = ranks higher on a tie).
/// NaN has no rank: every path refuses a NaN score before it is ranked.
#pragma once

#include <cstdint>

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/math.hpp"

namespace kvpolicy::rank {

/// float -> uint32 with a < b  <=>  ordered(a) < ordered(b) for every non-NaN a, b, and
/// ordered(-0) == ordered(+0).
KVPOLICY_HD std::uint32_t ordered_score(float score) {
  if (score == 0.0f) score = 0.0f;  // -0 -> +0
  const std::uint32_t bits = dtype::float_bits(score);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
KVPOLICY_HD float score_of_ordered(std::uint32_t ordered) {
  return dtype::bits_float((ordered & 0x80000000u) ? (ordered & 0x7fffffffu) : ~ordered);
}

/// int32 -> uint32, order-preserving.
KVPOLICY_HD std::uint32_t ordered_position(std::int32_t position) {
  return static_cast<std::uint32_t>(position) ^ 0x80000000u;
}

/// The 64-bit rank key of an entry within its head: larger key = ranks higher (SPEC, Ties).
KVPOLICY_HD std::uint64_t entry_key(float score, std::int32_t position) {
  return (static_cast<std::uint64_t>(ordered_score(score)) << 32) | ordered_position(position);
}

}  // namespace kvpolicy::rank
