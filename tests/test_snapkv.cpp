// SnapKV (SPEC §5): the observed-attention score by hand and against a naive dense recomputation
// (softmax of the last W_obs queries, summed, avg- or max-pooled over the prefix, GQA mean or max); the cache
// compresses each head to M once, when the declared prompt ends, keeping the observation window,
// with the window of queries spanning prefill chunks; decode tokens are never evicted.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kvpolicy/baselines.hpp"

using namespace kvpolicy;

TEST_CASE("SnapKV score by hand: softmax of the observed queries, summed, pooled, reduced over the group") {
  // keys at positions 0..4 (d = 1), keys 0,0,0,0,0 except key 2 = 1; one query head, two queries
  // q = ln(2) at position 3 (sees 0..3) and 0 at position 4 (sees all, uniform)
  const std::vector<float> keys{0, 0, 1, 0, 0};
  std::vector<EntryMeta> meta(5);
  for (int i = 0; i < 5; ++i) meta[static_cast<std::size_t>(i)].position = i;
  const std::vector<float> q{std::log(2.0f), 0.0f};
  const std::vector<std::int32_t> qpos{3, 4};
  std::vector<float> out(5);
  // query 0: weights 1,1,2,1 over keys 0..3 -> 0.2,0.2,0.4,0.2; query 1: 0.2 each -> sums 0.4,0.4,0.6,0.4,0.2
  score::ObservedAttention{2, 1}.score_window(View<const float, 2>(keys.data(), {5, 1}), meta, StepContext{5},
                                              ObservedQueries{q.data(), 1, 2, 1, qpos}, out);
  for (int j = 0; j < 5; ++j) CHECK(out[static_cast<std::size_t>(j)] == doctest::Approx(std::vector<double>{0.4, 0.4, 0.6, 0.4, 0.2}[static_cast<std::size_t>(j)]));
  // kernel 3 pools the prefix (positions 0..2; 3 and 4 are the window): 0.4, 0.6, 0.6; window unpooled
  score::ObservedAttention{2, 3, score::Pooling::max}.score_window(View<const float, 2>(keys.data(), {5, 1}), meta,
                                                                   StepContext{5}, ObservedQueries{q.data(), 1, 2, 1, qpos}, out);
  for (int j = 0; j < 5; ++j) CHECK(out[static_cast<std::size_t>(j)] == doctest::Approx(std::vector<double>{0.4, 0.6, 0.6, 0.4, 0.2}[static_cast<std::size_t>(j)]));
  // avg-pool, kernel 3, zero padding counted (SnapKV's avg_pool1d): (0+.4+.4)/3, (.4+.4+.6)/3, (.4+.6+0)/3
  score::ObservedAttention{2, 3}.score_window(View<const float, 2>(keys.data(), {5, 1}), meta, StepContext{5},
                                              ObservedQueries{q.data(), 1, 2, 1, qpos}, out);
  for (int j = 0; j < 5; ++j)
    CHECK(out[static_cast<std::size_t>(j)] == doctest::Approx(std::vector<double>{0.8 / 3, 1.4 / 3, 1.0 / 3, 0.4, 0.2}[static_cast<std::size_t>(j)]));
  // two query heads (GQA group 2): the second's queries are both 0 (uniform over what each sees):
  // sums 0.25+0.2, 0.25+0.2, 0.25+0.2, 0.25+0.2, 0.2 -> 0.45 .. 0.2; mean with the first's, or max
  const std::vector<float> q2{std::log(2.0f), 0.0f, 0.0f, 0.0f};
  score::ObservedAttention{2, 1}.score_window(View<const float, 2>(keys.data(), {5, 1}), meta, StepContext{5},
                                              ObservedQueries{q2.data(), 2, 2, 1, qpos}, out);
  for (int j = 0; j < 5; ++j)
    CHECK(out[static_cast<std::size_t>(j)] == doctest::Approx(std::vector<double>{0.425, 0.425, 0.525, 0.425, 0.2}[static_cast<std::size_t>(j)]));
  score::ObservedAttention{2, 1, score::Pooling::avg, score::GroupReduce::max}.score_window(
      View<const float, 2>(keys.data(), {5, 1}), meta, StepContext{5}, ObservedQueries{q2.data(), 2, 2, 1, qpos}, out);
  for (int j = 0; j < 5; ++j)
    CHECK(out[static_cast<std::size_t>(j)] == doctest::Approx(std::vector<double>{0.45, 0.45, 0.6, 0.45, 0.2}[static_cast<std::size_t>(j)]));
  CHECK(SnapKVConfig{}.window == 32);  // SPEC §5: the original SnapKV code's defaults
  CHECK(SnapKVConfig{}.pool_kernel == 5);
  CHECK(SnapKVConfig{}.pooling == score::Pooling::avg);
  CHECK(SnapKVConfig{}.group_reduce == score::GroupReduce::mean);
  CHECK_THROWS_AS((score::ObservedAttention{2, 4}.validate()), Error);
  CHECK_THROWS_AS((score::ObservedAttention{0, 7}.validate()), Error);
  CHECK_THROWS_AS((evict::PromptEnd{4, 5}.validate(CacheShape{1, 1, 1, 1})), Error);
}

namespace {

// SPEC §5 SnapKV, densely: scores [N] for keys (position order 0..N-1) of one kv head
std::vector<double> naive_snapkv(const std::vector<std::vector<float>>& keys, const std::vector<std::vector<std::vector<float>>>& q,
                                 const std::vector<std::int32_t>& qpos, std::int64_t W, int kernel, bool avg_pool,
                                 bool group_mean) {
  const auto N = static_cast<std::int64_t>(keys.size());
  const auto d = static_cast<std::int64_t>(keys[0].size());
  std::vector<double> best(static_cast<std::size_t>(N), group_mean ? 0.0 : -INFINITY);
  for (const auto& group_queries : q) {
    std::vector<double> sum(static_cast<std::size_t>(N), 0.0);
    for (std::size_t w = 0; w < group_queries.size(); ++w) {
      std::vector<double> e;
      for (std::int64_t j = 0; j <= qpos[w]; ++j) {
        double s = 0;
        for (std::int64_t c = 0; c < d; ++c) s += double(group_queries[w][static_cast<std::size_t>(c)]) * keys[static_cast<std::size_t>(j)][static_cast<std::size_t>(c)];
        e.push_back(s / std::sqrt(double(d)));
      }
      const double mx = *std::max_element(e.begin(), e.end());
      double z = 0;
      for (double& x : e) z += x = std::exp(x - mx);
      for (std::size_t j = 0; j < e.size(); ++j) sum[j] += e[j] / z;
    }
    const std::int64_t prefix = std::max<std::int64_t>(0, N - W);
    for (std::int64_t i = 0; i < N; ++i) {
      double v = sum[static_cast<std::size_t>(i)], total = 0;
      if (i < prefix) {
        for (std::int64_t k = i - kernel / 2; k <= i + kernel / 2; ++k)
          if (k >= 0 && k < prefix) {
            v = std::max(v, sum[static_cast<std::size_t>(k)]);
            total += sum[static_cast<std::size_t>(k)];  // outside the prefix: a zero pad, counted
          }
        if (avg_pool) v = total / kernel;
      }
      double& b = best[static_cast<std::size_t>(i)];
      b = group_mean ? b + v / static_cast<double>(q.size()) : std::max(b, v);
    }
  }
  return best;
}

}  // namespace

TEST_CASE("oracle: SnapKV compresses every head to M when the declared prompt ends, and never again") {
  std::mt19937_64 rng(41);
  int compressed = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const int H = 1 + trial % 2, G = 1 + trial % 3, d = 4;
    const CacheShape shape{2, H, H * G, d};
    const std::int64_t P = std::uniform_int_distribution<int>(1, 60)(rng);
    SnapKVConfig cfg{.budget = std::uniform_int_distribution<int>(6, 20)(rng),
                     .window = std::uniform_int_distribution<int>(1, 6)(rng),
                     .pool_kernel = trial % 3 == 0 ? 1 : trial % 3 == 1 ? 5 : 7};
    cfg.pooling = trial % 2 == 0 ? score::Pooling::avg : score::Pooling::max;
    cfg.group_reduce = trial % 4 < 2 ? score::GroupReduce::mean : score::GroupReduce::max;
    if (trial % 5 == 0) cfg.sinks = std::uniform_int_distribution<int>(0, static_cast<int>(cfg.budget - cfg.window))(rng);
    SnapKVCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(2048), snapkv_evictor(cfg), snapkv_scorer(cfg));
    cache.add_sequence(0, P);
    // all tokens' keys and queries, per (layer, kv head) and (layer, query head)
    std::map<std::pair<int, int>, std::vector<std::vector<float>>> K, Q;
    std::int64_t n = 0;
    std::vector<std::int64_t> chunks;
    for (std::int64_t left = P; left > 0;) {  // prefill chunks, some shorter than W_obs
      chunks.push_back(std::min<std::int64_t>(left, std::uniform_int_distribution<int>(1, 25)(rng)));
      left -= chunks.back();
    }
    for (int i = 0; i < 6; ++i) chunks.push_back(1);
    for (const std::int64_t T : chunks) {
      std::vector<float> k(static_cast<std::size_t>(2 * H * T * d)), q(static_cast<std::size_t>(2 * H * G * T * d)), out(q.size()),
          lb(static_cast<std::size_t>(2 * H * T), 0.0f);
      for (auto* b : {&k, &q})
        for (auto& x : *b) x = std::normal_distribution<float>(0.0f, 1.5f)(rng);
      const auto r = cache.step(0, View<const float, 4>(k.data(), {2, H, T, d}), View<const float, 4>(k.data(), {2, H, T, d}),
                                View<const float, 3>(lb.data(), {2, H, T}), View<const float, 4>(q.data(), {2, H * G, T, d}),
                                View<float, 4>(out.data(), {2, H * G, T, d}));
      for (int l = 0; l < 2; ++l) {
        for (int h = 0; h < H; ++h)
          for (std::int64_t t = 0; t < T; ++t)
            K[{l, h}].emplace_back(k.begin() + ((l * H + h) * T + t) * d, k.begin() + ((l * H + h) * T + t + 1) * d);
        for (int qh = 0; qh < H * G; ++qh)
          for (std::int64_t t = 0; t < T; ++t)
            Q[{l, qh}].emplace_back(q.begin() + ((l * H * G + qh) * T + t) * d, q.begin() + ((l * H * G + qh) * T + t + 1) * d);
      }
      const bool ends = n < P && n + T >= P;
      n += T;
      CHECK(r.triggered == (ends && P > cfg.budget));
      if (!ends) continue;
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < H; ++h) {
          std::set<std::int32_t> got;
          for (std::int64_t j = 0; j < cache.length(0, l, h); ++j) got.insert(cache.entry(0, l, h, j).position);
          if (P <= cfg.budget) {
            REQUIRE(static_cast<std::int64_t>(got.size()) == P);
            continue;
          }
          ++compressed;
          const std::vector<std::vector<float>> keys(K[{l, h}].begin(), K[{l, h}].end());
          // the scorer observes the last W_obs queries (fewer if the prompt is shorter)
          const std::int64_t wobs = std::min<std::int64_t>(cfg.window, P);
          std::vector<std::vector<std::vector<float>>> qw;
          std::vector<std::int32_t> qwpos;
          for (std::int64_t w = P - wobs; w < P; ++w) qwpos.push_back(static_cast<std::int32_t>(w));
          for (int g = 0; g < G; ++g) qw.emplace_back(Q[{l, h * G + g}].end() - wobs, Q[{l, h * G + g}].end());
          const auto score = naive_snapkv(keys, qw, qwpos, cfg.window, cfg.pool_kernel,
                                          cfg.pooling == score::Pooling::avg, cfg.group_reduce == score::GroupReduce::mean);
          REQUIRE(static_cast<std::int64_t>(got.size()) == cfg.budget);
          for (std::int64_t w = P - cfg.window; w < P; ++w) REQUIRE(got.count(static_cast<std::int32_t>(w)) == 1);  // window kept
          for (std::int32_t w = 0; w < cfg.sinks; ++w) REQUIRE(got.count(w) == 1);  // sinks kept (SPEC §5)
          for (std::int32_t a : got)
            for (std::int32_t b = 0; b < P - cfg.window; ++b)
              if (a < P - cfg.window && a >= cfg.sinks && !got.count(b))
                REQUIRE_MESSAGE(score[static_cast<std::size_t>(a)] >= score[static_cast<std::size_t>(b)] - 1e-9, "trial ", trial,
                                " kept ", a, " over ", b);
        }
    }
    for (int l = 0; l < 2; ++l)  // decode never evicts
      CHECK(cache.length(0, l, 0) == std::min(P, cfg.budget) + 6);
  }
  CHECK(compressed > 100);
}

TEST_CASE("SnapKV without a declared prompt never compresses") {
  const CacheShape shape{1, 1, 1, 2};
  SnapKVCache<> cache(shape, memory::Paged<16>(16), snapkv_evictor({.budget = 4, .window = 2}), snapkv_scorer({.budget = 4, .window = 2}));
  cache.add_sequence(0);
  std::vector<float> k(2 * 20, 0.5f), lb(20, 0.0f), out(k.size());
  for (std::int64_t T : {10, 10}) {
    const auto r = cache.step(0, View<const float, 4>(k.data(), {1, 1, T, 2}), View<const float, 4>(k.data(), {1, 1, T, 2}),
                              View<const float, 3>(lb.data(), {1, 1, T}), View<const float, 4>(k.data(), {1, 1, T, 2}),
                              View<float, 4>(out.data(), {1, 1, T, 2}));
    CHECK_FALSE(r.triggered);
  }
  CHECK(cache.length(0, 0, 0) == 20);
}

TEST_CASE("QueryWindow: the last W tokens' queries, the open step's pending until commit, gone on discard") {
  memory::QueryWindow w(3, 2, 1);  // W = 3, Hq = 2, d = 1
  auto push = [&](std::vector<float> q, std::int64_t first) {  // q [Hq = 2, T, 1]
    const auto T = static_cast<std::int64_t>(q.size() / 2);
    w.push(View<const float, 3>(q.data(), {2, T, 1}), first);
  };
  std::vector<float> buf;
  std::vector<std::int32_t> pos;
  auto group1 = [&] {  // kv head 1 of group size 1: query head 1
    const auto o = w.ordered(1, 1, buf, pos);
    return std::make_pair(std::vector<float>(o.data, o.data + o.window), std::vector<std::int32_t>(pos));
  };
  push({0, 1, 10, 11}, 0);  // tokens 0, 1: head 0 -> 0, 1; head 1 -> 10, 11
  CHECK(group1().first == std::vector<float>{10, 11});  // pending is seen
  w.discard();
  CHECK(w.size() == 0);
  push({0, 1, 10, 11}, 0);
  w.commit();
  push({2, 3, 12, 13}, 2);
  CHECK(group1() == std::make_pair(std::vector<float>{11, 12, 13}, std::vector<std::int32_t>{1, 2, 3}));
  w.discard();  // taken back: the ring alone
  CHECK(group1() == std::make_pair(std::vector<float>{10, 11}, std::vector<std::int32_t>{0, 1}));
  push({2, 3, 4, 5, 12, 13, 14, 15}, 2);  // a step longer than W keeps its last W
  w.commit();
  CHECK(group1() == std::make_pair(std::vector<float>{13, 14, 15}, std::vector<std::int32_t>{3, 4, 5}));
  push({6, 16}, 6);
  w.commit();  // the ring wraps
  CHECK(group1() == std::make_pair(std::vector<float>{14, 15, 16}, std::vector<std::int32_t>{4, 5, 6}));
}

TEST_CASE("SnapKV: a prefill chunk taken back leaves the query window as it was") {
  const CacheShape shape{1, 1, 2, 2};
  const SnapKVConfig cfg{.budget = 6, .window = 3, .pool_kernel = 3};
  SnapKVCache<cpu_backend, float, 4> a(shape, memory::Paged<4>(64), snapkv_evictor(cfg), snapkv_scorer(cfg)), b = a;
  a.add_sequence(0, 24);
  b.add_sequence(0, 24);
  std::mt19937_64 rng(2);
  for (const std::int64_t T : {10, 10, 2, 2}) {  // the window of 3 spans the last two chunks
    std::vector<float> k(static_cast<std::size_t>(T * 2)), q(static_cast<std::size_t>(2 * T * 2)), out(q.size()),
        lb(static_cast<std::size_t>(T), 0.0f);
    for (auto* v : {&k, &q})
      for (auto& x : *v) x = std::normal_distribution<float>()(rng);
    const View<const float, 4> K(k.data(), {1, 1, T, 2}), Q(q.data(), {1, 2, T, 2});
    if (T == 2) {  // attended with other queries, then taken back
      std::vector<float> junk(q.size(), 5.0f);
      a.append(0, 0, View<const float, 3>(k.data(), {1, T, 2}), View<const float, 3>(k.data(), {1, T, 2}),
               View<const float, 2>(lb.data(), {1, T}));
      a.attend(0, 0, View<const float, 3>(junk.data(), {2, T, 2}), View<float, 3>(out.data(), {2, T, 2}));
      a.abort_step(0);
    }
    a.step(0, K, K, View<const float, 3>(lb.data(), {1, 1, T}), Q, View<float, 4>(out.data(), {1, 2, T, 2}));
    b.step(0, K, K, View<const float, 3>(lb.data(), {1, 1, T}), Q, View<float, 4>(out.data(), {1, 2, T, 2}));
  }
  std::set<std::int32_t> pa, pb;
  for (std::int64_t j = 0; j < a.length(0, 0, 0); ++j) pa.insert(a.entry(0, 0, 0, j).position);
  for (std::int64_t j = 0; j < b.length(0, 0, 0); ++j) pb.insert(b.entry(0, 0, 0, j).position);
  CHECK(pa.size() == 6);
  CHECK(pa == pb);
}
