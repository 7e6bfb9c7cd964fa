// WG-KV (SPEC §3): the write gate against a naive forward in double; the dual cache against a
// simulated ring with lazy promotion (decode, prefill shorter and longer than W_local, ring
// wrap-around, chunks that straddle it); the vertical-slash mask against a dense masked reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kvpolicy/gate/write_gate.hpp"
#include "kvpolicy/wgkv.hpp"
#include "snapshot.hpp"

using namespace kvpolicy;

namespace {

struct GateWeights {
  int L, H, d, E;
  std::vector<std::vector<float>> pre, post, w1, b1, w2, b2;  // per layer
};

GateWeights random_gate(std::mt19937_64& rng, int L, int H, int d, int E) {
  GateWeights w{L, H, d, E, {}, {}, {}, {}, {}, {}};
  std::normal_distribution<float> normal;
  auto fill = [&](std::size_t n, float scale) {
    std::vector<float> v(n);
    for (auto& x : v) x = scale * normal(rng);
    return v;
  };
  for (int l = 0; l < L; ++l) {
    w.pre.push_back(fill(static_cast<std::size_t>(d), 1.0f));
    w.post.push_back(fill(static_cast<std::size_t>(d), 1.0f));
    w.w1.push_back(fill(static_cast<std::size_t>(H * E * 2 * d), 0.5f));
    w.b1.push_back(fill(static_cast<std::size_t>(H * E), 0.5f));
    w.w2.push_back(fill(static_cast<std::size_t>(H * E), 0.5f));
    w.b2.push_back(fill(static_cast<std::size_t>(H), 1.0f));
  }
  return w;
}

safetensors::File gate_file(const GateWeights& w, safetensors::DType dtype = safetensors::DType::F32) {
  safetensors::Writer out;
  for (int l = 0; l < w.L; ++l) {
    const auto p = gate::WriteGate::prefix(l);
    const auto L = static_cast<std::size_t>(l);
    out.add_f32_as(p + "pre_norm.weight", dtype, {w.d}, w.pre[L]);
    out.add_f32_as(p + "post_norm.weight", dtype, {w.d}, w.post[L]);
    out.add_f32_as(p + "w1.weight", dtype, {w.H, w.E, 2 * w.d}, w.w1[L]);
    out.add_f32_as(p + "w1.bias", dtype, {w.H, w.E}, w.b1[L]);
    out.add_f32_as(p + "w2.weight", dtype, {w.H, w.E}, w.w2[L]);
    out.add_f32_as(p + "w2.bias", dtype, {w.H}, w.b2[L]);
  }
  return safetensors::File::parse(out.bytes());
}

// SPEC §3 in double, the obvious way.
double naive_gate(const GateWeights& w, int l, int h, const float* kpre, const float* kpost) {
  const auto L = static_cast<std::size_t>(l);
  std::vector<double> f;
  for (const auto& [k, norm] : {std::pair{kpre, &w.pre[L]}, std::pair{kpost, &w.post[L]}}) {
    double ss = 0;
    for (int i = 0; i < w.d; ++i) ss += double(k[i]) * k[i];
    const double inv = 1.0 / std::sqrt(ss / w.d + 1e-6);
    for (int i = 0; i < w.d; ++i) f.push_back(k[i] * inv * (*norm)[static_cast<std::size_t>(i)]);
  }
  double z = w.b2[L][static_cast<std::size_t>(h)];
  for (int e = 0; e < w.E; ++e) {
    double a = w.b1[L][static_cast<std::size_t>(h * w.E + e)];
    for (int c = 0; c < 2 * w.d; ++c) a += w.w1[L][static_cast<std::size_t>((h * w.E + e) * 2 * w.d + c)] * f[static_cast<std::size_t>(c)];
    const double gelu = 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0)));
    z += w.w2[L][static_cast<std::size_t>(h * w.E + e)] * gelu;
  }
  return std::max(1.0 / (1.0 + std::exp(-z)), 1e-3);
}

}  // namespace

TEST_CASE("WG-KV write gate equals a naive forward (SPEC §3), with E from the file, and refuses bad input") {
  std::mt19937_64 rng(3);
  double worst = 0;
  int clamped = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int L = 2, H = 1 + trial % 3, d = 4 + 4 * (trial % 2), E = trial % 4 == 0 ? 4 * d : 6;
    const auto w = random_gate(rng, L, H, d, E);
    const auto gate = gate::WriteGate::load(gate_file(w), {.layers = L, .kv_heads = H, .head_dim = d});
    CHECK(gate.config().expansion == E);
    const std::int64_t T = 1 + trial % 7;
    std::vector<float> kpre(static_cast<std::size_t>(H * T * d)), kpost(kpre.size()), g(static_cast<std::size_t>(H * T));
    for (int l = 0; l < L; ++l) {
      for (auto* v : {&kpre, &kpost})
        for (auto& x : *v) x = 2.0f * std::normal_distribution<float>()(rng);
      gate.forward(l, View<const float, 3>(kpre.data(), {H, T, d}), View<const float, 3>(kpost.data(), {H, T, d}),
                   View<float, 2>(g.data(), {H, T}));
      for (int h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < T; ++t) {
          const double want = naive_gate(w, l, h, &kpre[static_cast<std::size_t>((h * T + t) * d)],
                                         &kpost[static_cast<std::size_t>((h * T + t) * d)]);
          const float got = g[static_cast<std::size_t>(h * T + t)];
          worst = std::max(worst, std::abs(got - want) / want);
          REQUIRE(got == doctest::Approx(want).epsilon(1e-4));
          REQUIRE(got >= 1e-3f);
          REQUIRE(got <= 1.0f);
          clamped += got == 1e-3f;
        }
    }
  }
  MESSAGE("worst relative error of g vs naive: ", worst, "; clamped at 1e-3: ", clamped);
  // a strongly negative logit clamps at 1e-3 exactly
  auto low = random_gate(rng, 1, 1, 4, 16);
  low.b2[0][0] = -40.0f;
  std::vector<float> k4(4, 1.0f);
  float g_low = 0.0f;
  gate::WriteGate::load(gate_file(low), {.layers = 1, .kv_heads = 1, .head_dim = 4})
      .forward(0, View<const float, 3>(k4.data(), {1, 1, 4}), View<const float, 3>(k4.data(), {1, 1, 4}),
               View<float, 2>(&g_low, {1, 1}));
  CHECK(g_low == 1e-3f);
  // BF16 weights load too; errors name what is wrong
  const auto w = random_gate(rng, 1, 2, 4, 16);
  CHECK_NOTHROW(gate::WriteGate::load(gate_file(w, safetensors::DType::BF16), {.layers = 1, .kv_heads = 2, .head_dim = 4}));
  CHECK_THROWS_WITH_AS(gate::WriteGate::load(gate_file(w), {.layers = 2, .kv_heads = 2, .head_dim = 4}),
                       doctest::Contains("model.layers.1.self_attn.write_gate"), Error);
  CHECK_THROWS_WITH_AS(gate::WriteGate::load(gate_file(w), {.layers = 1, .kv_heads = 2, .head_dim = 4, .expansion = 8}),
                       doctest::Contains("w1.weight"), Error);
  CHECK_THROWS_AS(gate::WriteGate::load(gate_file(w), {.layers = 1, .kv_heads = 3, .head_dim = 4}), Error);
  const auto gate = gate::WriteGate::load(gate_file(w), {.layers = 1, .kv_heads = 2, .head_dim = 4});
  std::vector<float> k(8, 1.0f), g(2);
  k[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(gate.forward(0, View<const float, 3>(k.data(), {2, 1, 4}), View<const float, 3>(k.data(), {2, 1, 4}),
                               View<float, 2>(g.data(), {2, 1})),
                  Error);
  CHECK_THROWS_WITH_AS(gate.forward(1, View<const float, 3>(k.data(), {2, 1, 4}), View<const float, 3>(k.data(), {2, 1, 4}),
                                    View<float, 2>(g.data(), {2, 1})),
                       doctest::Contains("layer 1 out of range"), Error);
}

TEST_CASE("oracle: the WG-KV dual cache keeps exactly what a ring with lazy promotion keeps") {
  std::mt19937_64 rng(17);
  std::int64_t promoted_total = 0, dropped_total = 0;
  for (int trial = 0; trial < 1200; ++trial) {
    const int kv_heads = std::uniform_int_distribution<int>(1, 3)(rng);
    const CacheShape shape{std::uniform_int_distribution<int>(1, 2)(rng), kv_heads, kv_heads, 2};
    const std::int64_t W = std::uniform_int_distribution<int>(1, 12)(rng);
    const double tau = trial % 5 == 0 ? 0.5 : 0.1;
    const std::int64_t S = trial % 3 == 0 ? std::uniform_int_distribution<int>(1, 4)(rng) : 0;  // sinks, SPEC §5
    WGKVCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(4096), wgkv_evictor({.sinks = S, .local = W, .tau = tau}));
    cache.add_sequence(9);
    // per head: the ring (oldest first) and the global cache
    std::vector<std::deque<std::pair<std::int32_t, float>>> ring(static_cast<std::size_t>(shape.heads_total()));
    std::vector<std::set<std::int32_t>> global(ring.size());
    std::int64_t n = 0;
    const int steps = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int step = 0; step < steps; ++step) {
      // prefill chunks shorter and longer than W_local, decode tokens, chunks after decode
      const std::int64_t T = step == 0 || rng() % 6 == 0 ? std::uniform_int_distribution<int>(1, 3 * static_cast<int>(W))(rng) : 1;
      const auto L = shape.layers, H = shape.kv_heads;
      std::vector<float> kv(static_cast<std::size_t>(L * H * T * 2), 0.5f), g(static_cast<std::size_t>(L * H * T));
      for (auto& x : g) {  // gate values on both sides of tau, exactly tau too
        const int kind = std::uniform_int_distribution<int>(0, 4)(rng);
        x = kind == 0 ? static_cast<float>(tau) : kind == 1 ? 1e-3f : std::uniform_real_distribution<float>(1e-3f, 1.0f)(rng);
      }
      cache.step(9, View<const float, 4>(kv.data(), {L, H, T, 2}), View<const float, 4>(kv.data(), {L, H, T, 2}),
                 View<const float, 3>(g.data(), {L, H, T}));
      for (std::size_t i = 0; i < ring.size(); ++i) {
        for (std::int64_t t = 0; t < T; ++t) {  // each token enters the ring; the one it displaces is promoted or dropped
          ring[i].push_back({static_cast<std::int32_t>(n + t), g[i * static_cast<std::size_t>(T) + static_cast<std::size_t>(t)]});
          if (static_cast<std::int64_t>(ring[i].size()) > W) {
            const auto [pos, gate] = ring[i].front();
            ring[i].pop_front();
            if (gate >= static_cast<float>(tau) || pos < S) {  // a sink stays whatever its g
              global[i].insert(pos);
              ++promoted_total;
            } else {
              ++dropped_total;
            }
          }
        }
        std::set<std::int32_t> want = global[i];
        for (const auto& [pos, gate] : ring[i]) want.insert(pos);
        std::set<std::int32_t> got;
        const int l = static_cast<int>(i) / H, h = static_cast<int>(i) % H;
        for (std::int64_t j = 0; j < cache.length(9, l, h); ++j) got.insert(cache.entry(9, l, h, j).position);
        REQUIRE_MESSAGE(got == want, "trial ", trial, " step ", step, " head ", i, " W ", W, " T ", T, " S ", S);
      }
      n += T;
    }
  }
  CHECK(promoted_total > 1000);
  CHECK(dropped_total > 1000);
}

TEST_CASE("WG-KV attention applies the vertical-slash mask, in prefill chunks and decode, like a dense masked reference") {
  std::mt19937_64 rng(23);
  double worst = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int H = 1 + trial % 2, G = 1 + trial % 3, d = 8;
    const std::int64_t W = 1 + trial % 9;
    const std::int64_t S = trial % 4 == 1 ? 2 : 0;  // sinks stay visible whatever their g (SPEC §5)
    const CacheShape shape{1, H, H * G, d};
    WGKVCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(1024), wgkv_evictor({.sinks = S, .local = W, .tau = 0.3}));
    cache.add_sequence(1);
    std::vector<std::vector<float>> all_k(static_cast<std::size_t>(H)), all_v(all_k.size()), all_g(all_k.size());
    std::int64_t n = 0;
    for (int step = 0; step < 12; ++step) {
      const std::int64_t T = step < 2 ? std::uniform_int_distribution<int>(1, 30)(rng) : 1;
      std::vector<float> k(static_cast<std::size_t>(H * T * d)), v(k.size()), g(static_cast<std::size_t>(H * T));
      std::vector<float> q(static_cast<std::size_t>(H * G * T * d)), out(q.size(), std::nanf(""));
      for (auto* b : {&k, &v, &q})
        for (auto& x : *b) x = std::normal_distribution<float>()(rng);
      for (auto& x : g) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng) < 0.4f ? 0.9f : 0.05f;
      cache.append(1, 0, View<const float, 3>(k.data(), {H, T, d}), View<const float, 3>(v.data(), {H, T, d}),
                   View<const float, 2>(g.data(), {H, T}));
      cache.attend(1, 0, View<const float, 3>(q.data(), {H * G, T, d}), View<float, 3>(out.data(), {H * G, T, d}));
      cache.commit(1);
      for (int h = 0; h < H; ++h) {
        auto& K = all_k[static_cast<std::size_t>(h)];
        auto& V = all_v[static_cast<std::size_t>(h)];
        auto& Gt = all_g[static_cast<std::size_t>(h)];
        K.insert(K.end(), k.begin() + h * T * d, k.begin() + (h + 1) * T * d);
        V.insert(V.end(), v.begin() + h * T * d, v.begin() + (h + 1) * T * d);
        Gt.insert(Gt.end(), g.begin() + h * T, g.begin() + (h + 1) * T);
        for (int gq = 0; gq < G; ++gq)
          for (std::int64_t t = 0; t < T; ++t) {  // dense over every token so far, masked by SPEC §3's rule
            const std::int64_t i = n + t;
            const float* qv = &q[static_cast<std::size_t>(((h * G + gq) * T + t) * d)];
            std::vector<double> w;
            double mx = -INFINITY;
            for (std::int64_t j = 0; j <= i; ++j) {
              const bool visible = i - j < W || Gt[static_cast<std::size_t>(j)] >= 0.3f || j < S;
              double s = -INFINITY;
              if (visible) {
                s = 0;
                for (int c = 0; c < d; ++c) s += double(qv[c]) * K[static_cast<std::size_t>(j * d + c)];
                s /= std::sqrt(double(d));
              }
              w.push_back(s);
              mx = std::max(mx, s);
            }
            double sum = 0, err = 0, ref = 0;
            for (double& x : w) sum += x = x == -INFINITY ? 0.0 : std::exp(x - mx);
            for (int c = 0; c < d; ++c) {
              double o = 0;
              for (std::size_t j = 0; j < w.size(); ++j) o += w[j] * V[j * static_cast<std::size_t>(d) + static_cast<std::size_t>(c)];
              o /= sum;
              const float got = out[static_cast<std::size_t>(((h * G + gq) * T + t) * d + c)];
              err += (got - o) * (got - o);
              ref += o * o;
            }
            worst = std::max(worst, std::sqrt(err / ref));
            REQUIRE(std::sqrt(err / ref) <= 1e-5);
          }
      }
      n += T;
    }
  }
  MESSAGE("worst relative error vs the dense masked reference: ", worst);
}

TEST_CASE("WG-KV refuses a bad W_local or tau, and a refused step changes nothing") {
  const CacheShape shape{1, 1, 1, 2};
  CHECK_THROWS_AS(WGKVCache<>(shape, memory::Paged<16>(4), wgkv_evictor({.local = 0, .tau = 0.1})), Error);
  CHECK_THROWS_AS(WGKVCache<>(shape, memory::Paged<16>(4), wgkv_evictor({.local = 4, .tau = 0.0})), Error);
  CHECK_THROWS_AS(WGKVCache<>(shape, memory::Paged<16>(4), wgkv_evictor({.local = 4, .tau = 1.5})), Error);
  WGKVCache<> cache(shape, memory::Paged<16>(4), wgkv_evictor({.local = 2, .tau = 0.1}));
  cache.add_sequence(0);
  std::vector<float> kv(2, 1.0f);
  float g = 0.5f;
  cache.step(0, View<const float, 4>(kv.data(), {1, 1, 1, 2}), View<const float, 4>(kv.data(), {1, 1, 1, 2}),
             View<const float, 3>(&g, {1, 1, 1}));
  const auto before = testing::snapshot(cache, {0});
  g = std::nanf("");
  CHECK_THROWS_AS(cache.step(0, View<const float, 4>(kv.data(), {1, 1, 1, 2}), View<const float, 4>(kv.data(), {1, 1, 1, 2}),
                             View<const float, 3>(&g, {1, 1, 1})),
                  Error);
  CHECK(testing::snapshot(cache, {0}) == before);
}

namespace {
// Appendix K's score for one head, densely: S_j = MaxPool_5(sum_w max_g softmax(q_gw K^T / sqrt d)_j)
// over the given entries in position order (keys by position: the head's global cache).
std::map<std::int32_t, double> naive_appendix_k(const std::map<std::int32_t, std::vector<float>>& keys,
                                                const std::vector<std::vector<std::vector<float>>>& q,  // [G][W][d]
                                                const std::vector<std::int32_t>& qpos, int kernel) {
  std::vector<std::int32_t> pos;
  for (const auto& [p, k] : keys) pos.push_back(p);
  const std::size_t N = pos.size();
  std::vector<double> raw(N, 0.0);
  for (std::size_t w = 0; w < qpos.size(); ++w) {
    std::vector<double> best(N, 0.0);
    for (const auto& group : q) {
      std::vector<double> e(N, -INFINITY);
      double mx = -INFINITY;
      for (std::size_t j = 0; j < N; ++j) {
        if (pos[j] > qpos[w]) continue;
        double s = 0;
        const auto& k = keys.at(pos[j]);
        for (std::size_t c = 0; c < k.size(); ++c) s += double(group[w][c]) * k[c];
        e[j] = s / std::sqrt(double(k.size()));
        mx = std::max(mx, e[j]);
      }
      if (mx == -INFINITY) continue;  // a query older than every given key sees none of them
      double z = 0;
      for (double& x : e) z += x = x == -INFINITY ? 0.0 : std::exp(x - mx);
      for (std::size_t j = 0; j < N; ++j) best[j] = std::max(best[j], e[j] / z);
    }
    for (std::size_t j = 0; j < N; ++j) raw[j] += best[j];
  }
  std::map<std::int32_t, double> out;
  for (std::size_t i = 0; i < N; ++i) {
    double v = raw[i];
    for (std::size_t k = i >= static_cast<std::size_t>(kernel / 2) ? i - kernel / 2 : 0; k <= std::min(N - 1, i + kernel / 2); ++k)
      v = std::max(v, raw[k]);
    out[pos[i]] = v;
  }
  return out;
}
}  // namespace

TEST_CASE("oracle: WG-KV under a hard budget (appendix K as the authors run it): the ring rule every step, and past the budget on the global caches, floor(10%) of each by the attention its own keys draw") {
  std::mt19937_64 rng(29);
  int pressured = 0, dropped_heads = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int H = 1 + trial % 2, G = 1 + trial % 3, d = 4, L = 2;
    const CacheShape shape{L, H, H * G, d};
    // budgets small enough for the global caches to pass them; sinks (SPEC §5) in a third of the trials
    const std::int64_t local = std::uniform_int_distribution<int>(1, 6)(rng);
    const std::int64_t average = std::uniform_int_distribution<int>(2, 9)(rng);
    const std::int64_t observed = std::uniform_int_distribution<int>(1, 8)(rng);
    const std::int64_t sinks = trial % 3 == 0 ? std::uniform_int_distribution<int>(1, 3)(rng) : 0;
    const WGKVBudgetConfig cfg{.sinks = sinks,
                               .local = local,
                               .tau = 0.3,
                               .average_budget = average,
                               .observation_window = observed,
                               .pool_kernel = trial % 2 == 0 ? 5 : 1};
    const std::int64_t S = cfg.sinks;
    WGKVBudgetCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(4096), wgkv_budget_evictor(shape, cfg),
                                                 wgkv_budget_scorer(shape, cfg));
    cache.add_sequence(0);
    std::map<std::pair<int, int>, std::map<std::int32_t, std::vector<float>>> keys;  // (layer, kv head) -> position -> key
    std::map<std::pair<int, int>, std::map<std::int32_t, float>> gates;
    std::map<std::pair<int, int>, std::vector<std::vector<float>>> queries;  // (layer, q head) -> every token's query
    std::int64_t n = 0;
    for (int step = 0; step < 40; ++step) {
      const std::int64_t T = step == 0 ? std::uniform_int_distribution<int>(1, 12)(rng) : 1;
      std::vector<float> k(static_cast<std::size_t>(L * H * T * d)), q(static_cast<std::size_t>(L * H * G * T * d)), out(q.size()),
          g(static_cast<std::size_t>(L * H * T));
      for (auto* b : {&k, &q})
        for (auto& x : *b) x = std::normal_distribution<float>(0.0f, 1.5f)(rng);
      for (auto& x : g) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng) < 0.7f ? 0.8f : 0.05f;
      // entries held before the step (what the model expects), then the step
      std::map<std::pair<int, int>, std::set<std::int32_t>> before;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (std::int64_t j = 0; j < cache.length(0, l, h); ++j) before[{l, h}].insert(cache.entry(0, l, h, j).position);
      cache.step(0, View<const float, 4>(k.data(), {L, H, T, d}), View<const float, 4>(k.data(), {L, H, T, d}),
                 View<const float, 3>(g.data(), {L, H, T}), View<const float, 4>(q.data(), {L, H * G, T, d}),
                 View<float, 4>(out.data(), {L, H * G, T, d}));
      // the model: append, the ring rule, then the budget on what is held
      std::map<std::pair<int, int>, std::set<std::int32_t>> held;
      std::int64_t total = 0;
      for (int l = 0; l < L; ++l) {
        for (int h = 0; h < H; ++h) {
          auto& set = held[{l, h}] = before[{l, h}];
          for (std::int64_t t = 0; t < T; ++t) {
            const auto p = static_cast<std::int32_t>(n + t);
            set.insert(p);
            keys[{l, h}][p] = std::vector<float>(k.begin() + ((l * H + h) * T + t) * d, k.begin() + ((l * H + h) * T + t + 1) * d);
            gates[{l, h}][p] = g[static_cast<std::size_t>((l * H + h) * T + t)];
          }
          for (auto it = set.begin(); it != set.end();)  // outside the ring, refused by the gate, not a sink: gone
            it = n + T - *it > cfg.local && gates[{l, h}][*it] < 0.3f && *it >= S ? set.erase(it) : std::next(it);
          for (const std::int32_t p : set) total += n + T - p > cfg.local;  // the global cache only (no ring)
        }
        for (int qh = 0; qh < H * G; ++qh)
          for (std::int64_t t = 0; t < T; ++t)
            queries[{l, qh}].emplace_back(q.begin() + ((l * H * G + qh) * T + t) * d, q.begin() + ((l * H * G + qh) * T + t + 1) * d);
      }
      n += T;
      const bool pressure = total > shape.heads_total() * cfg.average_budget;
      pressured += pressure;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          std::set<std::int32_t> got;
          for (std::int64_t j = 0; j < cache.length(0, l, h); ++j) got.insert(cache.entry(0, l, h, j).position);
          const auto& want = held[{l, h}];
          for (std::int32_t p : got) REQUIRE(want.count(p) == 1);  // never more than the ring rule keeps
          for (std::int32_t p : want)  // the ring is never touched
            if (n - p <= cfg.local) REQUIRE(got.count(p) == 1);
          for (std::int32_t p : want)  // sinks are never dropped
            if (p < S) REQUIRE(got.count(p) == 1);
          std::vector<std::int32_t> global;
          std::size_t droppable = 0;
          for (std::int32_t p : want)
            if (n - p > cfg.local) {
              global.push_back(p);
              droppable += p >= S;
            }
          // floor (a head with fewer than 10 global entries loses none), never a sink
          const auto drop = pressure ? std::min(droppable, static_cast<std::size_t>(std::floor(0.1 * static_cast<double>(global.size())))) : 0;
          REQUIRE_MESSAGE(got.size() == want.size() - drop, "trial ", trial, " step ", step, " pressure ", pressure);
          if (drop == 0) continue;
          ++dropped_heads;
          // the dropped ones score lowest (by the naive score over the head's global keys only, up to rounding)
          std::map<std::int32_t, std::vector<float>> head_keys;
          for (std::int32_t p : global) head_keys[p] = keys[{l, h}][p];
          const std::int64_t W = std::min<std::int64_t>(cfg.observation_window, n);
          std::vector<std::vector<std::vector<float>>> qw;
          std::vector<std::int32_t> qpos;
          for (std::int64_t w = n - W; w < n; ++w) qpos.push_back(static_cast<std::int32_t>(w));
          for (int gq = 0; gq < G; ++gq) qw.emplace_back(queries[{l, h * G + gq}].end() - W, queries[{l, h * G + gq}].end());
          const auto score = naive_appendix_k(head_keys, qw, qpos, cfg.pool_kernel);
          for (std::int32_t a : global)
            for (std::int32_t b : global)
              if (a >= S && got.count(a) && !got.count(b))
                REQUIRE_MESSAGE(score.at(a) >= score.at(b) - 1e-9, "trial ", trial, " kept ", a, " over ", b);
        }
    }
  }
  CHECK(pressured > 200);
  CHECK(dropped_heads > 100);
}

TEST_CASE("WG-KV budget: the scorer and the evictor must draw the same ring, gate and budget") {
  const CacheShape shape{1, 1, 1, 2};
  const WGKVBudgetConfig cfg{.local = 4, .tau = 0.2, .average_budget = 8, .observation_window = 4};
  auto scorer = wgkv_budget_scorer(shape, cfg);
  scorer.local = 5;
  CHECK_THROWS_WITH_AS(WGKVBudgetCache<>(shape, memory::Paged<16>(4), wgkv_budget_evictor(shape, cfg), scorer),
                       doctest::Contains("differ from the evictor"), Error);
  CHECK_NOTHROW(WGKVBudgetCache<>(shape, memory::Paged<16>(4), wgkv_budget_evictor(shape, cfg), wgkv_budget_scorer(shape, cfg)));
}

TEST_CASE("WG-KV budget: the evictor's count from the metadata is the global total its selection counts from the scores, and a step it does not bind needs no keys") {
  // Random heads (shuffled storage order, gates on and around tau, sinks, heads inside their ring):
  // global_total(meta) against the held-minus-ring count select_within makes from the scorer's
  // scores; budget_binds against that total; and the scorer, told the budget does not bind, gives
  // the same scores from the metadata alone (no keys, no queries) as with them.
  std::mt19937_64 rng(41);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::int64_t local = std::uniform_int_distribution<int>(1, 12)(rng), sinks = trial % 3 == 0 ? trial % 4 : 0;
    const double tau = 0.5;
    const int heads = std::uniform_int_distribution<int>(1, 4)(rng), d = 3, G = 2;
    std::vector<EntryMeta> meta;
    std::vector<std::int64_t> offsets{0};
    std::vector<std::int32_t> position;
    for (int h = 0; h < heads; ++h) {
      const int n = std::uniform_int_distribution<int>(0, 30)(rng);
      std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
      std::iota(pos.begin(), pos.end(), std::uniform_int_distribution<int>(0, 5)(rng));
      std::shuffle(pos.begin(), pos.end(), rng);
      for (const std::int32_t p : pos) {
        EntryMeta m{};
        m.position = p;
        m.write_score = static_cast<float>(std::uniform_int_distribution<int>(0, 4)(rng)) * 0.25f;  // 0.5 = tau: admitted
        meta.push_back(m);
        position.push_back(p);
      }
      offsets.push_back(static_cast<std::int64_t>(meta.size()));
    }
    const std::int64_t budget = std::uniform_int_distribution<int>(1, 40)(rng);
    const evict::WriteGatedBudget e{local, tau, budget, 0.1, sinks};
    score::GatedObservedAttention s;
    s.tau = tau, s.local = local, s.budget_entries = budget, s.sinks = sinks;
    StepContext c;
    c.entries = static_cast<std::int64_t>(meta.size());
    c.budget_binds = false;
    std::vector<float> score(meta.size()), with_keys(meta.size());
    std::int64_t counted = 0;
    for (int h = 0; h < heads; ++h) {
      const auto b = static_cast<std::size_t>(offsets[static_cast<std::size_t>(h)]);
      const auto n = static_cast<std::size_t>(offsets[static_cast<std::size_t>(h) + 1]) - b;
      const auto head_meta = std::span<const EntryMeta>(meta).subspan(b, n);
      REQUIRE(!s.reads_window(c));
      s.score_window(View<const float, 2>{}, head_meta, c, ObservedQueries{}, std::span<float>(score).subspan(b, n));
      std::vector<float> keys(n * d, 1.0f), q(static_cast<std::size_t>(G * 2 * d), 1.0f);
      const std::int32_t qpos[2] = {40, 41};
      s.score_window(View<const float, 2>(keys.data(), {static_cast<std::int64_t>(n), d}), head_meta, c,
                     ObservedQueries{q.data(), G, 2, d, std::span<const std::int32_t>(qpos, 2)},
                     std::span<float>(with_keys).subspan(b, n));
      // select_within's count: the ring and sinks protected, then held (not -inf) minus the ring
      std::vector<float> seg(score.begin() + static_cast<std::ptrdiff_t>(b), score.begin() + static_cast<std::ptrdiff_t>(b + n));
      rank::protect_window(std::span<const std::int32_t>(position).subspan(b, n), local, seg);
      rank::protect_sinks(std::span<const std::int32_t>(position).subspan(b, n), sinks, seg);
      std::int64_t held = 0;
      for (const float v : seg) held += v != -std::numeric_limits<float>::infinity();
      counted += held - std::min<std::int64_t>(local, static_cast<std::int64_t>(n));
    }
    CAPTURE(trial);
    CHECK(e.global_total(meta, offsets) == counted);
    CHECK(e.budget_binds(c, meta, offsets) == (counted > budget));
    CHECK(score == with_keys);
  }
}
