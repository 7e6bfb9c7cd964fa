// KVzip (kvpolicy/policies/kvzip.hpp, docs/policies.md) against brute-force oracles: its selection on
// scores with many ties (exact), its score recomputed in double from the recorded probe queries and
// the head's keys (to 1e-5), and the whole Cache — prompt, probe step, decode — keeping what the
// two oracles together keep, the probe's own entries gone and n where the probe found it; a
// probe whose commit throws stays opened.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policies/kvzip.hpp"
#include "kvpolicy/registry.hpp"
#include "nan_scorer.hpp"
#include "random_step.hpp"
#include "trials.hpp"

using namespace kvpolicy;
using kvpolicy::test::Step;

namespace {

/// The oracle's selection: the prompt entries (position < n0) in ascending (sink, score, segment,
/// position), sinks all equal; the first floor(N · r) leave.
std::set<std::pair<std::int64_t, std::int32_t>> oracle_evicted(const std::vector<std::vector<std::pair<std::int32_t, double>>>& heads,
                                                                std::int64_t n0, double ratio, std::int64_t sinks) {
  std::vector<std::tuple<int, double, std::int64_t, std::int32_t>> order;
  for (std::size_t h = 0; h < heads.size(); ++h)
    for (const auto& [position, score] : heads[h])
      if (position < n0) {
        const bool sink = position < sinks;
        order.emplace_back(sink ? 1 : 0, sink ? 0.0 : score, static_cast<std::int64_t>(h), position);
      }
  std::sort(order.begin(), order.end());
  const auto evict = static_cast<std::size_t>(static_cast<double>(order.size()) * ratio);
  std::set<std::pair<std::int64_t, std::int32_t>> out;
  for (std::size_t i = 0; i < evict; ++i) out.insert({std::get<2>(order[i]), std::get<3>(order[i])});
  return out;
}

/// KVzip's score of every entry of one head, in double: `positions` and `keys` [N, d] the head's
/// entries in any order, `queries` the probe's [G][Q][d] of its group at positions n0 ...
std::vector<double> oracle_scores(const std::vector<std::int32_t>& positions, const std::vector<std::vector<double>>& keys,
                                  const std::vector<std::vector<std::vector<double>>>& queries, std::int64_t n0,
                                  std::int64_t sinks, std::int64_t prefix) {
  const std::size_t N = positions.size();
  std::vector<double> score(N, 0.0);
  const auto d = static_cast<double>(keys.empty() ? 1 : keys[0].size());
  for (const auto& group_head : queries)
    for (std::size_t i = 0; i < group_head.size(); ++i) {
      std::vector<double> logit(N, -INFINITY);
      double top = -INFINITY;
      for (std::size_t j = 0; j < N; ++j) {
        const std::int64_t p = positions[j];
        const bool covered = p < std::min(sinks, prefix) || (p >= prefix && p <= n0 + static_cast<std::int64_t>(i));
        if (!covered) continue;
        double dot = 0.0;
        for (std::size_t x = 0; x < keys[j].size(); ++x) dot += group_head[i][x] * keys[j][x];
        logit[j] = dot / std::sqrt(d);
        top = std::max(top, logit[j]);
      }
      double sum = 0.0;
      for (double& l : logit) sum += l = std::exp(l - top);
      for (std::size_t j = 0; j < N; ++j)
        if (positions[j] >= prefix && positions[j] < n0) score[j] = std::max(score[j], logit[j] / sum);
    }
  return score;
}

}  // namespace

TEST_CASE("oracle: KVzip's selection evicts floor(N r) prompt entries, lowest first, sinks last, ties in flat order") {
  std::mt19937_64 rng(2025);
  std::int64_t ties = 0, sinks_evicted = 0;
  for (int trial = 0; trial < random_trials(3000); ++trial) {
    const int heads = 1 + static_cast<int>(rng() % 6);
    const std::int64_t n0 = 1 + static_cast<std::int64_t>(rng() % 12), probe = 1 + static_cast<std::int64_t>(rng() % 4);
    const std::int64_t S = static_cast<std::int64_t>(rng() % 4);
    const double ratio = std::uniform_real_distribution<double>(0.0, 0.999)(rng);
    std::vector<std::vector<std::pair<std::int32_t, double>>> entries(static_cast<std::size_t>(heads));
    std::vector<float> score;
    std::vector<std::int32_t> position;
    std::vector<std::int64_t> offsets{0};
    for (auto& head : entries) {
      std::vector<std::int32_t> held;  // some prompt positions already gone, the probe's all present
      for (std::int32_t p = 0; p < n0 + probe; ++p)
        if (p >= n0 || rng() % 5 != 0) held.push_back(p);
      std::shuffle(held.begin(), held.end(), rng);  // storage order is not position order after compaction
      for (const std::int32_t p : held) {
        const auto s = static_cast<float>(rng() % 4);  // few values: ties everywhere
        head.emplace_back(p, s);
        score.push_back(s);
        position.push_back(p);
      }
      offsets.push_back(static_cast<std::int64_t>(score.size()));
    }
    StepContext c{n0 + probe, n0, false};
    c.probe = probe;
    std::vector<std::uint8_t> keep(score.size(), 1);
    KVzipEvictor{ratio, S}.select(CacheShape{1, heads, heads, 4}, c, SegmentedScores{score, position, offsets}, keep);
    const auto want = oracle_evicted(entries, n0, ratio, S);
    std::set<std::pair<std::int64_t, std::int32_t>> got;
    for (int h = 0; h < heads; ++h)
      for (std::int64_t at = offsets[static_cast<std::size_t>(h)]; at < offsets[static_cast<std::size_t>(h) + 1]; ++at)
        if (!keep[static_cast<std::size_t>(at)]) got.insert({h, position[static_cast<std::size_t>(at)]});
    REQUIRE(got == want);
    for (const auto& [h, p] : got) sinks_evicted += p < S;
    ties += !want.empty();
  }
  CHECK(ties > 100);
  CHECK(sinks_evicted > 0);  // a ratio near 1 reaches the sinks, last
}

TEST_CASE("oracle: KVzip's score is the probe's largest attention over the sinks, the scored prompt and the probe") {
  std::mt19937_64 rng(77);
  std::normal_distribution<double> normal(0.0, 1.0);
  double worst = 0.0;
  for (int trial = 0; trial < random_trials(1500); ++trial) {
    const int G = 1 + static_cast<int>(rng() % 3), H = 1 + static_cast<int>(rng() % 2), d = 1 + static_cast<int>(rng() % 6);
    const int layer = static_cast<int>(rng() % 2), kv_head = static_cast<int>(rng() % static_cast<std::uint64_t>(H));
    const std::int64_t n0 = 1 + static_cast<std::int64_t>(rng() % 20), Q = 1 + static_cast<std::int64_t>(rng() % 9);
    const std::int64_t S = static_cast<std::int64_t>(rng() % 5), P = static_cast<std::int64_t>(rng() % 8);
    const CacheShape shape{2, H, H * G, d};
    const KVzipScorer scorer{S, P};
    auto r = scorer.open_record(shape, -1);
    scorer.open_probe(r, n0);
    std::vector<std::vector<float>> layer_queries(2);
    for (int l = 0; l < 2; ++l) {
      auto& q = layer_queries[static_cast<std::size_t>(l)];
      q.resize(static_cast<std::size_t>(H * G * Q * d));
      for (float& x : q) x = static_cast<float>(normal(rng) * 2.0);
      scorer.record_queries(r, l, View<const float, 3>{q.data(), {H * G, Q, d}}, n0);
    }
    // the head's entries: some prompt positions gone, the probe's present, in shuffled storage order
    std::vector<std::int32_t> held;
    for (std::int32_t p = 0; p < n0 + Q; ++p)
      if (p >= n0 || rng() % 4 != 0) held.push_back(p);
    std::shuffle(held.begin(), held.end(), rng);
    std::vector<EntryMeta> meta;
    std::vector<float> keys;
    std::vector<std::vector<double>> keys_d;
    for (const std::int32_t p : held) {
      meta.push_back(EntryMeta{p, 0.0f});
      std::vector<double> k(static_cast<std::size_t>(d));
      for (double& x : k) {
        x = static_cast<double>(static_cast<float>(normal(rng) * 2.0));
        keys.push_back(static_cast<float>(x));
      }
      keys_d.push_back(k);
    }
    const auto N = static_cast<std::int64_t>(held.size());
    std::vector<float> out(held.size(), -1.0f);
    StepContext c{n0 + Q, n0, false};
    c.probe = Q;
    scorer.score_recorded(r, HeadEntries{meta, View<const float, 2>{keys.data(), {N, d}}, {}, layer, kv_head, G}, c, out);
    std::vector<std::vector<std::vector<double>>> group(static_cast<std::size_t>(G));
    const auto& q = layer_queries[static_cast<std::size_t>(layer)];
    for (int g = 0; g < G; ++g)
      for (std::int64_t i = 0; i < Q; ++i) {
        const float* row = &q[static_cast<std::size_t>(((kv_head * G + g) * Q + i) * d)];
        group[static_cast<std::size_t>(g)].emplace_back(row, row + d);
      }
    const auto want = oracle_scores(held, keys_d, group, n0, S, P);
    for (std::size_t j = 0; j < held.size(); ++j) {
      const double diff = std::abs(out[j] - want[j]);
      worst = std::max(worst, diff);
      INFO("trial ", trial, " position ", held[j], " n0 ", n0, " S ", S, " P ", P);
      REQUIRE(diff <= 1e-5 * std::max(1.0, want[j]));
      if (held[j] < P || held[j] >= n0) REQUIRE(out[j] == 0.0f);
    }
  }
  MESSAGE("largest difference from the double oracle: ", worst);
}

TEST_CASE("oracle: a KVzip Cache keeps after its probe what the score and selection oracles keep, and n stays") {
  std::mt19937_64 rng(4096);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int compared = 0, near_ties = 0;
  for (int trial = 0; trial < random_trials(300); ++trial) {
    const int L = 1 + trial % 3, H = 1 + (trial / 3) % 2, G = 1 + (trial / 6) % 2, d = 2 + trial % 3;
    const CacheShape shape{L, H, H * G, d};
    const std::int64_t n0 = 4 + static_cast<std::int64_t>(rng() % 24), Q = 1 + static_cast<std::int64_t>(rng() % 10);
    const std::int64_t S = static_cast<std::int64_t>(rng() % 5), P = rng() % 3 == 0 ? static_cast<std::int64_t>(rng() % 6) : 0;
    const double ratio = std::uniform_real_distribution<double>(0.0, 0.95)(rng);
    const auto v = registry::values<policies::kvzip>(
        {{"ratio", std::to_string(ratio)}, {"sinks", std::to_string(S)}, {"prefix", std::to_string(P)}});
    const KVzipConfig config = registry::read<KVzipConfig>(v, policies::kvzip::fields);
    KVzipCache<> cache(shape, memory::Paged<16>(4096), kvzip_evictor(config), kvzip_scorer(config));
    cache.add_sequence(0);
    const auto draw = [&] { return normal(rng) * 1.5f; };
    // the prompt in chunks, one step each: nothing leaves before the probe
    std::vector<Step> prompt;
    for (std::int64_t done = 0; done < n0;) {
      const std::int64_t T = std::min<std::int64_t>(n0 - done, 1 + static_cast<std::int64_t>(rng() % 9));
      prompt.emplace_back(shape, T, draw);
      REQUIRE(cache.step(prompt.back().view(shape, 0)).evicted == 0);
      done += T;
    }
    Step probe(shape, Q, draw);
    cache.open_probe(0);
    CHECK(cache.probing(0));
    std::vector<EvictedEntry> evicted;
    const EvictionReport report = cache.step(probe.view(shape, 0), &evicted);
    CHECK(report.triggered);
    CHECK_FALSE(cache.probing(0));
    REQUIRE(cache.tokens(0) == n0);
    const auto prompt_entries = static_cast<std::int64_t>(L) * H * n0;
    const auto leave = static_cast<std::int64_t>(static_cast<double>(prompt_entries) * config.ratio);
    REQUIRE(report.evicted == leave + static_cast<std::int64_t>(L) * H * Q);  // the probe's own entries leave too
    REQUIRE(cache.total_length(0) == prompt_entries - leave);

    // the oracle: each head's scores in double, from the steps' keys and the probe's queries
    std::vector<std::vector<std::pair<std::int32_t, double>>> heads;
    bool near_tie = false;
    std::vector<double> all;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        std::vector<std::int32_t> positions;
        std::vector<std::vector<double>> keys;
        std::int64_t at = 0;
        for (const Step& s : prompt) {
          const std::int64_t T = static_cast<std::int64_t>(s.lb.size()) / (L * H);
          for (std::int64_t t = 0; t < T; ++t) {
            positions.push_back(static_cast<std::int32_t>(at + t));
            std::vector<double> k(static_cast<std::size_t>(d));
            for (int x = 0; x < d; ++x) k[static_cast<std::size_t>(x)] = s.key(shape, l, h, t, x, T);
            keys.push_back(k);
          }
          at += T;
        }
        for (std::int64_t t = 0; t < Q; ++t) {
          positions.push_back(static_cast<std::int32_t>(n0 + t));
          std::vector<double> k(static_cast<std::size_t>(d));
          for (int x = 0; x < d; ++x) k[static_cast<std::size_t>(x)] = probe.key(shape, l, h, t, x, Q);
          keys.push_back(k);
        }
        std::vector<std::vector<std::vector<double>>> group(static_cast<std::size_t>(G));
        for (int g = 0; g < G; ++g)
          for (std::int64_t i = 0; i < Q; ++i) {
            std::vector<double> q(static_cast<std::size_t>(d));
            for (int x = 0; x < d; ++x) q[static_cast<std::size_t>(x)] = probe.query(shape, l, h * G + g, i, x, Q);
            group[static_cast<std::size_t>(g)].push_back(q);
          }
        const auto score = oracle_scores(positions, keys, group, n0, S, P);
        auto& head = heads.emplace_back();
        for (std::size_t j = 0; j < positions.size(); ++j) {
          head.emplace_back(positions[j], score[j]);
          if (positions[j] < n0 && positions[j] >= S) all.push_back(score[j]);
        }
      }
    // a boundary the float scores could order either way (within 1e-5) is not compared
    std::sort(all.begin(), all.end());
    const auto boundary = static_cast<std::size_t>(leave);
    if (boundary > 0 && boundary < all.size()) {
      const double a = all[boundary - 1], b = all[boundary];
      near_tie = b - a <= 1e-5 * std::max(1.0, b);
    }
    if (near_tie) {
      ++near_ties;
      continue;
    }
    const auto want = oracle_evicted(heads, n0, config.ratio, S);
    std::set<std::pair<std::int64_t, std::int32_t>> got;
    for (const EvictedEntry& e : evicted)
      if (e.position < n0) got.insert({std::int64_t{e.layer} * H + e.head, e.position});
    INFO("trial ", trial, " n0 ", n0, " Q ", Q, " S ", S, " P ", P, " ratio ", ratio);
    REQUIRE(got == want);
    // the head contents agree with the list: every prompt entry not evicted is there, no probe entry is
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        std::set<std::int32_t> held;
        for (const EntryMeta& m : cache.head_contents(0, l, h).meta) held.insert(m.position);
        for (std::int32_t p = 0; p < n0 + Q; ++p)
          REQUIRE(held.count(p) == (p < n0 && !want.count({std::int64_t{l} * H + h, p}) ? 1u : 0u));
      }
    // decode after the probe: positions from n0 on, nothing evicted
    for (int t = 0; t < 3; ++t) {
      Step decode(shape, 1, draw);
      REQUIRE(cache.step(decode.view(shape, 0)).evicted == 0);
      REQUIRE(cache.entry(0, 0, 0, cache.length(0, 0, 0) - 1).position == n0 + t);
    }
    ++compared;
  }
  MESSAGE(compared, " trials compared, ", near_ties, " skipped at a near-tie");
  CHECK(compared >= random_trials(300) * 9 / 10);
}

TEST_CASE("a probe whose step() throws (a user Scorer's NaN at its commit) is still opened, and nothing changed") {
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto draw = [&] { return normal(rng); };
  const CacheShape shape{2, 2, 4, 4};
  Cache<testing::NaNScorer, admit::All, KVzipEvictor, memory::Paged<16>, cpu_backend> cache(
      shape, memory::Paged<16>(256), KVzipEvictor{0.5, 1});
  cache.add_sequence(0);
  Step prompt(shape, 6, draw), probe(shape, 3, draw);
  prompt.lb[5] = -0.125f;  // one prompt entry the scorer answers NaN for
  cache.step(prompt.view(shape, 0));
  cache.open_probe(0);
  CHECK_THROWS_WITH(cache.step(probe.view(shape, 0)), doctest::Contains("NaN"));
  CHECK(cache.probing(0));  // as before the call
  CHECK(cache.tokens(0) == 6);
  CHECK(cache.total_length(0) == 2 * 2 * 6);
  CHECK_THROWS_WITH(cache.step_batch(std::vector<SequenceStep>{probe.view(shape, 0)}), doctest::Contains("NaN"));
  CHECK(cache.probing(0));
  CHECK(cache.total_length(0) == 2 * 2 * 6);
}
