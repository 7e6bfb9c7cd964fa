// Composition (issue: any Admitter with any Evictor): WG-KV's write-time admission (admit::WriteGate,
// SPEC §3) with TRIM-KV's per-head and DBTrimKV's global retention eviction (SPEC §1–2). A hand case;
// random streams against a model that applies the ring and then the brute-force oracle; equality
// with WG-KV's own cache when nothing else evicts; attention with the vertical-slash mask; errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/trimkv.hpp"
#include "kvpolicy/wgkv.hpp"
#include "oracle.hpp"

using namespace kvpolicy;

namespace {

template <class C>
std::vector<EntryMeta> survivors(const C& cache, std::int64_t seq, int l, int h) {
  std::vector<EntryMeta> out;
  for (std::int64_t i = 0; i < cache.length(seq, l, h); ++i) out.push_back(cache.entry(seq, l, h, i));
  std::sort(out.begin(), out.end(), [](const EntryMeta& a, const EntryMeta& b) { return a.position < b.position; });
  return out;
}

/// SPEC §3 ring, after n tokens: an entry with g < tau stays only while it is among the `local`
/// newest tokens of the sequence (position >= n - local).
void ring(oracle::Heads& heads, std::int64_t n, std::int64_t local, double tau) {
  for (auto& head : heads) {
    std::vector<EntryMeta> kept;
    for (const auto& e : head)
      if (e.position >= n - local || e.gate >= static_cast<float>(tau)) kept.push_back(e);
    head = kept;
  }
}

struct Stream {
  std::vector<float> k, v, lb, g;
};

Stream random_tokens(std::mt19937_64& rng, const CacheShape& s, std::int64_t T, double admit_share) {
  Stream t;
  std::normal_distribution<float> normal;
  t.k.resize(static_cast<std::size_t>(s.kv_heads * T * s.head_dim));
  t.v.resize(t.k.size());
  for (auto& x : t.k) x = normal(rng);
  for (auto& x : t.v) x = normal(rng);
  for (std::int64_t i = 0; i < s.kv_heads * T; ++i) {
    t.lb.push_back(oracle::tie_prone_log_beta(rng));
    const bool admitted = std::bernoulli_distribution(admit_share)(rng);
    t.g.push_back(admitted ? std::uniform_real_distribution<float>(0.1f, 1.0f)(rng)
                           : std::uniform_real_distribution<float>(0.001f, 0.0999f)(rng));
  }
  return t;
}

}  // namespace

TEST_CASE("WG-KV admission + TRIM-KV: a hand case") {
  const CacheShape shape{1, 1, 1, 2};
  WGKVRetentionCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(16), trimkv_evictor({.budget = 3, .buffer = 1}), {},
                             wgkv_admitter({.local = 2, .tau = 0.5}));
  cache.add_sequence(0);
  // position:          0     1     2     3     4     5
  const float g[] = {0.9f, 0.1f, 0.2f, 0.8f, 0.05f, 0.6f};
  const float lb[] = {-0.1f, 0.0f, 0.0f, -2.0f, 0.0f, -0.5f};
  const std::vector<std::vector<std::int32_t>> want = {{0}, {0, 1}, {0, 1, 2}, {0, 2, 3}, {0, 3, 4}, {0, 4, 5}};
  for (int n = 0; n < 6; ++n) {
    const float kv[2] = {1.0f, static_cast<float>(n)};
    cache.append(0, 0, View<const float, 3>(kv, {1, 1, 2}), View<const float, 3>(kv, {1, 1, 2}),
                 View<const float, 2>(&lb[n], {1, 1}), View<const float, 2>(&g[n], {1, 1}));
    cache.commit(0);
    std::vector<std::int32_t> got;
    for (const auto& e : survivors(cache, 0, 0, 0)) got.push_back(e.position);
    INFO("after position ", n);
    CHECK(got == want[static_cast<std::size_t>(n)]);
  }
  // after position 3: the ring {2, 3} pushes out 1 (g = 0.1 < 0.5); 4 entries would be M + B = 4,
  // but 3 stay. After 4: ring {3, 4}: 2 leaves (g = 0.2); 0 is admitted. After 5 (n = 6): ring
  // {4, 5}; 3 (g = 0.8) is admitted, and with 0, 3, 4, 5 = M + B the TRIM-KV budget keeps the top 3
  // by log_beta * (n + 1 - p): 0: -0.1 * 7 = -0.7, 3: -2 * 4 = -8, 4: 0, 5: -0.5 * 2 = -1 -> 3 goes.
  //
  // One 2-token step, positions 6 (g = 0.05, log_beta 0) and 7 (g = 0.9, log_beta 0): the ring
  // {6, 7} drops 4 (g = 0.05), leaving 0, 5, 6, 7 = M + B; at n = 8: 0: -0.9, 5: -0.5 * 3 = -1.5,
  // 6: 0, 7: 0 -> 5 goes. Both departures are reported, and only the Evictor's trigger as one.
  const float g2[] = {0.05f, 0.9f}, lb2[] = {0.0f, 0.0f}, kv2[4] = {1.0f, 6.0f, 1.0f, 7.0f};
  cache.append(0, 0, View<const float, 3>(kv2, {1, 2, 2}), View<const float, 3>(kv2, {1, 2, 2}),
               View<const float, 2>(lb2, {1, 2}), View<const float, 2>(g2, {1, 2}));
  std::vector<EvictedEntry> evicted;
  const EvictionReport report = cache.commit(0, &evicted);
  CHECK(report.triggered);
  CHECK(report.evicted == 2);
  std::vector<std::int32_t> gone, got;
  for (const auto& e : evicted) gone.push_back(e.position);
  std::sort(gone.begin(), gone.end());
  CHECK(gone == std::vector<std::int32_t>{4, 5});
  for (const auto& e : survivors(cache, 0, 0, 0)) got.push_back(e.position);
  CHECK(got == std::vector<std::int32_t>{0, 6, 7});
}

TEST_CASE("the ring counts tokens, not stored entries: what the Evictor removed keeps nothing alive") {
  // W = 2, tau = 0.5, TRIM-KV M = 1, B = 1: after position 1 the Evictor keeps 0 (0 > -2); after
  // position 2 the stored entries are {0, 2} — two, but 0 is no longer among the 2 newest tokens
  // and was never admitted (g = 0.1), so it leaves: no later query could see it.
  const CacheShape shape{1, 1, 1, 2};
  WGKVRetentionCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(16), trimkv_evictor({.budget = 1, .buffer = 1}),
                                                  {}, wgkv_admitter({.local = 2, .tau = 0.5}));
  cache.add_sequence(0);
  const float g[] = {0.1f, 0.9f, 0.9f}, lb[] = {0.0f, -1.0f, -1.0f};
  const std::vector<std::vector<std::int32_t>> want = {{0}, {0}, {2}};
  for (int n = 0; n < 3; ++n) {
    const float kv[2] = {1.0f, static_cast<float>(n)};
    cache.append(0, 0, View<const float, 3>(kv, {1, 1, 2}), View<const float, 3>(kv, {1, 1, 2}),
                 View<const float, 2>(&lb[n], {1, 1}), View<const float, 2>(&g[n], {1, 1}));
    cache.commit(0);
    std::vector<std::int32_t> got;
    for (const auto& e : survivors(cache, 0, 0, 0)) got.push_back(e.position);
    INFO("after position ", n);
    CHECK(got == want[static_cast<std::size_t>(n)]);
  }
}

TEST_CASE("step() carries the gate, and abort_step takes the gated entries back") {
  const CacheShape s{2, 1, 2, 2};
  WGKVRetentionCache<cpu_backend, float, 4> cache(s, memory::Paged<4>(64), trimkv_evictor({.budget = 4, .buffer = 1}),
                                                  {}, wgkv_admitter({.local = 1, .tau = 0.5}));
  cache.add_sequence(0);
  std::vector<float> kv(2 * 1 * 3 * 2, 1.0f), lb(2 * 3, -0.1f), g{0.9f, 0.1f, 0.2f, 0.1f, 0.9f, 0.3f};
  decltype(cache)::SequenceStep step{0, View<const float, 4>(kv.data(), {2, 1, 3, 2}),
                                     View<const float, 4>(kv.data(), {2, 1, 3, 2}),
                                     View<const float, 3>(lb.data(), {2, 1, 3})};
  CHECK_THROWS_WITH(cache.step(step), doctest::Contains("step: SequenceStep::gate [L, Hkv, T]"));
  step.gate = View<const float, 3>(g.data(), {2, 1, 3});
  const EvictionReport r = cache.step(step);
  CHECK(!r.triggered);
  CHECK(r.evicted == 2);  // layer 0 drops position 1, layer 1 drops position 0 (ring of 1: position 2 stays)
  std::vector<std::int32_t> l0, l1;
  for (const auto& e : survivors(cache, 0, 0, 0)) l0.push_back(e.position);
  for (const auto& e : survivors(cache, 0, 1, 0)) l1.push_back(e.position);
  CHECK(l0 == std::vector<std::int32_t>{0, 2});
  CHECK(l1 == std::vector<std::int32_t>{1, 2});
  CHECK(survivors(cache, 0, 1, 0)[0].gate == 0.9f);  // position 1 keeps its g
  // an appended step taken back leaves no gated entry behind
  const float one_kv[2] = {1.0f, 1.0f}, one_lb = -0.1f, one_g = 0.05f;
  cache.append(0, 0, View<const float, 3>(one_kv, {1, 1, 2}), View<const float, 3>(one_kv, {1, 1, 2}),
               View<const float, 2>(&one_lb, {1, 1}), View<const float, 2>(&one_g, {1, 1}));
  cache.abort_step(0);
  CHECK(cache.length(0, 0, 0) == 2);
  const float nan_g = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(cache.append(0, 0, View<const float, 3>(one_kv, {1, 1, 2}), View<const float, 3>(one_kv, {1, 1, 2}),
                                 View<const float, 2>(&one_lb, {1, 1}), View<const float, 2>(&nan_g, {1, 1})),
                    doctest::Contains("is not in [0, 1]"));
}

TEST_CASE("WG-KV admission + retention eviction against the ring-then-oracle model") {
  for (std::uint64_t seed = 1; seed <= 400; ++seed) {
    std::mt19937_64 rng(seed);
    const CacheShape shape{std::uniform_int_distribution<int>(1, 3)(rng), std::uniform_int_distribution<int>(1, 3)(rng),
                           0, 4};
    CacheShape s = shape;
    s.q_heads = s.kv_heads * 2;
    const std::int64_t local = std::uniform_int_distribution<std::int64_t>(1, 12)(rng);
    const double tau = 0.1;
    oracle::Params p;
    p.budget = std::uniform_int_distribution<std::int64_t>(1, 16)(rng);
    p.buffer = std::uniform_int_distribution<std::int64_t>(1, 5)(rng);
    p.window = std::uniform_int_distribution<std::int64_t>(0, p.budget)(rng);
    const bool global = seed % 2 == 0;
    const double admit_share = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const std::int64_t pages = 4096;
    Cache<score::RetentionDecay, admit::WriteGate, evict::PerHead<trigger::Buffered>, memory::Paged<4>, cpu_backend>
        per_head(s, memory::Paged<4>(pages), trimkv_evictor({.budget = p.budget, .buffer = p.buffer, .window = p.window}), {},
                 admit::WriteGate{local, tau});
    Cache<score::RetentionDecay, admit::WriteGate, evict::Global, memory::Paged<4>, cpu_backend> pooled(
        s, memory::Paged<4>(pages), evict::Global{p.budget, p.buffer, 0.0, p.window, 0.0}, {},
        admit::WriteGate{local, tau});
    per_head.add_sequence(0);
    pooled.add_sequence(0);
    oracle::Heads model(static_cast<std::size_t>(s.heads_total()));
    std::int64_t n = 0;
    for (int step = 0; step < 60; ++step) {
      const std::int64_t T = step == 0 ? std::uniform_int_distribution<std::int64_t>(1, 30)(rng)
                                       : (step % 17 == 0 ? 5 : 1);
      for (int l = 0; l < s.layers; ++l) {
        const Stream t = random_tokens(rng, s, T, admit_share);
        const View<const float, 3> k(t.k.data(), {s.kv_heads, T, s.head_dim}), v(t.v.data(), {s.kv_heads, T, s.head_dim});
        const View<const float, 2> lb(t.lb.data(), {s.kv_heads, T}), g(t.g.data(), {s.kv_heads, T});
        if (global)
          pooled.append(0, l, k, v, lb, g);
        else
          per_head.append(0, l, k, v, lb, g);
        for (int h = 0; h < s.kv_heads; ++h)
          for (std::int64_t i = 0; i < T; ++i) {
            EntryMeta m{static_cast<std::int32_t>(n + i), lb(h, i), 0.0f, 0.0f, g(h, i)};
            model[static_cast<std::size_t>(head_index(s, l, h))].push_back(m);
          }
      }
      n += T;
      if (global)
        pooled.commit(0);
      else
        per_head.commit(0);
      ring(model, n, local, tau);
      if (global)
        oracle::global(s, model, n, score::RetentionDecay{}, p);
      else
        oracle::per_head(s, model, n, score::RetentionDecay{}, p);
      for (int l = 0; l < s.layers; ++l)
        for (int h = 0; h < s.kv_heads; ++h) {
          auto want = model[static_cast<std::size_t>(head_index(s, l, h))];
          std::sort(want.begin(), want.end(),
                    [](const EntryMeta& a, const EntryMeta& b) { return a.position < b.position; });
          const auto got = global ? survivors(pooled, 0, l, h) : survivors(per_head, 0, l, h);
          REQUIRE_MESSAGE(got.size() == want.size(), "seed ", seed, " step ", step, " layer ", l, " head ", h);
          for (std::size_t i = 0; i < got.size(); ++i) {
            REQUIRE_MESSAGE(got[i].position == want[i].position, "seed ", seed, " step ", step);
            REQUIRE(got[i].gate == want[i].gate);
          }
          if (!global) CHECK(static_cast<std::int64_t>(got.size()) <= p.budget + p.buffer - 1);
        }
      if (global) {
        std::int64_t total = 0;
        for (auto& head : model) total += static_cast<std::int64_t>(head.size());
        CHECK(total <= s.heads_total() * (p.budget + p.buffer) - 1);
      }
    }
  }
}

TEST_CASE("with a budget it never reaches, the composition keeps what WG-KV's own cache keeps") {
  std::mt19937_64 rng(42);
  const CacheShape s{2, 2, 4, 8};
  const WGKVConfig c{.local = 6, .tau = 0.1};
  WGKVCache<cpu_backend, float, 4> own(s, memory::Paged<4>(4096), wgkv_evictor(c));
  WGKVRetentionCache<cpu_backend, float, 4> composed(s, memory::Paged<4>(4096), trimkv_evictor({.budget = 100000, .buffer = 1}), {},
                                wgkv_admitter(c));
  own.add_sequence(0);
  composed.add_sequence(0);
  std::normal_distribution<float> normal;
  for (int step = 0; step < 50; ++step) {
    const std::int64_t T = step == 0 ? 17 : (step % 9 == 0 ? 4 : 1);  // prefill longer than W_local, chunks
    for (int l = 0; l < s.layers; ++l) {
      const Stream t = random_tokens(rng, s, T, 0.3);
      std::vector<float> q(static_cast<std::size_t>(s.q_heads * T * s.head_dim)), out_own(q.size()), out_comp(q.size());
      for (auto& x : q) x = normal(rng);
      const View<const float, 3> k(t.k.data(), {s.kv_heads, T, s.head_dim}), v(t.v.data(), {s.kv_heads, T, s.head_dim});
      const View<const float, 2> g(t.g.data(), {s.kv_heads, T}), lb(t.lb.data(), {s.kv_heads, T});
      own.append(0, l, k, v, g);  // WG-KV's own cache: g is the frozen score
      composed.append(0, l, k, v, lb, g);
      const View<const float, 3> qv(q.data(), {s.q_heads, T, s.head_dim});
      own.attend(0, l, qv, View<float, 3>(out_own.data(), {s.q_heads, T, s.head_dim}));
      composed.attend(0, l, qv, View<float, 3>(out_comp.data(), {s.q_heads, T, s.head_dim}));
      REQUIRE(out_own == out_comp);  // the same vertical-slash mask over the same entries
    }
    own.commit(0);
    composed.commit(0);
    for (int l = 0; l < s.layers; ++l)
      for (int h = 0; h < s.kv_heads; ++h) {
        const auto a = survivors(own, 0, l, h), b = survivors(composed, 0, l, h);
        REQUIRE(a.size() == b.size());
        for (std::size_t i = 0; i < a.size(); ++i) {
          REQUIRE(a[i].position == b[i].position);
          REQUIRE(a[i].write_score == b[i].gate);  // g: the frozen score there, the gate here
        }
      }
  }
}

TEST_CASE("admit::WriteGate needs the gate, in [0, 1], and a refused append changes nothing") {
  const CacheShape s{1, 1, 1, 2};
  WGKVRetentionCache<cpu_backend, float, 4> cache(s, memory::Paged<4>(16), trimkv_evictor(), {}, wgkv_admitter());
  cache.add_sequence(0);
  const float kv[2] = {1.0f, 2.0f}, lb = -0.5f, bad = 1.5f;
  const View<const float, 3> k(kv, {1, 1, 2});
  CHECK_THROWS_WITH(cache.append(0, 0, k, k, View<const float, 2>(&lb, {1, 1})),
                    doctest::Contains("this Admitter decides by the write gate g; append needs gate [Hkv, T]"));
  CHECK_THROWS_WITH(cache.append(0, 0, k, k, View<const float, 2>(&lb, {1, 1}), View<const float, 2>(&bad, {1, 1})),
                    doctest::Contains("gate[layer 0, head 0, token 0 of the step (position 0)] = 1.5 is not in [0, 1]"));
  CHECK(cache.length(0, 0, 0) == 0);
  CHECK_THROWS_WITH((WGKVRetentionCache<cpu_backend, float, 4>(s, memory::Paged<4>(16), trimkv_evictor(), {}, wgkv_admitter({.local = 0}))),
                    doctest::Contains("admit::WriteGate: W_local = 0"));
}
