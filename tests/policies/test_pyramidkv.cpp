// PyramidKV (kvpolicy/policies/pyramidkv.hpp) against a brute-force oracle: when the declared
// prompt ends, each head of layer l keeps its sinks, its observation window and its best others up
// to the layer's budget M_l by SnapKV's score (score::ObservedAttention, tested against a dense
// recomputation in test_snapkv.cpp), ties to the larger position; decode tokens stay. The oracle's
// M_l is kvpress's PyramidKVPress.get_layer_budget transcribed anew here, with Python's round (half
// to even) written out. Keys come from a palette of four vectors, so ties are common.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policies/pyramidkv.hpp"
#include "kvpolicy/registry.hpp"
#include "prompt_stream.hpp"
#include "replay.hpp"

using namespace kvpolicy;

namespace {

/// Python's round(x) for a double: to the nearest integer, a half to the even one.
std::int64_t python_round(double x) {
  const double low = std::floor(x), rest = x - low;
  const auto r = static_cast<std::int64_t>(low);
  if (rest > 0.5) return r + 1;
  if (rest < 0.5) return r;
  return r % 2 == 0 ? r : r + 1;
}

/// kvpress's get_layer_budget(module, q_len) with compression_ratio = 1 - M / q_len, so that
/// max_capacity_prompt - window_size = M.
std::int64_t kvpress_layer_budget(std::int64_t M, std::int64_t window, std::int64_t beta, std::int64_t q_len, int layer,
                                  int layers, bool& pyramid) {
  const double capacity_less_window = static_cast<double>(M);
  double min_num = capacity_less_window / static_cast<double>(beta);
  double max_num = capacity_less_window * 2 - min_num;
  if (max_num >= static_cast<double>(q_len - window)) {
    max_num = static_cast<double>(q_len - window);
    min_num = capacity_less_window * 2 - max_num;
  }
  pyramid = static_cast<double>(q_len) >= max_num && max_num >= min_num && min_num >= static_cast<double>(window);
  if (!pyramid) return std::max<std::int64_t>(1, M);
  const double steps = layers > 1 ? (max_num - min_num) / (layers - 1) : 0.0;
  return python_round(max_num - layer * steps);
}

}  // namespace

TEST_CASE("oracle: PyramidKV keeps each layer's budget M_l by SnapKV's score when the prompt ends") {
  std::mt19937_64 rng(2406);
  std::int64_t compressed = 0, pyramids = 0, uniform = 0, tied = 0, halves = 0;
  for (int trial = 0; trial < 1200; ++trial) {
    const int L = 1 + trial % 4, H = 1 + (trial / 4) % 2, G = 1 + (trial / 8) % 2, d = 3;
    const CacheShape shape{L, H, H * G, d};
    const std::int64_t M = std::uniform_int_distribution<int>(4, 14)(rng);
    const std::int64_t W = std::uniform_int_distribution<std::int64_t>(1, std::max<std::int64_t>(1, M / 3))(rng);
    const std::int64_t S = trial % 3 == 0 ? std::uniform_int_distribution<std::int64_t>(0, M - W)(rng) : 0;
    const std::int64_t beta = std::array{1, 2, 3, 4, 20}[static_cast<std::size_t>(trial % 5)];
    const std::int64_t P = std::uniform_int_distribution<int>(2, 48)(rng);
    const auto v = registry::values<policies::pyramidkv>({{"budget", std::to_string(M)}, {"window", std::to_string(W)},
                                                          {"sinks", std::to_string(S)}, {"beta", std::to_string(beta)}});
    test::PromptStream stream(L, H, G, d, P, rng);
    // each layer's budget for a P-token prompt, as kvpress computes it
    std::vector<std::int64_t> budget(static_cast<std::size_t>(L));
    bool pyramid = false;
    for (int l = 0; l < L; ++l) budget[static_cast<std::size_t>(l)] = kvpress_layer_budget(M, W, beta, P, l, L, pyramid);
    if (P > M) {
      pyramids += pyramid && L > 1 && budget.front() != budget.back();
      uniform += !pyramid;
    }
    for (int l = 0; pyramid && l < L; ++l) {  // the rounding met a half: round-half-even decided
      const double max_num = std::min(2.0 * M - static_cast<double>(M) / beta, static_cast<double>(P - W));
      const double min_num = 2.0 * M - max_num;
      const double x = max_num - l * (L > 1 ? (max_num - min_num) / (L - 1) : 0.0);
      halves += x - std::floor(x) == 0.5;
    }
    policies::pyramidkv::make<cpu_backend>(v, shape, memory::Paged<4>(4096), [&](auto& cache) {
      cache.add_sequence(0, P);
      for (const std::int64_t T : stream.chunks(rng)) {
        const bool ends = stream.step(cache, T, rng);
        const std::int64_t n = stream.n;
        for (int l = 0; l < L; ++l)  // a head holds every token until the prompt ends, then min(P, M_l) plus decode
          for (int h = 0; h < H; ++h)
            REQUIRE(cache.length(0, l, h) == (n < P ? n : std::min(P, budget[static_cast<std::size_t>(l)]) + n - P));
        if (!ends) continue;
        for (int l = 0; l < L; ++l) {
          const std::int64_t keep = budget[static_cast<std::size_t>(l)];
          if (P <= keep) continue;
          ++compressed;
          for (int h = 0; h < H; ++h) {
            const std::vector<float> score = stream.snapkv_scores(l, h, M, W, S);
            const std::vector<std::int64_t> order = test::ranked(score);
            tied += score[static_cast<std::size_t>(order[static_cast<std::size_t>(keep - 1)])] ==
                    score[static_cast<std::size_t>(order[static_cast<std::size_t>(keep)])];
            std::set<std::int32_t> want, got;
            for (std::int64_t j = 0; j < keep; ++j) want.insert(static_cast<std::int32_t>(order[static_cast<std::size_t>(j)]));
            for (std::int64_t t = P; t < n; ++t) want.insert(static_cast<std::int32_t>(t));  // this step's decode tokens stay
            for (std::int64_t i = 0; i < cache.length(0, l, h); ++i) got.insert(cache.entry(0, l, h, i).position);
            REQUIRE_MESSAGE(got == want, "trial ", trial, " layer ", l, " head ", h, " M_l ", keep);
          }
        }
      }
      return 0;
    });
  }
  CHECK(compressed > 1000);
  CHECK(pyramids > 200);  // the layers' budgets differed
  CHECK(uniform > 100);   // kvpress's fallback to SnapKV's uniform M
  CHECK(tied > 50);       // the boundary fell between equal scores: the tie-break decided
  CHECK(halves > 10);     // a budget at x.5: rounding half to even decided
}

TEST_CASE("PyramidKV equals kvpress's PyramidKVPress, layer budgets and survivors (a committed fixture)") {
  // tests/policies/make_pyramidkv_fixture.py ran kvpress 0.5.5 once on a tiny random LLaMA and kept
  // the trace it compressed, its layer budgets and its survivors: no PyPI is needed here. kvpolicy
  // compresses the same prompt in one step (kvpolicy-replay's engine, as kvpolicy_tools.eval.kvpress_survivors).
  const auto f = safetensors::File::read(std::string(KVPOLICY_SOURCE_DIR) + "/tests/policies/fixtures/pyramidkv_kvpress.safetensors");
  const replay::Trace trace = replay::parse_trace(f);
  const std::int64_t L = trace.layers, H = trace.kv_heads, T = trace.tokens;
  const auto configs = f.int64s("configs");
  const auto C = static_cast<std::int64_t>(configs.size() / 3);
  REQUIRE(C == 3);
  const auto budgets = f.int64s("kvpress_budget", {C, L});
  const auto kept = f.int64s("kvpress_kept", {C, L, H, T});
  std::int64_t pyramids = 0;
  for (std::int64_t c = 0; c < C; ++c) {
    const std::int64_t M = configs[static_cast<std::size_t>(3 * c)], W = configs[static_cast<std::size_t>(3 * c + 1)],
                       beta = configs[static_cast<std::size_t>(3 * c + 2)];
    const evict::Pyramid e = pyramidkv_evictor(trace.shape(), {.budget = M, .window = W, .beta = beta});
    for (int l = 0; l < L; ++l)
      CHECK_MESSAGE(e.layer_budget(T, l) == budgets[static_cast<std::size_t>(c * L + l)], "M ", M, " layer ", l);
    pyramids += budgets[static_cast<std::size_t>(c * L)] != budgets[static_cast<std::size_t>(c * L + L - 1)];
    replay::Options opt;
    opt.policy = "pyramidkv";
    opt.prefill = T;
    opt.set("budget", std::to_string(M));
    opt.set("window", std::to_string(W));
    opt.set("beta", std::to_string(beta));
    const replay::Result r = replay::replay(trace, opt);
    for (std::int64_t i = 0; i < L * H; ++i) {
      std::int64_t differ = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        const auto at = static_cast<std::size_t>(i * T + t);
        differ += (r.evicted_at[at] == -1) != (kept[static_cast<std::size_t>(c * L * H * T) + at] == 1);
      }
      CHECK_MESSAGE(differ == 0, "M ", M, " W_obs ", W, ": layer ", i / H, " kv head ", i % H, ": ", differ,
                    " positions kept by one of kvpolicy and kvpress only");
    }
  }
  CHECK(pyramids == 2);  // two configurations build a pyramid; the third is kvpress's uniform fallback
}

TEST_CASE("PyramidKV's budgets fall with depth and average M") {
  // 24 layers, M = 1024, W_obs = 32, beta = 20, a 4,000-token prompt: min 51.2, max 1996.8
  const evict::Pyramid e = pyramidkv_evictor(CacheShape{24, 2, 4, 8}, {.budget = 1024, .window = 32});
  std::int64_t total = 0;
  for (int l = 0; l < 24; ++l) {
    total += e.layer_budget(4000, l);
    if (l > 0) CHECK(e.layer_budget(4000, l) < e.layer_budget(4000, l - 1));
  }
  CHECK(e.layer_budget(4000, 0) == 1997);
  CHECK(e.layer_budget(4000, 23) == 51);
  CHECK(std::abs(total - 24 * 1024) <= 12);  // rounding only
  // M < beta * W_obs (256 / 20 = 12.8 < 32): the window would not fit the last layer's budget, so
  // every layer keeps M, as kvpress falls back to SnapKV
  const evict::Pyramid flat = pyramidkv_evictor(CacheShape{24, 2, 4, 8}, {.budget = 256, .window = 32});
  for (int l = 0; l < 24; ++l) CHECK(flat.layer_budget(4000, l) == 256);
}

TEST_CASE("PyramidKV refuses bad options, naming the value") {
  CHECK_THROWS_WITH_AS(registry::values<policies::pyramidkv>({{"beta", "0"}}), doctest::Contains("beta = 0"), Error);
  CHECK_THROWS_WITH_AS(registry::values<policies::pyramidkv>({{"buffer", "4"}}),
                       doctest::Contains("--buffer does not apply to policy pyramidkv"), Error);
  using C = PyramidKVCache<cpu_backend, float, 4>;
  CHECK_THROWS_WITH_AS(C(CacheShape{3, 2, 2, 2}, memory::Paged<4>(16), pyramidkv_evictor(CacheShape{2, 2, 2, 2}), pyramidkv_scorer()),
                       doctest::Contains("built for 2 layers"), Error);
  CHECK_THROWS_WITH_AS(C(CacheShape{2, 2, 2, 2}, memory::Paged<4>(16), pyramidkv_evictor(CacheShape{2, 2, 2, 2}, {.budget = 8, .window = 9}),
                         pyramidkv_scorer({.budget = 8, .window = 9})),
                       doctest::Contains("window W_obs = 9"), Error);
  CHECK(registry::values<policies::pyramidkv>({}).integer("beta") == 20);  // kvpress's beta
}
