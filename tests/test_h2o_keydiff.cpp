// H2O and KeyDiff (SPEC §5): the attention mass the attention accumulates against a naive softmax
// over every query so far, H2O's eviction against the brute-force oracle on those masses, KeyDiff's
// cosine score by hand and its survivors against a naive recomputation; and compositions across
// families (an Evictor from one policy with a Scorer from another) that must run within budget.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "kvpolicy/baselines.hpp"
#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/epikv.hpp"
#include "oracle.hpp"

using namespace kvpolicy;

namespace {

struct Model {  // one head: every entry with its fp32 key
  std::vector<EntryMeta> meta;
  std::map<std::int32_t, std::vector<float>> key;
};

// Adds to each visible entry the softmax probability each (query head of the group, token) row gives it.
void naive_mass(Model& head, const std::vector<float>& q, std::int64_t group, std::int64_t T, std::int64_t d,
                std::int64_t n0, std::vector<double>& mass) {
  mass.assign(head.meta.size(), 0.0);
  for (std::int64_t g = 0; g < group; ++g)
    for (std::int64_t t = 0; t < T; ++t) {
      std::vector<double> logit(head.meta.size(), -INFINITY);
      double mx = -INFINITY;
      for (std::size_t j = 0; j < head.meta.size(); ++j) {
        if (head.meta[j].position > n0 + t) continue;
        const auto& k = head.key[head.meta[j].position];
        double s = 0;
        for (std::int64_t c = 0; c < d; ++c) s += double(q[static_cast<std::size_t>((g * T + t) * d + c)]) * k[static_cast<std::size_t>(c)];
        logit[j] = s / std::sqrt(double(d));
        mx = std::max(mx, logit[j]);
      }
      double sum = 0;
      for (double x : logit) sum += x == -INFINITY ? 0.0 : std::exp(x - mx);
      for (std::size_t j = 0; j < logit.size(); ++j)
        if (logit[j] != -INFINITY) mass[j] += std::exp(logit[j] - mx) / sum;
    }
}

template <class C>
std::vector<EntryMeta> head_entries(const C& cache, std::int64_t seq, int l, int h) {
  std::vector<EntryMeta> out;
  for (std::int64_t i = 0; i < cache.length(seq, l, h); ++i) out.push_back(cache.entry(seq, l, h, i));
  std::sort(out.begin(), out.end(), [](const EntryMeta& a, const EntryMeta& b) { return a.position < b.position; });
  return out;
}

}  // namespace

TEST_CASE("H2O: the attention mass each key accumulates equals a naive softmax over every query so far") {
  std::mt19937_64 rng(21);
  double worst = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int Hkv = std::uniform_int_distribution<int>(1, 2)(rng), G = std::uniform_int_distribution<int>(1, 3)(rng);
    const int d = std::uniform_int_distribution<int>(1, 8)(rng);
    const CacheShape shape{1, Hkv, Hkv * G, d};
    const bool evicting = trial % 2 == 1;
    const BaselineConfig cfg{.budget = std::uniform_int_distribution<int>(2, 8)(rng),
                             .buffer = std::uniform_int_distribution<int>(1, 3)(rng)};
    H2OCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(512), h2o_evictor(evicting ? cfg : BaselineConfig{.budget = 1000, .buffer = 1}));
    cache.add_sequence(1);
    std::vector<Model> model(static_cast<std::size_t>(Hkv));
    std::int64_t n = 0;
    for (int step = 0; step < 25; ++step) {
      const std::int64_t T = step < 2 ? std::uniform_int_distribution<int>(1, 40)(rng) : 1;  // prefill chunks, then decode
      std::vector<float> k(static_cast<std::size_t>(Hkv * T * d)), v(k.size()), lb(static_cast<std::size_t>(Hkv * T), 0.0f);
      std::vector<float> q(static_cast<std::size_t>(Hkv * G * T * d)), out(q.size());
      for (auto* buf : {&k, &v, &q})
        for (auto& x : *buf) x = std::normal_distribution<float>(0.0f, 1.5f)(rng);
      cache.append(1, 0, View<const float, 3>(k.data(), {Hkv, T, d}), View<const float, 3>(v.data(), {Hkv, T, d}),
                   View<const float, 2>(lb.data(), {Hkv, T}));
      cache.attend(1, 0, View<const float, 3>(q.data(), {Hkv * G, T, d}), View<float, 3>(out.data(), {Hkv * G, T, d}));
      for (int h = 0; h < Hkv; ++h) {
        Model& m = model[static_cast<std::size_t>(h)];
        for (std::int64_t t = 0; t < T; ++t) {
          m.meta.push_back(EntryMeta{static_cast<std::int32_t>(n + t), 0.0f, 0.0f, 0.0f});
          m.key[static_cast<std::int32_t>(n + t)] = std::vector<float>(k.begin() + (h * T + t) * d, k.begin() + (h * T + t + 1) * d);
        }
        std::vector<double> delta;
        const std::vector<float> qh(q.begin() + h * G * T * d, q.begin() + (h + 1) * G * T * d);
        naive_mass(m, qh, G, T, d, n, delta);
        const auto got = head_entries(cache, 1, 0, h);
        REQUIRE(got.size() == m.meta.size());
        for (std::size_t j = 0; j < got.size(); ++j) {
          REQUIRE(got[j].position == m.meta[j].position);
          const double want = m.meta[j].attention_mass + delta[j];
          const double err = std::abs(got[j].attention_mass - want) / std::max(1.0, want);
          worst = std::max(worst, err);
          REQUIRE_MESSAGE(err < 1e-5, "trial ", trial, " step ", step, " position ", got[j].position);
          m.meta[j].attention_mass = got[j].attention_mass;  // continue from the cache's own rounding
        }
      }
      cache.commit(1);
      n += T;
      // H2O's selection (SPEC §5: recent half of the budget protected, then the heaviest) on those masses
      oracle::Heads heads;
      for (auto& m : model) heads.push_back(m.meta);
      if (evicting)
        oracle::per_head(shape, heads, n, score::AttentionMass{},
                         oracle::Params{cfg.budget, cfg.buffer, cfg.budget / 2, 0.0, 0.0});
      for (int h = 0; h < Hkv; ++h) {
        Model& m = model[static_cast<std::size_t>(h)];
        m.meta = heads[static_cast<std::size_t>(h)];
        std::sort(m.meta.begin(), m.meta.end(), [](const EntryMeta& a, const EntryMeta& b) { return a.position < b.position; });
        const auto got = head_entries(cache, 1, 0, h);
        REQUIRE(got.size() == m.meta.size());
        for (std::size_t j = 0; j < got.size(); ++j) REQUIRE(got[j].position == m.meta[j].position);
        if (evicting) REQUIRE(static_cast<std::int64_t>(got.size()) < cfg.budget + cfg.buffer);
      }
    }
  }
  MESSAGE("worst relative attention-mass error vs naive: ", worst);
}

TEST_CASE("KeyDiff by hand: -cos(k, mean of the normalised keys) (SPEC §5)") {
  // keys (3,0), (0,2), (1,0), (0,0): normalised sum (2, 1); cosines 2/sqrt5, 1/sqrt5, 2/sqrt5, 0
  const std::vector<float> keys{3, 0, 0, 2, 1, 0, 0, 0};
  std::vector<EntryMeta> meta(4);
  std::vector<float> out(4);
  score::KeyDiff{}.score_head(View<const float, 2>(keys.data(), {4, 2}), meta, StepContext{4}, out);
  CHECK(out[0] == doctest::Approx(-2 / std::sqrt(5.0)));
  CHECK(out[1] == doctest::Approx(-1 / std::sqrt(5.0)));
  CHECK(out[2] == out[0]);
  CHECK(out[3] == 0.0f);
  // every key zero: the anchor is zero, every cosine 0
  const std::vector<float> zeros(6, 0.0f);
  std::vector<float> out3(3, 1.0f);
  score::KeyDiff{}.score_head(View<const float, 2>(zeros.data(), {3, 2}), std::span<const EntryMeta>(meta).first(3),
                              StepContext{3}, out3);
  CHECK(out3 == std::vector<float>{0.0f, 0.0f, 0.0f});
}

TEST_CASE("oracle: KeyDiff survivors are the top M of a naive recomputation of the cosines") {
  std::mt19937_64 rng(31);
  int evictions = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int Hkv = std::uniform_int_distribution<int>(1, 3)(rng), d = std::uniform_int_distribution<int>(1, 6)(rng);
    const CacheShape shape{2, Hkv, Hkv, d};
    const BaselineConfig cfg{.budget = std::uniform_int_distribution<int>(1, 8)(rng),
                             .buffer = std::uniform_int_distribution<int>(1, 4)(rng)};
    KeyDiffCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(1024), baseline_evictor(cfg));
    cache.add_sequence(2);
    std::vector<Model> model(static_cast<std::size_t>(2 * Hkv));
    std::int64_t n = 0;
    for (int step = 0; step < 20; ++step) {
      const std::int64_t T = std::uniform_int_distribution<int>(1, 4)(rng);
      std::vector<float> k(static_cast<std::size_t>(2 * Hkv * T * d)), lb(static_cast<std::size_t>(2 * Hkv * T), 0.0f);
      for (auto& x : k) x = static_cast<float>(std::uniform_int_distribution<int>(-2, 2)(rng));  // ties and zero keys
      const auto report = cache.step(2, View<const float, 4>(k.data(), {2, Hkv, T, d}), View<const float, 4>(k.data(), {2, Hkv, T, d}),
                                     View<const float, 3>(lb.data(), {2, Hkv, T}));
      evictions += report.triggered;
      for (int i = 0; i < 2 * Hkv; ++i) {
        Model& m = model[static_cast<std::size_t>(i)];
        for (std::int64_t t = 0; t < T; ++t) {
          m.meta.push_back(EntryMeta{static_cast<std::int32_t>(n + t), 0.0f, 0.0f, 0.0f});
          m.key[static_cast<std::int32_t>(n + t)] = std::vector<float>(k.begin() + (i * T + t) * d, k.begin() + (i * T + t + 1) * d);
        }
        const auto got = head_entries(cache, 2, i / Hkv, i % Hkv);
        if (static_cast<std::int64_t>(m.meta.size()) >= cfg.budget + cfg.buffer) {
          // naive: anchor = sum of k/||k||; score = -cos(k, anchor)
          std::vector<double> anchor(static_cast<std::size_t>(d), 0.0), score;
          for (const auto& e : m.meta) {
            const auto& kk = m.key[e.position];
            double nn = 0;
            for (float x : kk) nn += double(x) * x;
            if (nn > 0)
              for (int c = 0; c < d; ++c) anchor[static_cast<std::size_t>(c)] += kk[static_cast<std::size_t>(c)] / std::sqrt(nn);
          }
          double an = 0;
          for (double a : anchor) an += a * a;
          for (const auto& e : m.meta) {
            const auto& kk = m.key[e.position];
            double nn = 0, dot = 0;
            for (int c = 0; c < d; ++c) {
              nn += double(kk[static_cast<std::size_t>(c)]) * kk[static_cast<std::size_t>(c)];
              dot += kk[static_cast<std::size_t>(c)] * anchor[static_cast<std::size_t>(c)];
            }
            // an anchor of keys that cancel exactly is rounding noise: zero (the library's 1e-12 N)
            const bool zero_anchor = std::sqrt(an) <= 1e-12 * static_cast<double>(m.meta.size());
            score.push_back(nn > 0 && !zero_anchor ? -dot / std::sqrt(nn) / std::sqrt(an) : 0.0);
          }
          // a valid top M: M kept, each kept scoring at least each dropped, up to rounding
          REQUIRE(static_cast<std::int64_t>(got.size()) == cfg.budget);
          std::vector<std::uint8_t> kept(m.meta.size(), 0);
          for (const auto& g : got)
            for (std::size_t j = 0; j < m.meta.size(); ++j) kept[j] |= m.meta[j].position == g.position;
          for (std::size_t a = 0; a < m.meta.size(); ++a)
            for (std::size_t b = 0; b < m.meta.size(); ++b)
              if (kept[a] && !kept[b]) {
                // scores equal up to rounding may fall either way (the tie-break itself is tested in test_evict)
                REQUIRE_MESSAGE(score[a] > score[b] - 1e-9,
                                "trial ", trial, " step ", step, " kept ", m.meta[a].position, " (", score[a], ") over ",
                                m.meta[b].position, " (", score[b], ") M ", cfg.budget, " len ", m.meta.size(), " d ", d);
              }
          m.meta = got;
        } else {
          REQUIRE(got.size() == m.meta.size());
        }
      }
      n += T;
    }
  }
  CHECK(evictions > 500);
}

TEST_CASE("composition: a Scorer of one family with an Evictor of another runs within the Evictor's budget") {
  const CacheShape shape{2, 2, 4, 8};
  std::mt19937_64 rng(5);
  std::vector<float> kv(static_cast<std::size_t>(2 * 2 * 8), 0.0f), lb(4, 0.0f), q(static_cast<std::size_t>(2 * 4 * 8)), out(q.size());
  auto run = [&](auto& cache, auto check) {
    cache.add_sequence(0);
    for (int step = 0; step < 200; ++step) {
      for (auto& x : kv) x = std::normal_distribution<float>()(rng);
      for (auto& x : q) x = std::normal_distribution<float>()(rng);
      for (auto& x : lb) x = -std::uniform_real_distribution<float>(0.0f, 0.5f)(rng);
      cache.step(0, View<const float, 4>(kv.data(), {2, 2, 1, 8}), View<const float, 4>(kv.data(), {2, 2, 1, 8}),
                 View<const float, 3>(lb.data(), {2, 2, 1}), View<const float, 4>(q.data(), {2, 4, 1, 8}),
                 View<float, 4>(out.data(), {2, 4, 1, 8}));
      check(cache);
    }
  };
  // H2O's attention mass under DBTrimKV's global budget
  Cache<score::AttentionMass, admit::All, evict::Global, memory::Paged<4>, cpu_backend> mass_global(
      shape, memory::Paged<4>(256), dbtrimkv_evictor({.budget = 6, .buffer = 2}));
  run(mass_global, [](const auto& c) { CHECK(c.total_length(0) < 4 * (6 + 2)); });
  // KeyDiff under EpiKV's generated-token budget (prompt: the first token)
  Cache<score::KeyDiff, admit::All, evict::Generated, memory::Paged<4>, cpu_backend> keydiff_generated(
      shape, memory::Paged<4>(256), epikv_evictor({.budget = 10}));
  run(keydiff_generated, [](const auto& c) { CHECK(c.length(0, 1, 1) <= c.prompt_tokens(0) + 10); });
  // TRIM-KV's retention with the layer-wise pooled budget
  Cache<score::RetentionDecay, admit::All, evict::LayerWise, memory::Paged<4>, cpu_backend> trim_layerwise(
      shape, memory::Paged<4>(256), dbtrimkv_layerwise_evictor({.budget = 5, .buffer = 3}));
  run(trim_layerwise, [](const auto& c) { CHECK(c.length(0, 0, 0) + c.length(0, 0, 1) <= 2 * (5 + 3)); });
}

TEST_CASE("H2O: a step taken back leaves the mass as it was, attend once per layer and every layer per step") {
  const CacheShape shape{2, 1, 2, 4};
  std::mt19937_64 rng(8);
  H2OCache<cpu_backend, float, 4> a(shape, memory::Paged<4>(256), h2o_evictor({.budget = 6, .buffer = 2})), b = a;
  a.add_sequence(0);
  b.add_sequence(0);
  auto draw = [&](std::int64_t T) {
    std::vector<float> v(static_cast<std::size_t>(2 * 2 * T * 4));
    for (auto& x : v) x = std::normal_distribution<float>()(rng);
    return v;
  };
  for (int step = 0; step < 30; ++step) {
    const std::int64_t T = step == 0 ? 5 : 1;
    const auto k = draw(T), q = draw(T);
    std::vector<float> lb(static_cast<std::size_t>(2 * T), 0.0f), out(q.size());
    const View<const float, 4> K(k.data(), {2, 1, T, 4}), Q(q.data(), {2, 2, T, 4});
    if (step % 3 == 1) {  // a: the step is attended, then taken back, then run again
      for (int l = 0; l < 2; ++l) {
        a.append(0, l, View<const float, 3>(k.data() + l * T * 4, {1, T, 4}), View<const float, 3>(k.data() + l * T * 4, {1, T, 4}),
                 View<const float, 2>(lb.data() + l * T, {1, T}));
        a.attend(0, l, View<const float, 3>(q.data() + l * 2 * T * 4, {2, T, 4}), View<float, 3>(out.data() + l * 2 * T * 4, {2, T, 4}));
        CHECK_THROWS_WITH_AS(a.attend(0, l, View<const float, 3>(q.data() + l * 2 * T * 4, {2, T, 4}),
                                      View<float, 3>(out.data() + l * 2 * T * 4, {2, T, 4})),
                             doctest::Contains("already attended"), Error);
      }
      a.abort_step(0);
    }
    if (step % 3 == 2) {  // a commit with a layer not attended, and a step without queries, are refused
      a.append(0, 0, View<const float, 3>(k.data(), {1, T, 4}), View<const float, 3>(k.data(), {1, T, 4}),
               View<const float, 2>(lb.data(), {1, T}));
      a.append(0, 1, View<const float, 3>(k.data(), {1, T, 4}), View<const float, 3>(k.data(), {1, T, 4}),
               View<const float, 2>(lb.data(), {1, T}));
      CHECK_THROWS_WITH_AS(a.commit(0), doctest::Contains("was not attended"), Error);
      a.abort_step(0);
      CHECK_THROWS_WITH_AS(a.step(0, K, K, View<const float, 3>(lb.data(), {2, 1, T})), doctest::Contains("needs queries"), Error);
    }
    a.step(0, K, K, View<const float, 3>(lb.data(), {2, 1, T}), Q, View<float, 4>(out.data(), {2, 2, T, 4}));
    b.step(0, K, K, View<const float, 3>(lb.data(), {2, 1, T}), Q, View<float, 4>(out.data(), {2, 2, T, 4}));
    for (int l = 0; l < 2; ++l) {
      const auto ea = head_entries(a, 0, l, 0), eb = head_entries(b, 0, l, 0);
      REQUIRE(ea.size() == eb.size());
      for (std::size_t j = 0; j < ea.size(); ++j) {
        REQUIRE(ea[j].position == eb[j].position);
        REQUIRE(ea[j].attention_mass == eb[j].attention_mass);  // bit for bit
      }
    }
  }
}

TEST_CASE("H2O: a logit past fp32 adds no NaN to the mass, and eviction goes on") {
  const CacheShape shape{1, 1, 1, 1};
  H2OCache<> cache(shape, memory::Paged<16>(8), h2o_evictor({.budget = 2, .buffer = 1}));
  cache.add_sequence(0);
  for (int step = 0; step < 6; ++step) {
    float k = step == 1 ? 2e19f : 1.0f, q = 2e19f, lb = 0.0f, out = 0.0f;
    const View<const float, 4> K(&k, {1, 1, 1, 1});
    CHECK_NOTHROW(cache.step(0, K, K, View<const float, 3>(&lb, {1, 1, 1}), View<const float, 4>(&q, {1, 1, 1, 1}),
                             View<float, 4>(&out, {1, 1, 1, 1})));
    for (std::int64_t j = 0; j < cache.length(0, 0, 0); ++j) CHECK(std::isfinite(cache.entry(0, 0, 0, j).attention_mass));
  }
  CHECK(cache.length(0, 0, 0) <= 2);
}
