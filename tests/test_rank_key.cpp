// core/rank_key.hpp: the 64-bit rank key the CUDA radix selections sort by orders entries exactly
// as rank::above does (SPEC, Ties) — on random pairs drawn to tie often, and on the special values.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kvpolicy/core/rank_key.hpp"
#include "kvpolicy/parts/evict/rank.hpp"

using namespace kvpolicy;

TEST_CASE("rank key: key(a) > key(b) exactly when rank::above(a, b)") {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials{-inf, -3.5f, -1e-40f, -0.0f, 0.0f, 1e-40f, 2.0f, 3.4e38f, inf,
                                    -std::numeric_limits<float>::max(), std::numeric_limits<float>::min()};
  const std::vector<std::int32_t> positions{INT32_MIN, -7, -1, 0, 1, 2, 1000, INT32_MAX - 1, INT32_MAX};
  for (float sa : specials)
    for (float sb : specials)
      for (std::int32_t pa : positions)
        for (std::int32_t pb : positions) {
          const bool above = rank::above(sa, pa, sb, pb);
          CHECK_MESSAGE((rank::entry_key(sa, pa) > rank::entry_key(sb, pb)) == above, sa, " ", pa, " vs ", sb, " ", pb);
        }
  std::mt19937 rng(2026);
  std::uniform_int_distribution<int> small(-3, 3);
  std::uniform_int_distribution<std::int32_t> pos(-5, 5);
  std::normal_distribution<float> wide(0.0f, 1e6f);
  for (int i = 0; i < 200000; ++i) {
    const bool tie = i % 2 == 0;
    const float sa = tie ? static_cast<float>(small(rng)) * 0.5f : wide(rng);
    const float sb = tie ? static_cast<float>(small(rng)) * 0.5f : wide(rng);
    const std::int32_t pa = pos(rng), pb = pos(rng);
    REQUIRE((rank::entry_key(sa, pa) > rank::entry_key(sb, pb)) == rank::above(sa, pa, sb, pb));
    REQUIRE((rank::entry_key(sa, pa) == rank::entry_key(sb, pb)) == (sa == sb && pa == pb));
  }
}

TEST_CASE("rank key: the score half round-trips, -0 folded onto +0") {
  for (float s : {-std::numeric_limits<float>::infinity(), -2.5f, 0.0f, 1e-42f, 7.0f, std::numeric_limits<float>::infinity()})
    CHECK(rank::score_of_ordered(rank::ordered_score(s)) == s);
  CHECK(rank::ordered_score(-0.0f) == rank::ordered_score(0.0f));
  CHECK(!std::signbit(rank::score_of_ordered(rank::ordered_score(-0.0f))));
}
