// The run-time door (kvpolicy/open.hpp, open_sharded.hpp): for every registered policy, in both modes,
// the Cache registry::open_cache builds from a name keeps, evicts and reports exactly what the
// policy's own P::make builds on the same random steps (tie-prone scores, queries where the policy
// reads the attention), over K/V it stores and, where the registry allows, over K/V the engine
// owns; AnyCache reports the Cache's capabilities; a refused name, option, storage or call is an
// error that names it; one rank's open_sharded_cache is the unsharded Cache.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine_store.hpp"
#include "gate_layouts.hpp"
#include "oracle.hpp"
#include "same_entries.hpp"
#include "kvpolicy/gate/load.hpp"
#include "kvpolicy/gate/safetensors.hpp"
#include "kvpolicy/open_sharded.hpp"
#include "kvpolicy/open.hpp"

using namespace kvpolicy;
using kvpolicy::testing::entries;
using kvpolicy::testing::same;

namespace {

const CacheShape kShape{2, 2, 4, 8};

// The same random steps through `direct` (P::make's Cache) and `door` (AnyCache); returns the
// entries the door evicted. Queries go with every step of a cache that stores its K/V, and of one
// over engine-owned K/V whose policy ranks by attention (observed, no out); a policy that reads keys
// over engine-owned K/V reads them from a test engine (both caches, the same). With `probe` (a
// policy whose inputs are a reconstruction, SPEC §10) the step after the prompt is a probe.
template <class C>
std::int64_t run_both(C& direct, AnyCache& door, std::mt19937_64& rng, bool probe = false) {
  const std::int64_t H = kShape.kv_heads, Hq = kShape.q_heads, d = kShape.head_dim, L = kShape.layers;
  testing::EngineStore<float> engine{kShape};
  if constexpr (C::reads_engine_keys) {
    direct.use_engine_keys(engine.keys());
    door.use_engine_keys(engine.keys());
  }
  const std::int64_t prompt = std::uniform_int_distribution<std::int64_t>(1, 24)(rng);
  direct.add_sequence(0, prompt);
  door.add_sequence(0, prompt);
  std::normal_distribution<float> normal;
  std::int64_t evicted = 0;
  for (std::int64_t n = 0, steps = 0; n < 120; ++steps) {
    const bool probing = probe && steps == 1;
    if (probing) {
      if constexpr (C::takes_probes) direct.open_probe(0);
      door.open_probe(0);
    }
    const std::int64_t T = n == 0 ? prompt : std::uniform_int_distribution<std::int64_t>(1, probing ? 9 : 3)(rng);
    std::vector<float> k(static_cast<std::size_t>(L * H * T * d)), val(k.size()), q(static_cast<std::size_t>(L * Hq * T * d)),
        o1(q.size()), o2(q.size()), lb(static_cast<std::size_t>(L * H * T)), g(lb.size());
    for (float& x : k) x = normal(rng);
    for (float& x : val) x = normal(rng);
    for (float& x : q) x = normal(rng);
    for (float& x : lb) x = oracle::tie_prone_log_beta(rng);
    for (float& x : g) x = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    const View<const float, 4> keys(k.data(), {L, H, T, d}), values(val.data(), {L, H, T, d});
    const View<const float, 3> log_beta(lb.data(), {L, H, T}), gate(g.data(), {L, H, T});
    engine.write(keys, n);  // a probe's too: the engine holds them until the probe's commit frees them
    const bool attends = C::stores_kv;
    const View<const float, 4> queries = attends || C::observes_attention ? View<const float, 4>(q.data(), {L, Hq, T, d})
                                                                         : View<const float, 4>{};
    std::vector<EvictedEntry> e1, e2;
    const EvictionReport r1 = direct.step({0, keys, values, log_beta, queries,
                                           attends ? View<float, 4>(o1.data(), {L, Hq, T, d}) : View<float, 4>{}, gate},
                                          &e1);
    const EvictionReport r2 = door.step({0, keys, values, log_beta, queries,
                                         attends ? View<float, 4>(o2.data(), {L, Hq, T, d}) : View<float, 4>{}, gate},
                                        &e2);
    REQUIRE(r1.triggered == r2.triggered);
    REQUIRE(r1.evicted == r2.evicted);
    REQUIRE(same(e1, e2));
    REQUIRE(same(entries(direct), entries(door)));
    REQUIRE(o1 == o2);
    evicted += r2.evicted;
    if (!probing) n += T;
    REQUIRE(door.tokens(0) == n);
  }
  CHECK(door.tokens(0) == direct.tokens(0));
  CHECK(door.total_length(0) == direct.total_length(0));
  return evicted;
}

// A communicator that says it has four ranks (rank_shape reads its size alone).
struct FourRanks : dist::Local {
  int size() const { return 4; }
};

registry::Selection selection_for(std::string_view name, const std::string& mode) {
  registry::Selection sel{std::string(name), {}};
  sel.offer("budget", 10).offer("buffer", 3).offer("window", 2).offer("sinks", 1).offer("recency", 3);
  if (!mode.empty()) sel.set("mode", mode);
  if (sel.policy == "wgkv") sel.set("local", "6");
  return sel;
}

}  // namespace

TEST_CASE("registry::open_cache: every policy by name keeps and evicts what its own make builds, over stored and engine-owned K/V") {
  std::mt19937_64 rng(73);
  const std::int64_t pages = memory::Paged<16>::pages_for(kShape, 200);
  registry::for_each([&]<registry::Policy P>() {
    CAPTURE(std::string(P::name));
    std::vector<std::string> modes{""};
    if (registry::takes(P::name, "mode")) modes.push_back("union");
    for (const std::string& mode : modes) {
      CAPTURE(mode);
      const registry::Selection sel = selection_for(P::name, mode);
      const registry::Values v = registry::values<P>(sel.given);
      std::int64_t evicted = 0;
      for (int round = 0; round < 4; ++round) {
        P::template make<cpu_backend>(v, kShape, memory::Paged<16>(pages), [&](auto& direct) {
          using C = std::decay_t<decltype(direct)>;
          const std::unique_ptr<AnyCache> door = registry::open_cache<float>(sel, kShape, pages);
          CHECK(door->stores_kv());
          CHECK(door->observes_attention() == C::observes_attention);
          CHECK(door->reads_stored_kv() == C::reads_stored_kv);
          if constexpr (requires { direct.evictor().window; }) CHECK(door->protected_window() == direct.evictor().window);
          else CHECK(door->protected_window() == 0);
          CHECK(door->pages_total() == direct.pages_total());
          CHECK(door->pool_bytes() == memory::Paged<16>::bytes_for(kShape, pages));
          evicted += run_both(direct, *door, rng, inputs::probes_v<typename P::inputs>);
        });
        if constexpr (registry::over_engine_storage<P>()) {
          P::template make<cpu_backend>(v, kShape, memory::Paged<16, engine_owned>(pages), [&](auto& direct) {
            const std::unique_ptr<AnyCache> door = registry::open_cache<engine_owned>(sel, kShape, pages);
            CHECK(!door->stores_kv());
            CHECK(door->pool_bytes() == memory::Paged<16, engine_owned>::bytes_for(kShape, pages));
            evicted += run_both(direct, *door, rng, inputs::probes_v<typename P::inputs>);
          });
        }
      }
      if (sel.policy != "full") CHECK(evicted > 0);  // the budget binds: the comparison covers evictions
    }
  });
}

TEST_CASE("registry::open_cache: a refused name, option, value or storage is an error that names it") {
  const std::int64_t pages = 8;
  CHECK_THROWS_WITH_AS(registry::open_cache({"no-such-policy", {}}, kShape, pages),
                       doctest::Contains("unknown policy 'no-such-policy' (known: "), Error);
  CHECK_THROWS_WITH_AS(registry::open_cache(registry::Selection{"streamingllm", {}}.set("gate", "g.safetensors"), kShape,
                                            pages),
                       doctest::Contains("--gate does not apply to policy streamingllm"), Error);
  CHECK_THROWS_WITH_AS(registry::open_cache(registry::Selection{"streamingllm", {}}.set("budget", "0"), kShape, pages),
                       doctest::Contains("budget"), Error);
  CHECK_THROWS_WITH_AS(registry::open_cache<engine_owned>({"expected-attention", {}}, kShape, pages),
                       doctest::Contains("policy expected-attention reads the values of stored entries"), Error);
  CHECK_THROWS_WITH_AS(registry::open_cache<engine_owned>({"wgkv", {}}, kShape, pages),
                       doctest::Contains("policy wgkv masks the attention or drops tokens at write time"), Error);
  for (const char* name : {"trimkv", "streamingllm", "knorm", "tova", "h2o", "keydiff", "snapkv"})
    CHECK_NOTHROW(registry::open_cache<engine_owned>({name, {}}, kShape, pages));
  // with_kv_storage: the type a run-time choice names
  const auto named = [](KvStorage kv) {
    return with_kv_storage(kv, []<class T>(std::type_identity<T>) { return std::string(dtype_name<T>()); });
  };
  CHECK(named(KvStorage::float32) == dtype_name<float>());
  CHECK(named(KvStorage::float16) == dtype_name<half>());
  CHECK(named(KvStorage::bfloat16) == dtype_name<bfloat16>());
  CHECK(named(KvStorage::engine_owned) == dtype_name<engine_owned>());
}

TEST_CASE("AnyCache: a call the wrapped Cache does not have is refused, naming why") {
  const std::int64_t pages = 8;
  const auto owned = registry::open_cache<engine_owned>({"streamingllm", {}}, kShape, pages);
  owned->add_sequence(0);
  std::vector<float> k(static_cast<std::size_t>(kShape.kv_heads * kShape.head_dim), 1.0f), lb(2, 0.0f),
      q(static_cast<std::size_t>(kShape.q_heads * kShape.head_dim), 1.0f), o(q.size());
  owned->append(0, 0, View<const float, 3>(k.data(), {kShape.kv_heads, 1, kShape.head_dim}), {},
                View<const float, 2>(lb.data(), {kShape.kv_heads, 1}));
  CHECK_THROWS_WITH_AS(owned->attend(0, 0, View<const float, 3>(q.data(), {kShape.q_heads, 1, kShape.head_dim}),
                                     View<float, 3>(o.data(), {kShape.q_heads, 1, kShape.head_dim})),
                       doctest::Contains("keeps no K/V (engine-owned, SPEC §9)"), Error);
  CHECK_THROWS_WITH_AS(owned->observe(0, 0, View<const float, 3>(q.data(), {kShape.q_heads, 1, kShape.head_dim})),
                       doctest::Contains("does not rank by attention"), Error);
  CHECK_THROWS_WITH_AS(owned->use_engine_keys(testing::EngineStore<float>{kShape}.keys()),
                       doctest::Contains("reads its entries' metadata alone"), Error);
  const auto stores = registry::open_cache<float>({"tova", {}}, kShape, pages);
  CHECK_THROWS_WITH_AS(stores->use_engine_keys(testing::EngineStore<float>{kShape}.keys()),
                       doctest::Contains("keeps its own K/V"), Error);
  stores->add_sequence(0);
  stores->append(0, 0, View<const float, 3>(k.data(), {kShape.kv_heads, 1, kShape.head_dim}),
                 View<const float, 3>(k.data(), {kShape.kv_heads, 1, kShape.head_dim}), View<const float, 2>(lb.data(), {kShape.kv_heads, 1}));
  CHECK_THROWS_WITH_AS(stores->observe(0, 0, View<const float, 3>(q.data(), {kShape.q_heads, 1, kShape.head_dim})),
                       doctest::Contains("attend() over it"), Error);
  CHECK(!owned->takes_step_scores());
  CHECK_THROWS_WITH_AS(owned->set_step_scores(0, 0, View<const float, 2>(lb.data(), {kShape.kv_heads, 1})),
                       doctest::Contains("takes no frozen scores"), Error);
  CHECK(registry::open_cache({"epikv", {}}, kShape, pages)->takes_step_scores());
}

TEST_CASE("registry::open: the Cache and the producer of its inputs for the model") {
  const inputs::ModelShape model{kShape, 16, 0};
  const registry::Opened streaming = registry::open({"streamingllm", {}}, model, 8);
  CHECK(streaming.cache->shape().layers == kShape.layers);
  CHECK(!streaming.inputs.needs().per_layer());
  CHECK(!streaming.inputs.needs().per_token());
  // EpiKV's default bands (10, 21) index a deeper model's hidden states: 22 of them
  const registry::Opened epikv = registry::open<engine_owned>({"epikv", {}}, {kShape, 16, 22}, 8);
  CHECK(!epikv.cache->stores_kv());
  CHECK(epikv.inputs.needs().per_token());
  const registry::Opened kv = registry::open({"kv-key", {}}, model, 8);
  CHECK(kv.inputs.needs().per_layer());
  CHECK_THROWS_WITH_AS(registry::open({"epikv", {}}, model, 8), doctest::Contains("--band-a 10 and --band-b 21"), Error);
  CHECK_THROWS_WITH_AS(registry::open({"trimkv", {}}, model, 8), doctest::Contains("gate"), Error);
}

TEST_CASE("registry: every gated policy runs its source's example gate, whose level orders its scores") {
  // registry::example_gate (the file the tests give every gated policy): the producer reads what its
  // needs() list, writes one score per (kv head, token), finite, and a high level scores at least as
  // high as a low one on every entry (the example's contract: high keeps, low drops; a source whose
  // file has no bias, Q-Filters', scores the same at every level)
  const inputs::ModelShape model{kShape, 24, 0};
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t T = 5, H = kShape.kv_heads, d = kShape.head_dim;
  std::vector<float> x(static_cast<std::size_t>(T * model.hidden)), k(static_cast<std::size_t>(H * T * d)), k_pre(k.size()),
      v(k.size());
  for (auto* buf : {&x, &k, &k_pre, &v})
    for (float& e : *buf) e = normal(rng);
  int gated = 0, ordered = 0;
  for (const auto name : registry::names()) {
    const registry::InputSource source = registry::input_source(name);
    if (!source.gated) {
      CHECK_THROWS_WITH_AS(registry::example_gate(name, "unused.safetensors", model, 0.0f), doctest::Contains("reads no gate file"),
                           Error);
      continue;
    }
    CAPTURE(name);
    ++gated;
    std::vector<std::vector<float>> scores;
    for (const float level : {-30.0f, 30.0f}) {
      const std::string path = (std::filesystem::temp_directory_path() / ("kvpolicy-example-" + std::string(name) + ".safetensors")).string();
      registry::example_gate(name, path, model, level);
      const registry::Selection sel{std::string(name), {{"gate", path}}};
      const inputs::Producer p = registry::open_inputs(sel, model);
      const inputs::Needs& n = p.needs();
      CHECK(n.per_layer());
      inputs::LayerActivations a;
      if (n.normed_input) a.normed_input = View<const float, 2>(x.data(), {T, model.hidden});
      if (n.keys_pre_rope) a.keys_pre_rope = View<const float, 3>(k_pre.data(), {H, T, d});
      if (n.keys) a.keys = View<const float, 3>(k.data(), {H, T, d});
      if (n.values) a.values = View<const float, 3>(v.data(), {H, T, d});
      std::vector<float> out(static_cast<std::size_t>(H * T));
      for (int l = 0; l < kShape.layers; ++l) p.layer(0, l, a, View<float, 2>(out.data(), {H, T}));
      for (float e : out) REQUIRE(std::isfinite(e));
      scores.push_back(out);
      std::filesystem::remove(path);
    }
    bool strictly = true;
    for (std::size_t i = 0; i < scores[0].size(); ++i) {
      REQUIRE(scores[0][i] <= scores[1][i]);
      strictly = strictly && scores[0][i] < scores[1][i];
    }
    ordered += strictly;
  }
  CHECK(gated >= 4);
  CHECK(ordered >= 4);  // TRIM-KV's, DBTrimKV's and WG-KV's gates, KVzap's surrogate: a bias per head
}

namespace {
// OUT holds PER_HEAD's gate per head and TOKEN_LEVEL's at the token level.
void write_both_layouts(const std::string& per_head, const std::string& token_level, const std::string& out) {
  testing::both_layouts(safetensors::File::read(per_head), safetensors::File::read(token_level)).write(out);
}

// Every layer's log_beta [L][Hkv][T] that `policy` computes from `file` in `mode` on the normed inputs x [T, D].
struct GateScores {
  inputs::ModelShape model{kShape, 24, 0};
  static constexpr std::int64_t T = 3;
  std::vector<float> x;
  explicit GateScores(std::uint64_t seed) : x(static_cast<std::size_t>(T * model.hidden)) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& e : x) e = normal(rng);
  }
  std::vector<float> operator()(const char* policy, const std::string& file, const char* mode) const {
    const std::int64_t H = kShape.kv_heads;
    const inputs::Producer p = registry::open_inputs({policy, {{"gate", file}, {"mode", mode}}}, model);
    inputs::LayerActivations a;
    a.normed_input = View<const float, 2>(x.data(), {T, model.hidden});
    std::vector<float> out(static_cast<std::size_t>(H * T * kShape.layers));
    for (int l = 0; l < kShape.layers; ++l) p.layer(0, l, a, View<float, 2>(out.data() + l * H * T, {H, T}));
    return out;
  }
};
}  // namespace

TEST_CASE("registry: in the token-level mode a retention policy reads the file's token-level gate where it holds one") {
  // SPEC §8, "Gate for the layout": a file may hold a second gate under names prefixed token_level.;
  // --mode union reads it, --mode per-head the plain names; a file without one serves both modes
  const GateScores scores(5);
  const auto dir = std::filesystem::temp_directory_path();
  for (const char* name : {"trimkv", "dbtrimkv"}) {
    CAPTURE(name);
    const auto path = [&](const std::string& what) { return (dir / ("kvpolicy-" + std::string(name) + "-" + what + ".safetensors")).string(); };
    registry::example_gate(name, path("low"), scores.model, -30.0f);
    registry::example_gate(name, path("high"), scores.model, 30.0f);
    write_both_layouts(path("low"), path("high"), path("both"));  // the low gate per head, the high one token level
    const auto low = scores(name, path("low"), "per-head"), high = scores(name, path("high"), "per-head");
    REQUIRE(low != high);
    CHECK(scores(name, path("both"), "per-head") == low);
    CHECK(scores(name, path("both"), "union") == high);
    CHECK(scores(name, path("low"), "union") == low);  // no token-level gate: the per-head one in both modes
    CHECK(gate::holds_token_level_gate(safetensors::File::read(path("both"))));
    CHECK_FALSE(gate::holds_token_level_gate(safetensors::File::read(path("low"))));
    for (const char* what : {"low", "high", "both"}) std::filesystem::remove(path(what));
  }
}

TEST_CASE("registry: DBTrimKV's token-level gate may be TRIM-KV's kind, its per-head gate may not") {
  // SPEC §8, "Gate for the layout": in the token-level mode both policies rank positions by the max over
  // every layer's heads, so the gate trained for that selection may be rg; DBTrimKV's per-head global
  // ranking reads tied gates only (SPEC §2)
  const GateScores scores(6);
  const auto dir = std::filesystem::temp_directory_path();
  const auto path = [&](const std::string& what) { return (dir / ("kvpolicy-mixed-" + what + ".safetensors")).string(); };
  registry::example_gate("dbtrimkv", path("tied"), scores.model, -30.0f);
  registry::example_gate("trimkv", path("rg"), scores.model, 30.0f);
  write_both_layouts(path("tied"), path("rg"), path("both"));
  CHECK(scores("dbtrimkv", path("both"), "union") == scores("trimkv", path("rg"), "union"));
  CHECK(scores("dbtrimkv", path("both"), "per-head") == scores("dbtrimkv", path("tied"), "per-head"));
  CHECK_THROWS_AS(scores("dbtrimkv", path("rg"), "per-head"), Error);  // rg under the plain names: no tied gate
  for (const char* what : {"tied", "rg", "both"}) std::filesystem::remove(path(what));
}

TEST_CASE("registry::open_sharded_cache: one rank's Cache is the unsharded Cache, and the ranks must divide the heads") {
  std::mt19937_64 rng(7);
  const std::int64_t pages = memory::Paged<16>::pages_for(kShape, 200);
  dist::Local one;
  for (const char* name : {"trimkv", "dbtrimkv", "h2o", "streamingllm"}) {
    CAPTURE(name);
    const registry::Selection sel = selection_for(name, "");
    registry::visit(name, [&]<registry::Policy P>() {
      P::template make<cpu_backend>(registry::values<P>(sel.given), kShape, memory::Paged<16>(pages), [&](auto& direct) {
        const std::unique_ptr<AnyCache> rank = registry::open_sharded_cache(sel, kShape, pages, one);
        CHECK(run_both(direct, *rank, rng) > 0);
      });
    });
  }
  CHECK_THROWS_WITH_AS(registry::rank_shape(kShape, FourRanks{}), doctest::Contains("4 ranks must divide the 2 kv heads"),
                       Error);
}
