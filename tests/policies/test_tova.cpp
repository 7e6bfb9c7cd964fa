// TOVA (kvpolicy/policies/tova.hpp) against a brute-force oracle: after every step, each head that
// holds M + B entries or more keeps the M its step's last query attends to most (softmax over the
// head's entries, mean over the GQA group), its S oldest and w newest protected, ties to the newer.
// Keys come from a palette of four vectors, so equal scores (ties) are common.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policies/tova.hpp"
#include "kvpolicy/registry.hpp"

using namespace kvpolicy;

namespace {

struct Held {
  std::int32_t position;
  int key;  // index into the palette
};

// The TOVA score of every held entry of one kv head: the group's last queries, softmax in double.
std::vector<double> tova_scores(const std::vector<Held>& held, const std::vector<std::vector<float>>& palette,
                                const std::vector<std::vector<float>>& group_queries) {
  std::vector<double> score(held.size(), 0.0);
  for (const auto& q : group_queries) {
    std::vector<double> e(held.size());
    double mx = -INFINITY, z = 0.0;
    for (std::size_t j = 0; j < held.size(); ++j) {
      double s = 0.0;
      for (std::size_t c = 0; c < q.size(); ++c) s += static_cast<double>(q[c]) * palette[static_cast<std::size_t>(held[j].key)][c];
      e[j] = s / std::sqrt(static_cast<double>(q.size()));
      mx = std::max(mx, e[j]);
    }
    for (double& x : e) z += x = std::exp(x - mx);
    for (std::size_t j = 0; j < held.size(); ++j) score[j] += e[j] / z;
  }
  for (double& s : score) s = static_cast<float>(s / static_cast<double>(group_queries.size()));
  return score;
}

}  // namespace

TEST_CASE("oracle: TOVA keeps the M entries the last query attends to most, per head, ties to the newer") {
  std::mt19937_64 rng(2024);
  std::int64_t evictions = 0, tied = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int L = 1 + trial % 2, H = 1 + (trial / 2) % 2, G = 1 + (trial / 4) % 3, d = 3;
    const CacheShape shape{L, H, H * G, d};
    const std::int64_t M = std::uniform_int_distribution<int>(2, 12)(rng), B = std::uniform_int_distribution<int>(1, 4)(rng);
    const std::int64_t S = trial % 3 == 0 ? std::uniform_int_distribution<std::int64_t>(0, M / 3)(rng) : 0;
    const std::int64_t w = trial % 4 == 1 ? std::uniform_int_distribution<std::int64_t>(0, (M - S) / 2)(rng) : 0;
    const auto v = registry::values<policies::tova>({{"budget", std::to_string(M)}, {"buffer", std::to_string(B)},
                                                     {"sinks", std::to_string(S)}, {"window", std::to_string(w)}});
    std::vector<std::vector<float>> palette(4, std::vector<float>(d));
    for (auto& k : palette)
      for (auto& x : k) x = std::normal_distribution<float>(0.0f, 1.5f)(rng);
    policies::tova::make<cpu_backend>(v, shape, memory::Paged<4>(4096), [&](auto& cache) {
      cache.add_sequence(0);
      std::map<std::pair<int, int>, std::vector<Held>> held;  // (layer, kv head) -> survivors
      std::int64_t n = 0;
      for (int step = 0; step < 10; ++step) {
        const std::int64_t T = step == 0 ? std::uniform_int_distribution<int>(1, 20)(rng) : std::uniform_int_distribution<int>(1, 3)(rng);
        std::vector<float> k(static_cast<std::size_t>(L * H * T * d)), q(static_cast<std::size_t>(L * H * G * T * d)),
            out(q.size()), lb(static_cast<std::size_t>(L * H * T), 0.0f);
        std::vector<int> which(static_cast<std::size_t>(L * H * T));
        for (std::size_t i = 0; i < which.size(); ++i) {
          which[i] = std::uniform_int_distribution<int>(0, 3)(rng);
          std::copy(palette[static_cast<std::size_t>(which[i])].begin(), palette[static_cast<std::size_t>(which[i])].end(),
                    k.begin() + static_cast<std::ptrdiff_t>(i) * d);
        }
        for (auto& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
        cache.step(0, View<const float, 4>(k.data(), {L, H, T, d}), View<const float, 4>(k.data(), {L, H, T, d}),
                   View<const float, 3>(lb.data(), {L, H, T}), View<const float, 4>(q.data(), {L, H * G, T, d}),
                   View<float, 4>(out.data(), {L, H * G, T, d}));
        for (int l = 0; l < L; ++l)
          for (int h = 0; h < H; ++h) {
            auto& mine = held[{l, h}];
            for (std::int64_t t = 0; t < T; ++t)
              mine.push_back({static_cast<std::int32_t>(n + t), which[static_cast<std::size_t>((l * H + h) * T + t)]});
            if (static_cast<std::int64_t>(mine.size()) < M + B) continue;
            ++evictions;
            std::vector<std::vector<float>> last;  // the step's last query of each head of the group
            for (int g = 0; g < G; ++g) {
              const float* at = q.data() + ((static_cast<std::int64_t>(l) * H * G + h * G + g) * T + T - 1) * d;
              last.emplace_back(at, at + d);
            }
            auto score = tova_scores(mine, palette, last);
            const auto len = static_cast<std::int64_t>(mine.size());
            for (std::int64_t j = 0; j < len; ++j)  // SPEC §5: sinks and window rank above every score
              if (j < S || j >= len - w) score[static_cast<std::size_t>(j)] = INFINITY;
            std::vector<std::size_t> order(mine.size());
            for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
            std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
              return score[a] != score[b] ? score[a] > score[b] : mine[a].position > mine[b].position;
            });
            if (score[order[static_cast<std::size_t>(M - 1)]] == score[order[static_cast<std::size_t>(M)]]) ++tied;
            std::vector<Held> kept;
            for (std::int64_t j = 0; j < M; ++j) kept.push_back(mine[order[static_cast<std::size_t>(j)]]);
            std::sort(kept.begin(), kept.end(), [](const Held& a, const Held& b) { return a.position < b.position; });
            mine = kept;
          }
        n += T;
        for (int l = 0; l < L; ++l)
          for (int h = 0; h < H; ++h) {
            std::set<std::int32_t> want, got;
            for (const Held& e : held[{l, h}]) want.insert(e.position);
            for (std::int64_t i = 0; i < cache.length(0, l, h); ++i) got.insert(cache.entry(0, l, h, i).position);
            REQUIRE_MESSAGE(got == want, "trial ", trial, " step ", step, " layer ", l, " head ", h);
          }
      }
      return 0;
    });
  }
  CHECK(evictions > 10000);
  CHECK(tied > 1000);  // the boundary fell between equal scores: the tie-break decided
}

TEST_CASE("TOVA refuses a composition it cannot run, and bad options, naming the value") {
  CHECK_THROWS_WITH_AS(registry::values<policies::tova>({{"budget", "0"}}), doctest::Contains("--budget M = 0 must be >= 1"), Error);
  CHECK_THROWS_WITH_AS(registry::values<policies::tova>({{"floor", "0.5"}}),
                       doctest::Contains("--floor does not apply to policy tova (it is for: dbtrimkv)"), Error);
  const auto v = registry::values<policies::tova>({{"budget", "4"}, {"window", "5"}});
  CHECK_THROWS_WITH_AS(policies::tova::make<cpu_backend>(v, CacheShape{1, 1, 1, 2}, memory::Paged<4>(16), [](auto&) { return 0; }),
                       doctest::Contains("window w = 5 must be in [0, budget M = 4]"), Error);
  CHECK(registry::contains("tova"));
  CHECK(registry::values<policies::tova>({}).integer("buffer") == 1);  // a strict budget, one eviction per decode step
}
