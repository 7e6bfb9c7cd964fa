// EpiKV's hidden-state signal (SPEC §4) against a naive recomputation over the window, token by
// token: g = ||h(t) - h(t-1)||, the causal rolling mean and standard deviation over the last W
// values, z-scores, both variants, short windows at the start, constant signals, chunked input.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kvpolicy/parts/score/epiphany.hpp"

using namespace kvpolicy;

namespace {

struct Naive {
  int W;
  std::vector<double> g;
  double mean(std::size_t t) const {
    const std::size_t first = t + 1 >= static_cast<std::size_t>(W) ? t + 1 - W : 0;
    double s = 0;
    for (std::size_t i = first; i <= t; ++i) s += g[i];
    return s / static_cast<double>(t + 1 - first);
  }
  double stddev(std::size_t t) const {
    const std::size_t first = t + 1 >= static_cast<std::size_t>(W) ? t + 1 - W : 0;
    const double m = mean(t);
    double s = 0;
    for (std::size_t i = first; i <= t; ++i) s += (g[i] - m) * (g[i] - m);
    return std::sqrt(s / static_cast<double>(t + 1 - first));
  }
};

double l2_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("epiphany: the rolling window equals a naive recomputation, including near-constant large values") {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int W = std::uniform_int_distribution<int>(1, 70)(rng);
    epiphany::RollingWindow w(W);
    Naive naive{W, {}};
    const int kind = trial % 3;
    for (int t = 0; t < 400; ++t) {
      double x = std::normal_distribution<double>(0.0, 1.0)(rng);
      if (kind == 1) x = 1e6 + 1e-4 * x;       // large and nearly equal: sum-of-squares would cancel
      if (kind == 2) x = t % 50 < 25 ? 3.0 : x;  // stretches of an exactly constant value
      w.push(x);
      naive.g.push_back(x);
      REQUIRE(w.count() == std::min(t + 1, W));
      const double m = naive.mean(static_cast<std::size_t>(t)), sd = naive.stddev(static_cast<std::size_t>(t));
      REQUIRE(w.mean() == doctest::Approx(m).epsilon(1e-12));
      INFO("kind ", kind, " W ", W, " t ", t, " sd ", sd, " got ", w.stddev());
      // variances: a standard deviation is the square root of rounding noise when the window is constant
      REQUIRE(std::abs(w.stddev() * w.stddev() - sd * sd) <= 1e-12 * (1.0 + sd * sd));
    }
  }
  CHECK_THROWS_AS(epiphany::RollingWindow(0), Error);
  epiphany::RollingWindow w(4);
  CHECK_THROWS_AS(w.push(std::nan("")), Error);
  CHECK(w.count() == 0);
}

TEST_CASE("epiphany: EpiKV and HS-var scores equal the SPEC formulas recomputed naively, in chunks of any size") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    const int D = std::uniform_int_distribution<int>(1, 12)(rng);
    epiphany::SignalConfig cfg;
    cfg.window = std::uniform_int_distribution<int>(1, 20)(rng);
    cfg.variant = trial % 2 ? epiphany::Variant::hs_var : epiphany::Variant::epikv;
    epiphany::Signal sig(cfg, D);
    Naive ga{cfg.window, {}}, gb{cfg.window, {}};
    std::vector<float> prev_a, prev_b;
    std::int64_t t = 0;
    while (t < 150) {
      const std::int64_t T = std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? std::uniform_int_distribution<int>(2, 9)(rng) : 1;
      std::vector<float> ha(static_cast<std::size_t>(T * D)), hb(ha.size()), out(static_cast<std::size_t>(T));
      for (auto& x : ha) x = std::normal_distribution<float>(0.0f, 2.0f)(rng);
      for (auto& x : hb) x = std::normal_distribution<float>(0.0f, 0.5f)(rng);
      if (trial % 5 == 0 && t > 10 && t < 40) hb.assign(hb.size(), 1.0f);  // an unchanging band: g = 0, std -> 0
      sig.push(View<const float, 2>(ha.data(), {T, D}), View<const float, 2>(hb.data(), {T, D}), out);
      for (std::int64_t i = 0; i < T; ++i, ++t) {
        const std::vector<float> a(ha.begin() + i * D, ha.begin() + (i + 1) * D), b(hb.begin() + i * D, hb.begin() + (i + 1) * D);
        ga.g.push_back(prev_a.empty() ? 0.0 : l2_diff(a, prev_a));
        gb.g.push_back(prev_b.empty() ? 0.0 : l2_diff(b, prev_b));
        prev_a = a;
        prev_b = b;
        const auto u = static_cast<std::size_t>(t);
        const double want = cfg.variant == epiphany::Variant::epikv
                                 ? (ga.g[u] - ga.mean(u)) / (ga.stddev(u) + 1e-6) - (gb.g[u] - gb.mean(u)) / (gb.stddev(u) + 1e-6)
                                 : ga.mean(u) - gb.mean(u);
        REQUIRE(out[static_cast<std::size_t>(i)] == doctest::Approx(want).epsilon(1e-5).scale(1.0));
      }
    }
    CHECK(sig.tokens() == t);
  }
}

TEST_CASE("epiphany: the first token scores 0, and bad input changes nothing") {
  epiphany::Signal sig({}, 4);
  std::vector<float> h{1, 2, 3, 4}, out(1);
  sig.push(View<const float, 2>(h.data(), {1, 4}), View<const float, 2>(h.data(), {1, 4}), out);
  CHECK(out[0] == 0.0f);  // g(0) = 0, the window holds only it: z = 0 / (0 + eps) on both bands
  std::vector<float> bad{1, 2, std::nanf(""), 4};
  CHECK_THROWS_AS(sig.push(View<const float, 2>(bad.data(), {1, 4}), View<const float, 2>(h.data(), {1, 4}), out), Error);
  CHECK_THROWS_AS(sig.push(View<const float, 2>(h.data(), {1, 4}), View<const float, 2>(h.data(), {2, 2}), out), Error);
  CHECK(sig.tokens() == 1);
  std::vector<float> h2{1, 2, 3, 6};
  sig.push(View<const float, 2>(h2.data(), {1, 4}), View<const float, 2>(h.data(), {1, 4}), out);
  // g_A = [0, 2]: mean 1, std 1, z_A = (2 - 1) / (1 + 1e-6); g_B = [0, 0]: z_B = 0
  CHECK(out[0] == doctest::Approx(1.0 / (1.0 + 1e-6)));
  CHECK_THROWS_AS(epiphany::Signal({}, 0), Error);
}
