// The probe step (Cache::open_probe, SPEC §10) under policies whose Evictor does not evict at a
// probe: its entries leave at its commit, what its attention recorded is taken back, n stays, and
// the cache is as the probe found it; a probe is aborted as any step. (KVzip, whose Evictor does
// evict there: tests/policies/test_kvzip.cpp.)
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policies/h2o.hpp"
#include "kvpolicy/policies/streamingllm.hpp"
#include "random_step.hpp"

using namespace kvpolicy;
using kvpolicy::test::Step;

TEST_CASE("a probe step leaves a cache whose Evictor does not evict at probes as it found it") {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto draw = [&] { return normal(rng); };
  const CacheShape shape{2, 2, 4, 4};
  SUBCASE("StreamingLLM: the probe would pass its budget; nothing leaves, n stays") {
    StreamingLLMCache<> cache(shape, memory::Paged<16>(256), baseline_evictor({.budget = 8, .buffer = 1, .sinks = 2}));
    cache.add_sequence(0);
    Step prompt(shape, 8, draw), probe(shape, 6, draw), next(shape, 1, draw);
    cache.step(prompt.view(shape, 0));
    const auto before = cache.head_contents(0, 1, 1);
    cache.open_probe(0);
    const EvictionReport r = cache.step(probe.view(shape, 0));
    CHECK_FALSE(r.triggered);
    CHECK(r.evicted == 2 * 2 * 6);  // only the probe's own entries
    CHECK(cache.tokens(0) == 8);
    const auto after = cache.head_contents(0, 1, 1);
    REQUIRE(after.meta.size() == before.meta.size());
    CHECK(after.keys == before.keys);
    cache.step(next.view(shape, 0));  // the next step is ordinary, at position 8
    CHECK(cache.tokens(0) == 9);
  }
  SUBCASE("H2O: the mass the probe's attention added is taken back") {
    H2OCache<> cache(shape, memory::Paged<16>(256), h2o_evictor({.budget = 64}));
    cache.add_sequence(0);
    Step prompt(shape, 7, draw), probe(shape, 5, draw);
    cache.step(prompt.view(shape, 0));
    std::vector<float> mass;
    for (const EntryMeta& m : cache.head_contents(0, 0, 1).meta) mass.push_back(m.attention_mass);
    cache.open_probe(0);
    cache.step(probe.view(shape, 0));
    std::vector<float> after;
    for (const EntryMeta& m : cache.head_contents(0, 0, 1).meta) after.push_back(m.attention_mass);
    CHECK(after == mass);
  }
  SUBCASE("an aborted probe is taken back, and open_probe refuses an open step") {
    H2OCache<> cache(shape, memory::Paged<16>(256), h2o_evictor({.budget = 4}));
    cache.add_sequence(0);
    Step prompt(shape, 6, draw), probe(shape, 3, draw);
    cache.step(prompt.view(shape, 0));
    cache.open_probe(0);
    const auto s = probe.view(shape, 0);
    for (int l = 0; l < shape.layers; ++l)
      cache.append(0, l, detail::layer_of(s.keys, l), detail::layer_of(s.values, l), detail::layer_of(s.log_beta, l));
    CHECK_THROWS_WITH(cache.open_probe(0), doctest::Contains("has an open step"));
    cache.abort_step(0);
    CHECK_FALSE(cache.probing(0));
    CHECK(cache.total_length(0) == 2 * 2 * 6);
    CHECK_THROWS_WITH(cache.open_probe(7), doctest::Contains("unknown sequence 7"));
  }
}
