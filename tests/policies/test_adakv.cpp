// AdaKV (kvpolicy/policies/adakv.hpp) against a brute-force oracle: when the declared prompt ends,
// each layer keeps Hkv * M entries: every head's sinks, observation window and top floor(alpha * M)
// first, then the layer's best by SnapKV's score (score::ObservedAttention, tested against a dense
// recomputation in test_snapkv.cpp), ties to the larger position, then the lower head. Keys come
// from a palette of four vectors, so equal scores (ties) are common; decode tokens stay.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policies/adakv.hpp"
#include "kvpolicy/registry.hpp"
#include "prompt_stream.hpp"

using namespace kvpolicy;

TEST_CASE("oracle: AdaKV allocates a layer's Hkv * M across its heads by score, each head keeping its safeguard") {
  std::mt19937_64 rng(77);
  std::int64_t compressed = 0, uneven = 0, tied = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    const int L = 1 + trial % 2, H = 2 + (trial / 2) % 3, G = 1 + (trial / 6) % 2, d = 3;
    const CacheShape shape{L, H, H * G, d};
    const std::int64_t M = std::uniform_int_distribution<int>(4, 12)(rng);
    const std::int64_t W = std::uniform_int_distribution<std::int64_t>(1, M / 2)(rng);
    const std::int64_t S = trial % 3 == 0 ? std::uniform_int_distribution<std::int64_t>(0, M - W)(rng) : 0;
    const double alpha = std::array{0.0, 0.2, 0.5, 1.0}[static_cast<std::size_t>(trial % 4)];
    const std::int64_t P = std::uniform_int_distribution<int>(2, 40)(rng);
    const auto v = registry::values<policies::adakv>({{"budget", std::to_string(M)}, {"window", std::to_string(W)},
                                                      {"sinks", std::to_string(S)}, {"safeguard", std::to_string(alpha)}});
    test::PromptStream stream(L, H, G, d, P, rng);
    policies::adakv::make<cpu_backend>(v, shape, memory::Paged<4>(4096), [&](auto& cache) {
      cache.add_sequence(0, P);
      for (const std::int64_t T : stream.chunks(rng)) {
        const bool ends = stream.step(cache, T, rng);
        const std::int64_t n = stream.n;
        for (int l = 0; l < L; ++l) {  // a layer holds every token until the prompt ends, then H * min(P, M) plus decode
          std::int64_t total = 0;
          for (int h = 0; h < H; ++h) total += cache.length(0, l, h);
          REQUIRE(total == H * (n < P ? n : std::min(P, M) + n - P));
        }
        if (!ends || P <= M) continue;
        ++compressed;
        for (int l = 0; l < L; ++l) {
          // (score, position, head) of every prompt entry of the layer, by the library's SnapKV score
          std::vector<std::tuple<float, std::int32_t, int>> all;
          for (int h = 0; h < H; ++h) {
            std::vector<float> score = stream.snapkv_scores(l, h, M, W, S);
            const std::vector<std::int64_t> order = test::ranked(score);
            const auto quota = static_cast<std::int64_t>(std::floor(alpha * static_cast<double>(M)));
            for (std::int64_t j = 0; j < quota; ++j) score[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])] = INFINITY;
            for (std::int64_t t = 0; t < P; ++t) all.emplace_back(score[static_cast<std::size_t>(t)], static_cast<std::int32_t>(t), h);
          }
          std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
            if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
            if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) > std::get<1>(b);
            return std::get<2>(a) < std::get<2>(b);
          });
          if (std::get<0>(all[static_cast<std::size_t>(H * M - 1)]) == std::get<0>(all[static_cast<std::size_t>(H * M)])) ++tied;
          std::set<std::pair<int, std::int32_t>> want, got;
          std::map<int, std::int64_t> per_head;
          for (std::int64_t j = 0; j < H * M; ++j) {
            want.insert({std::get<2>(all[static_cast<std::size_t>(j)]), std::get<1>(all[static_cast<std::size_t>(j)])});
            ++per_head[std::get<2>(all[static_cast<std::size_t>(j)])];
          }
          for (std::int64_t t = P; t < n; ++t)
            for (int h = 0; h < H; ++h) want.insert({h, static_cast<std::int32_t>(t)});  // this step's decode tokens stay
          for (int h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < cache.length(0, l, h); ++i) got.insert({h, cache.entry(0, l, h, i).position});
          REQUIRE_MESSAGE(got == want, "trial ", trial, " layer ", l);
          for (const auto& [h, kept] : per_head) uneven += kept != M;
        }
      }
      return 0;
    });
  }
  CHECK(compressed > 500);
  CHECK(uneven > 500);  // heads got unequal shares: the allocation is adaptive
  CHECK(tied > 50);     // the boundary fell between equal scores: the tie-break decided
}

TEST_CASE("AdaKV refuses bad options, naming the value") {
  const auto v = registry::values<policies::adakv>({{"safeguard", "1.5"}});
  CHECK_THROWS_WITH_AS(policies::adakv::make<cpu_backend>(v, CacheShape{1, 2, 2, 2}, memory::Paged<4>(16), [](auto&) { return 0; }),
                       doctest::Contains("safeguard alpha = 1.5 must be in [0, 1]"), Error);
  CHECK_THROWS_WITH_AS(registry::values<policies::adakv>({{"buffer", "4"}}), doctest::Contains("--buffer does not apply to policy adakv"),
                       Error);
  CHECK(registry::values<policies::adakv>({}).real("safeguard") == 0.2);  // kvpress's alpha_safeguard
}
