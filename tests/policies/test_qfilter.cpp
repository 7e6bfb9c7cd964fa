// Q-Filters (policies/qfilter.hpp): each entry's frozen score is -<f[l, h], k>, its key against its
// head's filter; the per-head budget of SPEC §5 keeps the M best. The whole policy, opened through
// the registry with its filters file, against a brute-force oracle after every step (keys and
// filters on a small integer palette, so that equal scores are everywhere); the filters against a
// double-precision oracle; a file that is not the model's filters refused, naming what is wrong.

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvpolicy/open.hpp"
#include "kvpolicy/policies/qfilter.hpp"
#include "oracle.hpp"
#include "random_step.hpp"
#include "trials.hpp"

using namespace kvpolicy;
using kvpolicy::test::Step;
namespace st = kvpolicy::safetensors;

namespace {

/// A filters file: q_filters [L, Hkv, d], each component drawn by `draw`.
st::Writer filters_file(const CacheShape& s, const std::function<float()>& draw) {
  std::vector<float> f(static_cast<std::size_t>(s.layers * s.kv_heads * s.head_dim));
  for (float& x : f) x = draw();
  st::Writer w;
  w.add_f32("q_filters", {s.layers, s.kv_heads, s.head_dim}, f);
  return w;
}

std::string temp_path(const std::string& name) { return (std::filesystem::temp_directory_path() / name).string(); }

}  // namespace

TEST_CASE("oracle: a Q-Filters Cache opened through the registry keeps, after every step, each head's M best of -<f, k>") {
  std::mt19937_64 rng(2200);
  const std::string path = temp_path("kvpolicy-test-qfilter-oracle.safetensors");
  std::int64_t steps = 0, evicted_total = 0, tied = 0;
  for (int trial = 0; trial < random_trials(1500); ++trial) {
    const int L = 1 + trial % 3, H = 1 + (trial / 3) % 2, d = 1 + trial % 4;
    const CacheShape shape{L, H, 2 * H, d};
    // a palette of -1, 0, 1: scores are small integers, tied with one another everywhere
    const auto palette = [&] { return static_cast<float>(static_cast<int>(rng() % 3) - 1); };
    filters_file(shape, palette).write(path);
    oracle::Params p;
    p.budget = 1 + static_cast<std::int64_t>(rng() % 6);
    p.buffer = 1 + static_cast<std::int64_t>(rng() % 4);
    p.sinks = static_cast<std::int64_t>(rng() % 3);
    p.window = static_cast<std::int64_t>(rng() % 3);
    if (p.sinks + p.window > p.budget) p.sinks = p.window = 0;
    const registry::Opened opened =
        registry::open({"qfilter",
                        {{"gate", path},
                         {"budget", std::to_string(p.budget)},
                         {"buffer", std::to_string(p.buffer)},
                         {"sinks", std::to_string(p.sinks)},
                         {"window", std::to_string(p.window)}}},
                       {shape, 8, 0}, 4096);
    REQUIRE(opened.inputs.needs().keys);
    REQUIRE(!opened.inputs.needs().normed_input);
    const auto file = st::File::read(path);
    const std::vector<float> f = file.floats("q_filters", {L, H, d});
    AnyCache& cache = *opened.cache;
    cache.add_sequence(0);
    oracle::Heads heads(static_cast<std::size_t>(L * H));
    std::int64_t n = 0;
    const int chunks = 1 + static_cast<int>(rng() % 8);
    for (int c = 0; c < chunks; ++c) {
      const std::int64_t T = 1 + static_cast<std::int64_t>(rng() % 6);
      Step s(shape, T, palette);
      for (int l = 0; l < L; ++l) {
        // the producer's scores for the layer's keys, and the oracle's, in double
        const View<const float, 3> keys(s.k.data() + static_cast<std::size_t>(l * H * T * d), {H, T, d});
        inputs::LayerActivations a;
        a.keys = keys;
        opened.inputs.layer(0, l, a, View<float, 2>(s.lb.data() + static_cast<std::size_t>(l * H * T), {H, T}));
        for (int h = 0; h < H; ++h) {
          std::set<float> seen;
          for (std::int64_t t = 0; t < T; ++t) {
            double dot = 0.0;
            for (int j = 0; j < d; ++j)
              dot += static_cast<double>(f[static_cast<std::size_t>((l * H + h) * d + j)]) *
                     keys.data[(h * T + t) * d + j];
            const float want = static_cast<float>(-dot);
            REQUIRE(s.lb[static_cast<std::size_t>((l * H + h) * T + t)] == want);
            EntryMeta m{};
            m.position = static_cast<std::int32_t>(n + t);
            m.write_score = want;
            heads[static_cast<std::size_t>(l * H + h)].push_back(m);
            tied += !seen.insert(want).second;
          }
        }
      }
      const EvictionReport report = cache.step(s.view(shape, 0));
      n += T;
      ++steps;
      evicted_total += report.evicted;
      oracle::per_head(shape, heads, n, [](EntryMeta m, StepContext) { return m.write_score; }, p);
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          std::set<std::int32_t> held, want;
          for (const EntryMeta& m : cache.head_contents(0, l, h).meta) held.insert(m.position);
          for (const EntryMeta& m : heads[static_cast<std::size_t>(l * H + h)]) want.insert(m.position);
          INFO("trial ", trial, " layer ", l, " head ", h, " n ", n, " M ", p.budget, " B ", p.buffer, " S ", p.sinks,
               " w ", p.window);
          REQUIRE(held == want);
        }
    }
  }
  std::filesystem::remove(path);
  MESSAGE(steps, " steps, ", evicted_total, " entries evicted, ", tied, " scores tied within a step's head");
  CHECK(evicted_total > 0);
  CHECK(tied > 0);
}

TEST_CASE("QFilters: scores equal a double oracle, and a file that is not the model's filters is refused") {
  std::mt19937_64 rng(2201);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto draw = [&] { return normal(rng); };
  double worst = 0.0;
  for (int trial = 0; trial < random_trials(200); ++trial) {
    const CacheShape shape{1 + trial % 3, 1 + trial % 4, 1 + trial % 4, 1 + static_cast<int>(rng() % 64)};
    const st::File file = st::File::parse(filters_file(shape, draw).bytes());
    const QFilters q = QFilters::load(inputs::gate_tensors(file), shape, RopeLayout::half);
    const auto f = file.floats("q_filters");
    const std::int64_t H = shape.kv_heads, T = 1 + static_cast<std::int64_t>(rng() % 7), d = shape.head_dim;
    std::vector<float> k(static_cast<std::size_t>(H * T * d)), got(static_cast<std::size_t>(H * T));
    for (float& x : k) x = draw();
    const int l = static_cast<int>(rng() % static_cast<std::uint64_t>(shape.layers));
    q.score(l, View<const float, 3>(k.data(), {H, T, d}), View<float, 2>(got.data(), {H, T}));
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        long double dot = 0.0L;
        for (std::int64_t j = 0; j < d; ++j)
          dot += static_cast<long double>(f[static_cast<std::size_t>((l * H + h) * d + j)]) * k[static_cast<std::size_t>((h * T + t) * d + j)];
        const double want = static_cast<double>(-dot);
        const double err = std::fabs(got[static_cast<std::size_t>(h * T + t)] - want) / std::max(1.0, std::fabs(want));
        worst = std::max(worst, err);
        REQUIRE(err < 1e-6);
      }
  }
  MESSAGE("largest relative difference from the oracle: ", worst);

  const CacheShape shape{2, 2, 4, 8};
  const auto parse = [](const st::Writer& w) { return inputs::gate_tensors(st::File::parse(w.bytes())); };
  CHECK_THROWS_WITH_AS(QFilters::load(parse(filters_file({2, 2, 4, 4}, draw)), shape, RopeLayout::half), doctest::Contains("q_filters"), Error);
  CHECK_THROWS_WITH_AS(QFilters::load(parse(filters_file({3, 2, 4, 8}, draw)), shape, RopeLayout::half), doctest::Contains("q_filters"), Error);
  st::Writer other;
  other.add_f32("layers.0.weight", {1}, std::vector<float>{1.0f});
  CHECK_THROWS_WITH_AS(QFilters::load(parse(other), shape, RopeLayout::half), doctest::Contains("q_filters"), Error);
  CHECK_THROWS_AS(QFilters::load(parse(filters_file(shape, [] { return NAN; })), shape, RopeLayout::half), Error);
  const QFilters q = QFilters::load(parse(filters_file(shape, draw)), shape, RopeLayout::half);
  std::vector<float> k(2 * 3 * 8), out(2 * 3);
  CHECK_THROWS_WITH_AS(q.score(2, View<const float, 3>(k.data(), {2, 3, 8}), View<float, 2>(out.data(), {2, 3})),
                       doctest::Contains("layer 2 out of range"), Error);
  k[5] = NAN;
  CHECK_THROWS_WITH_AS(q.score(0, View<const float, 3>(k.data(), {2, 3, 8}), View<float, 2>(out.data(), {2, 3})),
                       doctest::Contains("QFilters: keys"), Error);
  CHECK_THROWS_WITH_AS(registry::open({"qfilter", {}}, {shape, 8, 0}, 8), doctest::Contains("needs its trained gate"), Error);
}

TEST_CASE("QFilters: filters saved in one RoPE layout score keys in the other as the same pairs") {
  // a filter's pair i is components (i, i + d/2) in transformers' rotate-half layout and (2i, 2i + 1)
  // in llama.cpp's adjacent one: the same key written in either layout gets the same score
  std::mt19937_64 rng(2202);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto draw = [&] { return normal(rng); };
  const CacheShape shape{2, 2, 4, 8};
  const std::int64_t H = 2, T = 3, d = 8;
  std::vector<float> half_keys(static_cast<std::size_t>(H * T * d)), adjacent_keys(half_keys.size());
  for (float& x : half_keys) x = draw();
  for (std::int64_t r = 0; r < H * T; ++r)
    for (std::int64_t i = 0; i < d / 2; ++i) {
      adjacent_keys[static_cast<std::size_t>(r * d + 2 * i)] = half_keys[static_cast<std::size_t>(r * d + i)];
      adjacent_keys[static_cast<std::size_t>(r * d + 2 * i + 1)] = half_keys[static_cast<std::size_t>(r * d + i + d / 2)];
    }
  for (const char* saved : {"", "half", "adjacent"}) {
    CAPTURE(saved);
    st::Writer w = filters_file(shape, draw);
    if (*saved) w.metadata("rope_layout", saved);
    const auto file = inputs::gate_tensors(st::File::parse(w.bytes()));
    std::vector<float> own_scores(static_cast<std::size_t>(H * T)), other_scores(own_scores.size());
    const bool saved_adjacent = std::string(saved) == "adjacent";
    // the keys in the file's own layout, scored by the file as it is, and in the other layout
    const std::vector<float>& own = saved_adjacent ? adjacent_keys : half_keys;
    const std::vector<float>& other = saved_adjacent ? half_keys : adjacent_keys;
    const RopeLayout own_layout = saved_adjacent ? RopeLayout::adjacent : RopeLayout::half;
    const RopeLayout other_layout = saved_adjacent ? RopeLayout::half : RopeLayout::adjacent;
    QFilters::load(file, shape, own_layout).score(1, View<const float, 3>(own.data(), {H, T, d}), View<float, 2>(own_scores.data(), {H, T}));
    QFilters::load(file, shape, other_layout)
        .score(1, View<const float, 3>(other.data(), {H, T, d}), View<float, 2>(other_scores.data(), {H, T}));
    CHECK(own_scores == other_scores);
    CHECK(own_scores != std::vector<float>(own_scores.size(), 0.0f));
  }
  st::Writer bad = filters_file(shape, draw);
  bad.metadata("rope_layout", "interleaved");
  CHECK_THROWS_WITH_AS(QFilters::load(inputs::gate_tensors(st::File::parse(bad.bytes())), shape, RopeLayout::half),
                       doctest::Contains("rope_layout 'interleaved'"), Error);
}

TEST_CASE("registry: qfilter reads the step's keys only, so it runs over an engine's own K/V, and has a token-level mode") {
  CHECK(registry::over_engine_storage("qfilter"));
  CHECK(registry::takes("qfilter", "mode"));
  const registry::InputSource source = registry::input_source("qfilter");
  CHECK(source.gated);
  CHECK(source.scores == inputs::Scores::score);
  CHECK(!source.probes);
}
