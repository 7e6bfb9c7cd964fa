// Expected Attention (not in SPEC: kvpress's ExpectedAttentionPress): against a dense oracle that
// follows kvpress's code — queries generated before RoPE, their mean and covariance (centred, ÷ N)
// past the S sinks, R̄ the mean of the explicit RoPE matrices cos·I + sin·P over the F positions
// after the prompt, μ̃ = R̄μ, Σ̃ = R̄ΣR̄ᵀ, softmax of μ̃·k/√d + ½kᵀΣ̃k/d over the keys past the sinks,
// mean over the group, times ‖v‖ — while the cache sees the queries only after RoPE, in prefill
// chunks, compressing each head to M once, when the declared prompt ends. Ties (duplicated keys and
// values) go to the newer entry.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kvpolicy/baselines.hpp"

using namespace kvpolicy;

namespace {

using Matrix = std::vector<std::vector<double>>;

Matrix zeros(int d) { return Matrix(static_cast<std::size_t>(d), std::vector<double>(static_cast<std::size_t>(d), 0.0)); }

// kvpress's R = cos.unsqueeze(1) * I + sin.unsqueeze(1) * P, for either pairing of components
Matrix rope_matrix(std::int64_t p, int d, double theta, RopeLayout layout) {
  Matrix r = zeros(d);
  for (int i = 0; i < d / 2; ++i) {
    const double w = std::pow(theta, -2.0 * i / d), c = std::cos(static_cast<double>(p) * w), s = std::sin(static_cast<double>(p) * w);
    const int a = layout == RopeLayout::half ? i : 2 * i, b = layout == RopeLayout::half ? i + d / 2 : 2 * i + 1;
    r[a][a] = c, r[b][b] = c;  // cos on the diagonal
    r[a][b] = -s, r[b][a] = s;  // sin times P: P[b][a] = 1, P[a][b] = -1
  }
  return r;
}

std::vector<double> times(const Matrix& m, const std::vector<double>& x) {
  std::vector<double> y(x.size(), 0.0);
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::size_t j = 0; j < x.size(); ++j) y[i] += m[i][j] * x[j];
  return y;
}

Matrix product(const Matrix& a, const Matrix& b, bool transpose_b) {
  const std::size_t d = a.size();
  Matrix c(d, std::vector<double>(d, 0.0));
  for (std::size_t i = 0; i < d; ++i)
    for (std::size_t j = 0; j < d; ++j)
      for (std::size_t k = 0; k < d; ++k) c[i][j] += a[i][k] * (transpose_b ? b[j][k] : b[k][j]);
  return c;
}

// Expected Attention as kvpress 0.5.5's code computes it, densely, for one kv head: scores of keys 0..N-1 (position order)
// from the group's queries before RoPE qpre[g][t] at positions t = 0..P-1.
std::vector<double> naive_expected_attention(const std::vector<std::vector<float>>& keys, const std::vector<std::vector<float>>& values,
                                             const std::vector<std::vector<std::vector<double>>>& qpre, std::int64_t P,
                                             const ExpectedAttentionConfig& c) {
  const auto N = static_cast<std::int64_t>(keys.size());
  const int d = static_cast<int>(keys[0].size());
  Matrix rbar = zeros(d);
  for (std::int64_t p = P; p < P + c.future_positions; ++p) {
    const Matrix r = rope_matrix(p, d, c.rope.theta, c.rope.layout);
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) rbar[i][j] += r[i][j] / static_cast<double>(c.future_positions);
  }
  std::vector<double> mean_p(static_cast<std::size_t>(N), 0.0);
  for (const auto& q : qpre) {
    const std::int64_t n = P - c.sinks;
    std::vector<double> mu(static_cast<std::size_t>(d), 0.0);
    for (std::int64_t t = c.sinks; t < P; ++t)
      for (int a = 0; a < d; ++a) mu[a] += q[t][a] / static_cast<double>(n);
    Matrix cov = zeros(d);
    for (std::int64_t t = c.sinks; t < P; ++t)
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b) cov[a][b] += (q[t][a] - mu[a]) * (q[t][b] - mu[b]) / static_cast<double>(n);
    const std::vector<double> mt = times(rbar, mu);
    const Matrix ct = product(product(rbar, cov, false), rbar, true);
    std::vector<double> z(static_cast<std::size_t>(N));
    double mx = -INFINITY, total = 0.0;
    for (std::int64_t i = c.sinks; i < N; ++i) {
      double lin = 0.0, quad = 0.0;
      for (int a = 0; a < d; ++a) {
        lin += mt[a] * keys[i][a];
        for (int b = 0; b < d; ++b) quad += keys[i][a] * ct[a][b] * keys[i][b];
      }
      z[i] = lin / std::sqrt(double(d)) + (c.covariance ? quad / d / 2 : 0.0);
      mx = std::max(mx, z[i]);
    }
    for (std::int64_t i = c.sinks; i < N; ++i) total += std::exp(z[i] - mx);
    for (std::int64_t i = c.sinks; i < N; ++i) mean_p[i] += std::exp(z[i] - mx) / total / static_cast<double>(qpre.size());
  }
  std::vector<double> score(static_cast<std::size_t>(N), INFINITY);  // the sinks: above every other
  for (std::int64_t i = c.sinks; i < N; ++i) {
    double v2 = 0.0;
    for (const float x : values[i]) v2 += double(x) * x;
    score[i] = c.value_norm ? (mean_p[i] + c.epsilon) * std::sqrt(v2) : mean_p[i];
  }
  return score;
}

}  // namespace

TEST_CASE("oracle: Expected Attention compresses every head to M when the declared prompt ends, as kvpress scores") {
  std::mt19937_64 rng(47);
  int compressed = 0, ties = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int H = 1 + trial % 2, G = 1 + trial % 3, d = trial % 4 == 3 ? 6 : 4, L = 2;
    const CacheShape shape{L, H, H * G, d};
    ExpectedAttentionConfig cfg{.budget = std::uniform_int_distribution<int>(6, 24)(rng),
                                .sinks = std::uniform_int_distribution<int>(0, 5)(rng),
                                .future_positions = std::uniform_int_distribution<int>(1, 600)(rng),
                                .rope = {.theta = trial % 2 ? 10000.0 : 100.0, .layout = trial % 3 ? RopeLayout::half : RopeLayout::adjacent},
                                .covariance = trial % 5 != 1,
                                .value_norm = trial % 7 != 2,
                                .epsilon = trial % 11 == 3 ? 0.01 : 0.0};
    if (trial % 4 == 0) cfg.window = std::uniform_int_distribution<int>(0, static_cast<int>(cfg.budget - cfg.sinks))(rng);
    const std::int64_t P = std::uniform_int_distribution<int>(static_cast<int>(cfg.sinks) + 1, 70)(rng);
    ExpectedAttentionCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(4096), expected_attention_evictor(cfg),
                                                        expected_attention_scorer(cfg));
    cache.add_sequence(0, P);
    std::map<std::pair<int, int>, std::vector<std::vector<float>>> K, V;
    std::map<std::pair<int, int>, std::vector<std::vector<double>>> Q;  // before RoPE
    std::vector<std::int64_t> chunks;
    for (std::int64_t left = P; left > 0;) {
      chunks.push_back(std::min<std::int64_t>(left, std::uniform_int_distribution<int>(1, 30)(rng)));
      left -= chunks.back();
    }
    for (int i = 0; i < 4; ++i) chunks.push_back(1);
    const float scale = std::uniform_real_distribution<float>(0.3f, 2.5f)(rng);
    std::int64_t n = 0;
    for (const std::int64_t T : chunks) {
      std::vector<float> k(static_cast<std::size_t>(L * H * T * d)), v(k.size()), q(static_cast<std::size_t>(L * H * G * T * d)),
          out(q.size()), lb(static_cast<std::size_t>(L * H * T), 0.0f);
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (std::int64_t t = 0; t < T; ++t) {
            auto& keys = K[{l, h}];
            auto& vals = V[{l, h}];
            std::vector<float> kt(static_cast<std::size_t>(d)), vt(static_cast<std::size_t>(d));
            if (!keys.empty() && std::uniform_int_distribution<int>(0, 5)(rng) == 0) {  // a duplicate: a tie
              const auto src = std::uniform_int_distribution<std::size_t>(0, keys.size() - 1)(rng);
              kt = keys[src], vt = vals[src];
            } else {
              for (auto& x : kt) x = std::normal_distribution<float>(0.0f, scale)(rng);
              for (auto& x : vt) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
            }
            keys.push_back(kt), vals.push_back(vt);
            std::copy(kt.begin(), kt.end(), k.begin() + ((l * H + h) * T + t) * d);
            std::copy(vt.begin(), vt.end(), v.begin() + ((l * H + h) * T + t) * d);
          }
      for (int l = 0; l < L; ++l)
        for (int qh = 0; qh < H * G; ++qh)
          for (std::int64_t t = 0; t < T; ++t) {
            std::vector<double> pre(static_cast<std::size_t>(d));
            for (auto& x : pre) x = std::normal_distribution<double>(0.5, scale)(rng);  // a mean away from 0
            const std::vector<double> post = times(rope_matrix(n + t, d, cfg.rope.theta, cfg.rope.layout), pre);
            std::vector<double> given(static_cast<std::size_t>(d));
            for (int c = 0; c < d; ++c) {
              q[static_cast<std::size_t>(((l * H * G + qh) * T + t) * d + c)] = static_cast<float>(post[c]);
              given[c] = static_cast<float>(post[c]);
            }
            // the oracle's queries before RoPE: what the cache was given, rotated back, R(p)^T = R(-p)
            Q[{l, qh}].push_back(times(rope_matrix(-(n + t), d, cfg.rope.theta, cfg.rope.layout), given));
          }
      const auto r = cache.step(0, View<const float, 4>(k.data(), {L, H, T, d}), View<const float, 4>(v.data(), {L, H, T, d}),
                                View<const float, 3>(lb.data(), {L, H, T}), View<const float, 4>(q.data(), {L, H * G, T, d}),
                                View<float, 4>(out.data(), {L, H * G, T, d}));
      const bool ends = n < P && n + T >= P;
      n += T;
      CHECK(r.triggered == (ends && P > cfg.budget));
      if (!ends) continue;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          std::set<std::int32_t> got;
          for (std::int64_t j = 0; j < cache.length(0, l, h); ++j) got.insert(cache.entry(0, l, h, j).position);
          if (P <= cfg.budget) {
            REQUIRE(static_cast<std::int64_t>(got.size()) == P);
            continue;
          }
          ++compressed;
          const std::vector<std::vector<float>> keys(K[{l, h}].begin(), K[{l, h}].begin() + P),
              vals(V[{l, h}].begin(), V[{l, h}].begin() + P);
          std::vector<std::vector<std::vector<double>>> qg;
          for (int g = 0; g < G; ++g) qg.push_back(Q[{l, h * G + g}]);
          const auto score = naive_expected_attention(keys, vals, qg, P, cfg);
          REQUIRE(static_cast<std::int64_t>(got.size()) == cfg.budget);
          for (std::int32_t s = 0; s < cfg.sinks; ++s) REQUIRE(got.count(s) == 1);  // sinks kept (SPEC §5)
          for (std::int64_t w = P - cfg.window; w < P; ++w) REQUIRE(got.count(static_cast<std::int32_t>(w)) == 1);
          const double top = *std::max_element(score.begin() + cfg.sinks, score.end());
          for (std::int32_t a : got)
            for (std::int32_t b = static_cast<std::int32_t>(cfg.sinks); b < P - cfg.window; ++b) {
              if (a < cfg.sinks || a >= P - cfg.window || got.count(b)) continue;
              REQUIRE_MESSAGE(score[a] >= score[b] - 1e-5 * top, "trial ", trial, " kept ", a, " (", score[a], ") over ", b,
                              " (", score[b], ")");
              if (keys[a] == keys[b] && vals[a] == vals[b]) {  // an exact tie goes to the newer entry
                REQUIRE_MESSAGE(a > b, "trial ", trial, ": of two equal entries, older ", a, " kept over newer ", b);
                ++ties;
              }
            }
        }
    }
    for (int l = 0; l < L; ++l)  // decode never evicts
      for (int h = 0; h < H; ++h) CHECK(cache.length(0, l, h) == std::min(P, cfg.budget) + 4);
  }
  CHECK(compressed > 300);
  CHECK(ties > 20);
}

TEST_CASE("Expected Attention's scores equal the dense oracle's, entry by entry, the sinks above every other") {
  std::mt19937_64 rng(53);
  for (int trial = 0; trial < 200; ++trial) {
    const int G = 1 + trial % 3, d = 2 * (1 + trial % 4), P = std::uniform_int_distribution<int>(2, 40)(rng);
    ExpectedAttentionConfig cfg{.sinks = std::uniform_int_distribution<int>(0, std::min(4, P - 1))(rng),
                                .future_positions = std::uniform_int_distribution<int>(1, 700)(rng),
                                .rope = {.theta = trial % 2 ? 10000.0 : 3.0, .layout = trial % 3 ? RopeLayout::half : RopeLayout::adjacent},
                                .covariance = trial % 5 != 1,
                                .value_norm = trial % 7 != 2,
                                .epsilon = trial % 11 == 3 ? 0.05 : 0.0};
    const float scale = std::uniform_real_distribution<float>(0.2f, 3.0f)(rng);
    // the group's queries before RoPE, handed to the statistics after it, positions 0 .. P-1
    memory::QueryStatistics stats(G, d, cfg.rope, cfg.sinks, P);
    std::vector<std::vector<std::vector<double>>> qpre(static_cast<std::size_t>(G));
    std::vector<float> q(static_cast<std::size_t>(G * P * d));
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < P; ++t) {
        std::vector<double> pre(static_cast<std::size_t>(d));
        for (auto& x : pre) x = std::normal_distribution<double>(0.3, scale)(rng);
        const auto post = times(rope_matrix(t, d, cfg.rope.theta, cfg.rope.layout), pre);
        std::vector<double> given(static_cast<std::size_t>(d));
        for (int c = 0; c < d; ++c) given[c] = q[static_cast<std::size_t>((g * P + t) * d + c)] = static_cast<float>(post[c]);
        qpre[g].push_back(times(rope_matrix(-t, d, cfg.rope.theta, cfg.rope.layout), given));
      }
    stats.push(View<const float, 3>(q.data(), {G, P, d}), 0);
    std::vector<double> buffer;
    const QueryMoments m = stats.moments(0, G, buffer);
    // the head's entries in a shuffled storage order
    std::vector<std::vector<float>> keys(static_cast<std::size_t>(P), std::vector<float>(static_cast<std::size_t>(d))), vals = keys;
    for (auto* kv : {&keys, &vals})
      for (auto& row : *kv)
        for (auto& x : row) x = std::normal_distribution<float>(0.0f, kv == &keys ? scale : 1.0f)(rng);
    std::vector<int> order(static_cast<std::size_t>(P));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<float> k(static_cast<std::size_t>(P * d)), v(k.size()), out(static_cast<std::size_t>(P));
    std::vector<EntryMeta> meta(static_cast<std::size_t>(P));
    for (int j = 0; j < P; ++j) {
      const int p = order[static_cast<std::size_t>(j)];
      meta[static_cast<std::size_t>(j)].position = p;
      std::copy(keys[p].begin(), keys[p].end(), k.begin() + j * d);
      std::copy(vals[p].begin(), vals[p].end(), v.begin() + j * d);
    }
    expected_attention_scorer(cfg).score_moments(View<const float, 2>(k.data(), {P, d}), View<const float, 2>(v.data(), {P, d}),
                                                 meta, StepContext{P}, m, out);
    const auto want = naive_expected_attention(keys, vals, qpre, P, cfg);
    float best = -INFINITY;
    for (int j = 0; j < P; ++j) {
      const int p = order[static_cast<std::size_t>(j)];
      if (p < cfg.sinks) continue;
      best = std::max(best, out[static_cast<std::size_t>(j)]);
      REQUIRE_MESSAGE(std::abs(out[static_cast<std::size_t>(j)] - want[p]) <= 1e-5 * want[p] + 1e-37, "trial ", trial,
                      " position ", p, ": ", out[static_cast<std::size_t>(j)], " against ", want[p]);
    }
    for (int j = 0; j < P; ++j)  // kvpress pads the sinks with the max + 1
      if (order[static_cast<std::size_t>(j)] < cfg.sinks) REQUIRE(out[static_cast<std::size_t>(j)] == static_cast<float>(double(best) + 1.0));
  }
}

TEST_CASE("QueryStatistics: moments of the unrotated queries past `from`, pending until commit, gone on discard") {
  const Rope rope{.theta = 100.0, .layout = RopeLayout::adjacent};
  memory::QueryStatistics s(2, 2, rope, 1, 5);  // Hq = 2, d = 2, positions 1 .. 4
  std::vector<double> buf;
  auto push = [&](std::vector<float> pre0, std::int64_t first) {  // head 0's queries before RoPE; head 1's = 2x
    const auto T = static_cast<std::int64_t>(pre0.size() / 2);
    std::vector<float> q(static_cast<std::size_t>(2 * T * 2));
    for (int h = 0; h < 2; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        const double a = static_cast<double>(first + t);  // pair 0 turns at frequency theta^0 = 1
        const double x = (h + 1) * pre0[t * 2], y = (h + 1) * pre0[t * 2 + 1];
        q[(h * T + t) * 2] = static_cast<float>(x * std::cos(a) - y * std::sin(a));
        q[(h * T + t) * 2 + 1] = static_cast<float>(x * std::sin(a) + y * std::cos(a));
      }
    s.push(View<const float, 3>(q.data(), {2, T, 2}), first);
  };
  push({9, 9, 1, 2, 3, 4}, 0);  // position 0 is left out
  auto m = s.moments(1, 1, buf);  // query head 1: 2 x (1, 2), 2 x (3, 4)
  CHECK(m.count == 2);
  CHECK(m.next_position == 3);
  CHECK(m.sum_of(0)[0] == doctest::Approx(8.0));
  CHECK(m.sum_of(0)[1] == doctest::Approx(12.0));
  CHECK(m.outer_of(0)[1] == doctest::Approx(2 * 4 + 6 * 8));
  s.discard();
  CHECK(s.moments(0, 2, buf).count == 0);
  push({9, 9, 1, 2, 3, 4}, 0);
  s.commit();
  push({5, 6, 7, 8, 1, 1}, 3);  // position 5 is past `until`
  m = s.moments(0, 2, buf);
  CHECK(m.count == 4);
  CHECK(m.next_position == 5);
  CHECK(m.sum_of(0)[0] == doctest::Approx(1 + 3 + 5 + 7));
  CHECK(m.sum_of(1)[1] == doctest::Approx(2 * (2 + 4 + 6 + 8)));
  s.discard();
  CHECK(s.moments(0, 2, buf).count == 2);
  push({5, 6, 7, 8}, 3);
  s.commit();  // the prompt's last query is in: nothing reads them again, they are given back
  m = s.moments(0, 2, buf);
  CHECK(m.count == 0);
  CHECK(m.sum_of(1)[0] == 0.0);
  memory::QueryStatistics undeclared(2, 2, rope, 1, -1);  // no prompt declared: none kept
  std::vector<float> q(8, 1.0f);
  undeclared.push(View<const float, 3>(q.data(), {2, 2, 2}), 0);
  undeclared.commit();
  CHECK(undeclared.moments(0, 1, buf).count == 0);
}

TEST_CASE("Expected Attention refuses what it cannot score, naming the value, and registers nothing") {
  CHECK_THROWS_WITH_AS((score::ExpectedAttention{.rope = {.theta = 0.5}}.validate()), doctest::Contains("theta = 0.5"), Error);
  CHECK_THROWS_WITH_AS((score::ExpectedAttention{.future_positions = 0}.validate()), doctest::Contains("F = 0"), Error);
  CHECK_THROWS_WITH_AS((score::ExpectedAttention{.epsilon = -1}.validate()), doctest::Contains("epsilon = -1"), Error);
  CHECK_THROWS_WITH_AS(ExpectedAttentionCache<>(CacheShape{1, 1, 1, 3}, memory::Paged<16>(16),
                                                expected_attention_evictor({.budget = 8}), expected_attention_scorer()),
                       doctest::Contains("head_dim = 3"), Error);
  CHECK(ExpectedAttentionConfig{}.sinks == 4);  // kvpress's defaults
  CHECK(ExpectedAttentionConfig{}.future_positions == 512);
}
