// KVzap (kvpolicy/policies/kvzap.hpp, SPEC §11) against brute-force oracles: the Cache, stepped in
// random chunks with scores that tie with tau and with each other, holds after every step exactly
// each head's last W positions and every older entry scoring >= tau; the surrogate
// (KVzapSurrogate), linear and MLP, equals a double-precision oracle and refuses a file that
// is not one; the registry's producer scores each layer by the file given as --gate.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/open.hpp"
#include "kvpolicy/policies/kvzap.hpp"
#include "kvpolicy/registry.hpp"
#include "random_step.hpp"
#include "trials.hpp"

using namespace kvpolicy;
using kvpolicy::test::Step;
namespace st = kvpolicy::safetensors;

namespace {

/// A surrogate's tensors under kvpress's names: linear (I = 0) or an MLP of width I.
st::Writer surrogate_file(std::mt19937_64& rng, int L, int D, int H, int I) {
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const auto draw = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  st::Writer w;
  for (int l = 0; l < L; ++l) {
    const std::string p = KVzapSurrogate::prefix(l);
    if (I == 0) {
      w.add_f32(p + "weight", {H, D}, draw(std::int64_t{H} * D));
      w.add_f32(p + "bias", {H}, draw(H));
    } else {
      w.add_f32(p + "0.weight", {I, D}, draw(std::int64_t{I} * D));
      w.add_f32(p + "0.bias", {I}, draw(I));
      w.add_f32(p + "2.weight", {H, I}, draw(std::int64_t{H} * I));
      w.add_f32(p + "2.bias", {H}, draw(H));
    }
  }
  return w;
}

/// The surrogate of layer l in double, from the file's fp32 values: x [D] -> [H].
std::vector<double> oracle_surrogate(const st::File& f, int l, const std::vector<double>& x, int H, int I) {
  const std::string p = KVzapSurrogate::prefix(l);
  const auto affine = [&](const std::string& w, const std::string& b, const std::vector<double>& in, std::int64_t rows) {
    const auto W = f.floats(w, {rows, static_cast<std::int64_t>(in.size())});
    const auto B = f.floats(b, {rows});
    std::vector<double> out(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      double acc = B[static_cast<std::size_t>(r)];
      for (std::size_t c = 0; c < in.size(); ++c) acc += static_cast<double>(W[static_cast<std::size_t>(r) * in.size() + c]) * in[c];
      out[static_cast<std::size_t>(r)] = acc;
    }
    return out;
  };
  if (I == 0) return affine(p + "weight", p + "bias", x, H);
  auto u = affine(p + "0.weight", p + "0.bias", x, I);
  for (double& v : u) v = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
  return affine(p + "2.weight", p + "2.bias", u, H);
}

}  // namespace

TEST_CASE("oracle: a KVzap Cache holds after every step each head's last W positions and every older entry scoring >= tau") {
  std::mt19937_64 rng(1100);
  std::int64_t steps = 0, evicted_total = 0, at_tau = 0;
  for (int trial = 0; trial < random_trials(3000); ++trial) {
    const int L = 1 + trial % 3, H = 1 + (trial / 3) % 2, d = 2 + trial % 3;
    const CacheShape shape{L, H, H, d};
    const std::int64_t W = static_cast<std::int64_t>(rng() % 13);
    // tau on a coarse grid, and the scores on the same grid and its fp32 neighbours: ties with tau
    // and with one another everywhere
    const double tau = static_cast<double>(static_cast<int>(rng() % 9) - 4) * 0.5;
    const auto v = registry::values<policies::kvzap>({{"tau", std::to_string(tau)}, {"window", std::to_string(W)}});
    const KVzapConfig config = registry::read<KVzapConfig>(v, policies::kvzap::fields);
    REQUIRE(config.tau == tau);
    KVzapCache<> cache(shape, memory::Paged<16>(4096), kvzap_evictor(config));
    cache.add_sequence(0);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto draw = [&] { return normal(rng); };
    std::map<std::tuple<int, int, std::int32_t>, float> score;  // (layer, head, position) -> score
    std::int64_t n = 0;
    const int chunks = 1 + static_cast<int>(rng() % 8);
    for (int c = 0; c < chunks; ++c) {
      const std::int64_t T = 1 + static_cast<std::int64_t>(rng() % 9);
      Step s(shape, T, draw);
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (std::int64_t t = 0; t < T; ++t) {
            float x = static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.5f;
            if (rng() % 4 == 0) x = std::nextafter(x, rng() % 2 ? INFINITY : -INFINITY);
            at_tau += x == static_cast<float>(tau);
            s.lb[static_cast<std::size_t>((l * H + h) * T + t)] = x;
            score[{l, h, static_cast<std::int32_t>(n + t)}] = x;
          }
      const EvictionReport report = cache.step(s.view(shape, 0));
      n += T;
      ++steps;
      evicted_total += report.evicted;
      std::int64_t held_total = 0, want_total = 0;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          std::set<std::int32_t> held, want;
          const HeadContents contents = cache.head_contents(0, l, h);
          for (const EntryMeta& m : contents.meta) {
            held.insert(m.position);
            REQUIRE(m.write_score == score.at({l, h, m.position}));  // the score stays as written
          }
          for (std::int32_t p = 0; p < n; ++p)
            if (p >= n - W || score.at({l, h, p}) >= static_cast<float>(tau)) want.insert(p);
          INFO("trial ", trial, " layer ", l, " head ", h, " n ", n, " W ", W, " tau ", tau);
          REQUIRE(held == want);
          held_total += static_cast<std::int64_t>(held.size());
          want_total += static_cast<std::int64_t>(want.size());
        }
      REQUIRE(cache.total_length(0) == held_total);
      REQUIRE(held_total == want_total);
    }
    REQUIRE(cache.tokens(0) == n);
  }
  MESSAGE(steps, " steps, ", evicted_total, " entries evicted, ", at_tau, " scores equal to tau");
  CHECK(evicted_total > 0);
  CHECK(at_tau > 0);
}

TEST_CASE("KVzap: a bad tau or window is refused with its value") {
  const CacheShape shape{1, 1, 1, 2};
  CHECK_THROWS_WITH_AS(KVzapCache<>(shape, memory::Paged<16>(8), kvzap_evictor({.tau = NAN})), doctest::Contains("tau = nan"), Error);
  CHECK_THROWS_WITH_AS(KVzapCache<>(shape, memory::Paged<16>(8), kvzap_evictor({.window = -1})), doctest::Contains("window W = -1"),
                       Error);
  CHECK_THROWS_WITH_AS(registry::values<policies::kvzap>({{"window", "-3"}}), doctest::Contains("-3"), Error);
}

TEST_CASE("Surrogate: linear and MLP scores equal a double oracle, and a file that is not a surrogate is refused") {
  std::mt19937_64 rng(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double worst = 0.0;
  for (int trial = 0; trial < random_trials(200); ++trial) {
    const int L = 1 + trial % 3, D = 1 + static_cast<int>(rng() % 24), H = 1 + static_cast<int>(rng() % 4);
    const int I = trial % 2 == 0 ? 0 : 1 + static_cast<int>(rng() % 16);
    const st::File f = st::File::parse(surrogate_file(rng, L, D, H, I).bytes());
    const KVzapSurrogate s = KVzapSurrogate::load(inputs::gate_tensors(f), {L, D, H});
    REQUIRE(s.mlp() == (I > 0));
    REQUIRE(s.width() == I);
    const std::int64_t T = 1 + static_cast<std::int64_t>(rng() % 7);
    std::vector<float> x(static_cast<std::size_t>(T * D));
    for (float& e : x) e = normal(rng);
    std::vector<float> out(static_cast<std::size_t>(H * T));
    for (int l = 0; l < L; ++l) {
      s.forward(l, View<const float, 2>(x.data(), {T, D}), View<float, 2>(out.data(), {H, T}));
      for (std::int64_t t = 0; t < T; ++t) {
        const std::vector<double> xt(x.begin() + t * D, x.begin() + (t + 1) * D);
        const auto want = oracle_surrogate(f, l, xt, H, I);
        for (int h = 0; h < H; ++h) {
          const double diff = std::abs(out[static_cast<std::size_t>(h * T + t)] - want[static_cast<std::size_t>(h)]);
          worst = std::max(worst, diff);
          REQUIRE(diff <= 1e-5 * std::max(1.0, std::abs(want[static_cast<std::size_t>(h)])));
        }
      }
    }
  }
  MESSAGE("largest difference from the double oracle: ", worst);

  const int L = 2, D = 5, H = 3;
  const auto bytes = [&](int layers, int I) { return surrogate_file(rng, layers, D, H, I).bytes(); };
  CHECK_THROWS_WITH_AS(KVzapSurrogate::load(inputs::gate_tensors(st::File::parse(bytes(L - 1, 0))), {L, D, H}), doctest::Contains("layers.1.weight"),
                       Error);
  CHECK_THROWS_WITH_AS(KVzapSurrogate::load(inputs::gate_tensors(st::File::parse(bytes(L + 1, 4))), {L, D, H}),
                       doctest::Contains("more layers than the model's 2"), Error);
  CHECK_THROWS_WITH_AS(KVzapSurrogate::load(inputs::gate_tensors(st::File::parse(bytes(L, 0))), {L, D + 1, H}), doctest::Contains("layers.0.weight"),
                       Error);
  st::Writer other;
  other.add_f32("model.layers.0.self_attn.retention_gate.bias", {H}, std::vector<float>(H, 0.0f));
  CHECK_THROWS_WITH_AS(KVzapSurrogate::load(inputs::gate_tensors(st::File::parse(other.bytes())), {L, D, H}), doctest::Contains("holds no KVzap surrogate"),
                       Error);
  st::Writer nan = surrogate_file(rng, 1, D, H, 0);
  nan.add_f32(KVzapSurrogate::prefix(1) + "weight", {H, D}, std::vector<float>(H * D, NAN));
  nan.add_f32(KVzapSurrogate::prefix(1) + "bias", {H}, std::vector<float>(H, 0.0f));
  CHECK_THROWS_AS(KVzapSurrogate::load(inputs::gate_tensors(st::File::parse(nan.bytes())), {L, D, H}), Error);
  const KVzapSurrogate s = KVzapSurrogate::load(inputs::gate_tensors(st::File::parse(bytes(L, 0))), {L, D, H});
  std::vector<float> x(D, NAN), out(H);
  CHECK_THROWS_WITH_AS(s.forward(0, View<const float, 2>(x.data(), {1, D}), View<float, 2>(out.data(), {H, 1})),
                       doctest::Contains("Surrogate: x"), Error);
  CHECK_THROWS_WITH_AS(s.forward(L, View<const float, 2>(x.data(), {1, D}), View<float, 2>(out.data(), {H, 1})),
                       doctest::Contains("layer 2 out of range"), Error);
}

TEST_CASE("registry: kvzap reads each layer's normed input, scored by the surrogate its --gate names") {
  std::mt19937_64 rng(5);
  const CacheShape shape{2, 2, 4, 4};
  const int D = 6;
  const std::string path = (std::filesystem::temp_directory_path() / "kvpolicy-test-kvzap.safetensors").string();
  surrogate_file(rng, shape.layers, D, shape.kv_heads, 8).write(path);
  const registry::Opened opened = registry::open({"kvzap", {{"gate", path}, {"tau", "-1.5"}}}, {shape, D, 0}, 64);
  CHECK(opened.inputs.needs().normed_input);
  CHECK(!opened.inputs.needs().keys);
  const KVzapSurrogate s = KVzapSurrogate::load(inputs::read_gate(path), {shape.layers, D, shape.kv_heads});
  std::vector<float> x(3 * D), got(2 * 3), want(2 * 3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& e : x) e = normal(rng);
  for (int l = 0; l < shape.layers; ++l) {
    inputs::LayerActivations a;
    a.normed_input = View<const float, 2>(x.data(), {3, D});
    opened.inputs.layer(0, l, a, View<float, 2>(got.data(), {2, 3}));
    s.forward(l, a.normed_input, View<float, 2>(want.data(), {2, 3}));
    CHECK(got == want);
  }
  std::filesystem::remove(path);
  CHECK_THROWS_WITH_AS(registry::open({"kvzap", {}}, {shape, D, 0}, 64), doctest::Contains("needs its trained gate"), Error);
}
