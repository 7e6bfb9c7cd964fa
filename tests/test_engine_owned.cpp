// A cache over K/V the engine owns (storage engine_owned, SPEC §9): for every registered policy the
// registry says runs so (registry::over_engine_storage), a metadata-only cache keeps, evicts and
// reports exactly what the owning cache does on the same steps (random chunks, tie-prone scores,
// both modes, by step(), append() and commit(), and step_batch(); the paged and the contiguous
// allocators), values left empty; a policy that reads keys or the attention over them reads the
// engine's (fp32 or fp16, as the owning cache stores them) and is shown the engine's queries, with
// H2O's mass equal bit for bit; every other policy is refused at construction with a message; every
// policy's Scorer is one it declares (registry::scorers); the runs an engine frees; a step without
// the engine's keys, or with one missing, is refused and changes nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "engine_store.hpp"
#include "oracle.hpp"
#include "same_entries.hpp"
#include "kvpolicy/open.hpp"
#include "kvpolicy/registry.hpp"
#include "kvpolicy/trimkv.hpp"

using namespace kvpolicy;
using kvpolicy::testing::entries;
using kvpolicy::testing::same;
using kvpolicy::testing::EngineStore;

namespace {

template <class S, class... L>
constexpr bool declared(registry::scorers<L...>) {
  return (std::is_same_v<S, L> || ...);
}

const CacheShape kShape{3, 2, 4, 8};

std::vector<float> masses(const std::vector<EntryMeta>& e) {
  std::vector<float> m;
  for (const EntryMeta& x : e) m.push_back(x.attention_mass);
  return m;
}

// The same random steps through an owning cache (K/V stored as KeyT) and an engine-owned one of P,
// each step by step() (way 0), by append() per layer then attend()/observe() and commit() (way 1)
// or by step_batch() (way 2, which lists no evicted entries); a policy that reads keys reads them
// from an engine that keeps them as KeyT. Returns how many entries the engine-owned one evicted.
template <registry::Policy P, class KeyT>
std::int64_t run_both(const registry::Values& v, std::mt19937_64& rng, int way) {
  const std::int64_t pages = memory::Paged<16>::pages_for(kShape, 400);
  std::int64_t evicted_total = 0;
  EngineStore<KeyT> engine{kShape};
  P::template make<cpu_backend>(v, kShape, memory::Paged<16, KeyT>(pages), [&](auto& owning) {
    P::template make<cpu_backend>(v, kShape, memory::Paged<16, engine_owned>(pages), [&](auto& owned) {
      using C = std::decay_t<decltype(owned)>;
      static_assert(!C::stores_kv);
      if constexpr (C::reads_engine_keys) owned.use_engine_keys(engine.keys());
      const std::int64_t prompt = std::uniform_int_distribution<std::int64_t>(1, 30)(rng);
      owning.add_sequence(0, prompt);
      owned.add_sequence(0, prompt);
      const std::int64_t H = kShape.kv_heads, d = kShape.head_dim, L = kShape.layers, Hq = kShape.q_heads;
      std::normal_distribution<float> normal;
      for (std::int64_t n = 0, steps = 0; n < 160; ++steps) {
        // a policy whose inputs are a reconstruction (KVzip, SPEC §10) takes a probe after the prompt
        const bool probing = inputs::probes_v<typename P::inputs> && steps == 1;
        if constexpr (C::takes_probes)
          if (probing) {
            owning.open_probe(0);
            owned.open_probe(0);
          }
        const std::int64_t T = n == 0 ? prompt : std::uniform_int_distribution<std::int64_t>(1, probing ? 9 : 3)(rng);
        std::vector<float> k(static_cast<std::size_t>(L * H * T * d)), val(k.size()), lb(static_cast<std::size_t>(L * H * T)),
            g(lb.size()), q(static_cast<std::size_t>(L * Hq * T * d)), o(q.size());
        for (float& x : k) x = normal(rng);
        for (float& x : val) x = normal(rng);
        for (float& x : q) x = normal(rng);
        for (float& x : lb) x = oracle::tie_prone_log_beta(rng);
        for (float& x : g) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
        std::vector<EvictedEntry> e_owning, e_owned;
        const View<const float, 4> keys(k.data(), {L, H, T, d});
        engine.write(keys, n);  // the step's keys (a probe's too) before the policy decides
        const View<const float, 3> log_beta(lb.data(), {L, H, T}), gate(g.data(), {L, H, T});
        const View<const float, 4> queries = C::observes_attention ? View<const float, 4>(q.data(), {L, Hq, T, d}) : View<const float, 4>{};
        const View<float, 4> out = C::observes_attention ? View<float, 4>(o.data(), {L, Hq, T, d}) : View<float, 4>{};
        const SequenceStep s1{0, keys, View<const float, 4>(val.data(), {L, H, T, d}), log_beta, queries, out, gate};
        const SequenceStep s2{0, keys, {}, log_beta, queries, {}, gate};  // no values; the queries, no out
        EvictionReport r1, r2;
        if (way == 0) {
          r1 = owning.step(s1, &e_owning);
          r2 = owned.step(s2, &e_owned);
        } else if (way == 1) {
          for (int l = 0; l < L; ++l) {
            const auto at = static_cast<std::size_t>(l * H * T);
            owning.append(0, l, View<const float, 3>(k.data() + at * d, {H, T, d}),
                          View<const float, 3>(val.data() + at * d, {H, T, d}), View<const float, 2>(lb.data() + at, {H, T}),
                          View<const float, 2>(g.data() + at, {H, T}));
            owned.append(0, l, View<const float, 3>(k.data() + at * d, {H, T, d}), {},
                         View<const float, 2>(lb.data() + at, {H, T}), View<const float, 2>(g.data() + at, {H, T}));
            if constexpr (C::observes_attention) {
              const auto qa = static_cast<std::size_t>(l * Hq * T * d);
              owning.attend(0, l, View<const float, 3>(q.data() + qa, {Hq, T, d}), View<float, 3>(o.data() + qa, {Hq, T, d}));
              owned.observe(0, l, View<const float, 3>(q.data() + qa, {Hq, T, d}));
            }
          }
          r1 = owning.commit(0, &e_owning);
          r2 = owned.commit(0, &e_owned);
        } else {
          r1 = owning.step_batch(std::span<const SequenceStep>(&s1, 1)).front();
          r2 = owned.step_batch(std::span<const SequenceStep>(&s2, 1)).front();
        }
        REQUIRE(r1.triggered == r2.triggered);
        REQUIRE(r1.evicted == r2.evicted);
        REQUIRE(same(e_owning, e_owned));
        REQUIRE(same(entries(owning), entries(owned)));
        REQUIRE(masses(entries(owning)) == masses(entries(owned)));  // H2O's mass, bit for bit
        evicted_total += r2.evicted;
        if (!probing) n += T;
      }
      CHECK(owned.head_contents(0, 0, 0).keys.empty());
      // the engine attends itself: a step that brings an out is refused, and changes nothing
      const std::int64_t T = 1;
      std::vector<float> k(static_cast<std::size_t>(L * H * T * d), 0.5f), lb(static_cast<std::size_t>(L * H * T), 0.0f),
          q(static_cast<std::size_t>(L * Hq * T * d), 0.5f), o(q.size());
      const auto before = entries(owned);
      CHECK_THROWS_WITH_AS(owned.step(SequenceStep{0, View<const float, 4>(k.data(), {L, H, T, d}), {},
                                                   View<const float, 3>(lb.data(), {L, H, T}),
                                                   View<const float, 4>(q.data(), {L, Hq, T, d}),
                                                   View<float, 4>(o.data(), {L, Hq, T, d})}),
                           doctest::Contains("the engine attends itself"), Error);
      CHECK(same(before, entries(owned)));
      CHECK(owned.head_contents(0, 0, 0).meta.size() == static_cast<std::size_t>(owned.length(0, 0, 0)));
    });
  });
  return evicted_total;
}

}  // namespace

TEST_CASE("engine-owned K/V: each policy that runs over it keeps and evicts what the owning cache does, and the rest are refused") {
  std::mt19937_64 rng(2026);
  int over = 0, refused = 0;
  registry::for_each([&]<registry::Policy P>() {
    CAPTURE(std::string(P::name));
    std::vector<std::string> modes{""};
    if (registry::takes(P::name, "mode")) modes.push_back("union");
    for (const std::string& mode : modes) {
      registry::Selection sel{std::string(P::name), {}};
      sel.offer("budget", 12).offer("buffer", 4).offer("window", 2).offer("sinks", 1).offer("recency", 3);
      if (!mode.empty()) sel.set("mode", mode);
      if (sel.policy == "wgkv") sel.set("local", "6");
      const registry::Values v = registry::values<P>(sel.given);
      // the Scorer it builds is one it declares
      bool reads = false;
      P::template make<cpu_backend>(v, kShape, memory::Paged<16>(8), [&](auto& c) {
        using S = typename std::decay_t<decltype(c)>::scorer_type;
        CHECK(declared<S>(typename P::scorers{}));
        reads = std::decay_t<decltype(c)>::reads_stored_kv;
      });
      if (reads) CHECK(registry::reads_stored_kv<P>());
      if constexpr (registry::over_engine_storage<P>()) {
        std::int64_t evicted = 0;
        for (int round = 0; round < 12; ++round)  // the owning cache stores fp32 or fp16 keys, the engine the same type
          evicted += round % 2 == 0 ? run_both<P, float>(v, rng, round % 3) : run_both<P, half>(v, rng, round % 3);
        // the budget binds (the comparison covers evictions), but for the full cache
        if (sel.policy != "full") CHECK(evicted > 0);
        ++over;
      } else if (sel.policy == "expected-attention") {
        CHECK_THROWS_WITH_AS(P::template make<cpu_backend>(v, kShape, memory::Paged<16, engine_owned>(8), [](auto&) {}),
                             doctest::Contains("reads the values of stored entries"), Error);
        ++refused;
      } else {  // WG-KV's: a ring that masks the attention (SPEC §9)
        CHECK_THROWS_WITH_AS(P::template make<cpu_backend>(v, kShape, memory::Paged<16, engine_owned>(8), [](auto&) {}),
                             doctest::Contains("masks the attention"), Error);
        ++refused;
      }
    }
  });
  // the retention policies, the metadata-only baselines and the key and attention readers run over
  // it; a reader of stored values and WG-KV's masking ring do not
  for (const char* name : {"trimkv", "dbtrimkv", "streamingllm", "knorm", "random", "full", "epikv", "hs-var", "tova",
                           "h2o", "keydiff", "snapkv", "adakv", "pyramidkv"})
    CHECK_MESSAGE(registry::over_engine_storage(name), name);
  for (const char* name : {"expected-attention", "wgkv"}) CHECK_MESSAGE(!registry::over_engine_storage(name), name);
  for (const char* name : {"tova", "h2o", "keydiff", "snapkv"}) CHECK_MESSAGE(registry::reads_stored_kv(name), name);
  CHECK(over > 0);
  CHECK(refused > 0);
}

TEST_CASE("engine-owned K/V: a policy that reads keys needs the engine's, and a key the engine lacks changes nothing") {
  const std::int64_t H = kShape.kv_heads, d = kShape.head_dim, L = kShape.layers, Hq = kShape.q_heads;
  for (const char* name : {"h2o", "tova", "keydiff"}) {
    CAPTURE(name);
    registry::Selection sel{name, {}};
    sel.set("budget", "6").set("buffer", "1").set("sinks", "1").set("window", "1");
    std::unique_ptr<AnyCache> cache = registry::open_cache<engine_owned>(sel, kShape, 16);
    REQUIRE(cache->reads_stored_kv());
    REQUIRE(!cache->stores_kv());
    cache->add_sequence(0);
    EngineStore<half> engine{kShape};
    std::mt19937_64 rng(11);
    std::normal_distribution<float> normal;
    std::vector<float> k(static_cast<std::size_t>(L * H * d)), lb(static_cast<std::size_t>(L * H), 0.0f),
        q(static_cast<std::size_t>(Hq * d));
    // one token at position n, every layer appended (and observed, where the policy ranks by attention)
    const auto append = [&](std::int64_t n) {
      for (float& x : k) x = normal(rng);
      for (float& x : q) x = normal(rng);
      engine.write(View<const float, 4>(k.data(), {L, H, 1, d}), n);
      for (int l = 0; l < L; ++l)
        cache->append(0, l, View<const float, 3>(k.data() + l * H * d, {H, 1, d}), {},
                      View<const float, 2>(lb.data() + l * H, {H, 1}));
    };
    const auto observe = [&](int l) { cache->observe(0, l, View<const float, 3>(q.data(), {Hq, 1, d})); };
    // without the engine's keys the first append is refused, and nothing is stored
    CHECK_THROWS_WITH_AS(append(0), doctest::Contains("Cache::use_engine_keys"), Error);
    CHECK(cache->total_length(0) == 0);
    CHECK_THROWS_WITH_AS(cache->use_engine_keys(EngineKeys{KeyType::float16, {}}), doctest::Contains("row() is empty"), Error);
    cache->use_engine_keys(engine.keys());
    std::int64_t evicted = 0;
    for (std::int64_t n = 0; n < 12; ++n) {
      append(n);
      if (cache->observes_attention())
        for (int l = 0; l < L; ++l) observe(l);
      evicted += cache->commit(0).evicted;
    }
    CHECK(evicted > 0);
    CHECK_THROWS_WITH_AS(cache->observe(0, 0, View<const float, 3>(q.data(), {Hq, 1, d})),
                         doctest::Contains(cache->observes_attention() ? "has not been appended" : "does not rank by attention"), Error);
    // the engine has lost the sink's key (position 0, never evicted): the call that reads it throws
    // and the cache is as it was; the step stays open until it is taken back
    const auto before = entries(*cache);
    engine.held[engine.at(0, 0, 0)] = 0;
    append(12);
    if (cache->observes_attention()) {
      if (std::string(name) == "h2o") {  // the mass reads the keys at observe; nothing is added
        const auto appended = entries(*cache);
        CHECK_THROWS_WITH_AS(observe(0), doctest::Contains("holds no key for sequence 0 layer 0 kv head 0 position 0"), Error);
        CHECK(masses(appended) == masses(entries(*cache)));
      }
      for (int l = std::string(name) == "h2o" ? 1 : 0; l < L; ++l) observe(l);
      if (std::string(name) == "h2o") {  // layer 0 was not observed: the commit is refused
        CHECK_THROWS_WITH_AS(cache->commit(0), doctest::Contains("attend"), Error);
        cache->abort_step(0);
        CHECK(same(before, entries(*cache)));
        CHECK(masses(before) == masses(entries(*cache)));
        continue;
      }
    }
    CHECK_THROWS_WITH_AS(cache->commit(0), doctest::Contains("holds no key for sequence 0 layer 0 kv head 0 position 0"), Error);
    CHECK(same(before, entries(*cache)) == false);  // the step's entries are still there, open
    cache->abort_step(0);
    CHECK(same(before, entries(*cache)));
    // the key back, the same step commits
    engine.held[engine.at(0, 0, 0)] = 1;
    append(12);
    if (cache->observes_attention())
      for (int l = 0; l < L; ++l) observe(l);
    CHECK(cache->commit(0).evicted > 0);
  }
}

template <class C>
constexpr bool can_attend = requires(C& c, View<const float, 3> q, View<float, 3> o) { c.attend(0, 0, q, o); };

TEST_CASE("engine-owned K/V: the pool holds metadata only, and a Cache over it has no attend()") {
  using Owned = TrimKVCache<cpu_backend, engine_owned>;
  static_assert(!Owned::stores_kv);
  static_assert(!can_attend<Owned>);
  static_assert(can_attend<TrimKVCache<>>);
  const CacheShape shape{30, 3, 9, 64};
  const std::int64_t pages = memory::Paged<16>::pages_for(shape, 160);
  // each slot's metadata (20 bytes) and the free list, against 2 x 64 F16 values of K/V per slot
  CHECK(sizeof(EntryMeta) == 20);
  CHECK(memory::Paged<16, engine_owned>::bytes_for(shape, pages) ==
        pages * 16 * static_cast<std::int64_t>(sizeof(EntryMeta)) + pages * 4);
  CHECK(memory::Paged<16, engine_owned>::bytes_for(shape, pages) * 10 < memory::Paged<16, half>::bytes_for(shape, pages));
}

TEST_CASE("engine-owned K/V: the contiguous allocator keeps what its owning twin keeps") {
  using Owning = Cache<score::RetentionDecay, admit::All, evict::PerHead<trigger::Buffered>, memory::Contiguous<float>, cpu_backend>;
  using Owned = Cache<score::RetentionDecay, admit::All, evict::PerHead<trigger::Buffered>, memory::Contiguous<engine_owned>, cpu_backend>;
  const auto evictor = trimkv_evictor({.budget = 10, .buffer = 3, .sinks = 1});
  Owning owning(kShape, memory::Contiguous<float>(40, 1), evictor);
  Owned owned(kShape, memory::Contiguous<engine_owned>(40, 1), evictor);
  owning.add_sequence(0);
  owned.add_sequence(0);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  const std::int64_t H = kShape.kv_heads, d = kShape.head_dim, L = kShape.layers;
  std::int64_t evicted = 0;
  for (std::int64_t n = 0; n < 120;) {
    const std::int64_t T = n == 0 ? 20 : 1;
    std::vector<float> k(static_cast<std::size_t>(L * H * T * d)), val(k.size()), lb(static_cast<std::size_t>(L * H * T));
    for (float& x : k) x = normal(rng);
    for (float& x : val) x = normal(rng);
    for (float& x : lb) x = oracle::tie_prone_log_beta(rng);
    std::vector<EvictedEntry> e1, e2;
    owning.step(SequenceStep{0, View<const float, 4>(k.data(), {L, H, T, d}), View<const float, 4>(val.data(), {L, H, T, d}),
                             View<const float, 3>(lb.data(), {L, H, T})},
                &e1);
    evicted += owned.step(SequenceStep{0, View<const float, 4>(k.data(), {L, H, T, d}), {}, View<const float, 3>(lb.data(), {L, H, T})},
                          &e2).evicted;
    REQUIRE(same(e1, e2));
    REQUIRE(same(entries(owning), entries(owned)));
    n += T;
  }
  CHECK(evicted > 0);
}

TEST_CASE("position runs: a commit's evictions as the runs an engine frees") {
  const std::vector<EvictedEntry> e{{0, 1, 7}, {0, 0, 3}, {0, 0, 4}, {1, 0, 4}, {0, 0, 9}, {0, 1, 8}, {0, 0, 5}};
  const std::vector<PositionRun> heads{{0, 0, 3, 6}, {0, 0, 9, 10}, {0, 1, 7, 9}, {1, 0, 4, 5}};
  CHECK(head_runs(e) == heads);
  const std::vector<PositionRun> tokens{{-1, -1, 3, 6}, {-1, -1, 7, 10}};
  CHECK(token_runs(e) == tokens);
  CHECK(token_runs({}).empty());
}
