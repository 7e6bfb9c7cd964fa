// kvpolicy-replay's engine: evicted_at against the oracle on random traces (with and without a
// prefill chunk), the full cache replaying with zero error, and the trace format's errors.
#include <doctest/doctest.h>

#include <cstdio>
#include <numeric>
#include <unistd.h>
#include <filesystem>
#include <random>
#include <string>
#include <utility>

#include "oracle.hpp"
#include "kvpolicy/gate/load.hpp"
#include "kvpolicy/open.hpp"
#include "replay.hpp"

using namespace kvpolicy;

namespace {

// evicted_at by the oracle: one token per step after an optional prefill chunk.
template <class Scorer, class Step>
std::vector<std::int64_t> oracle_evicted_at(const replay::Trace& tr, std::int64_t prefill, const Scorer& s, Step step,
                                            const oracle::Params& p) {
  const CacheShape shape{tr.layers, tr.kv_heads, tr.kv_heads, 1};
  oracle::Heads heads(static_cast<std::size_t>(shape.heads_total()));
  std::vector<std::int64_t> at(static_cast<std::size_t>(shape.heads_total() * tr.tokens), -1);
  // the step schedule, written out again: one chunk of min(P, T) tokens, then one token per step
  std::vector<std::int64_t> steps;
  if (prefill > 0) steps.push_back(std::min(prefill, tr.tokens));
  while (std::accumulate(steps.begin(), steps.end(), std::int64_t{0}) < tr.tokens) steps.push_back(1);
  std::int64_t n = 0;
  for (auto len : steps) {
    for (int l = 0; l < tr.layers; ++l)
      for (int h = 0; h < tr.kv_heads; ++h)
        for (std::int64_t t = n; t < n + len; ++t)
          heads[static_cast<std::size_t>(l * tr.kv_heads + h)].push_back({static_cast<std::int32_t>(t), tr.lb(l, h, t), 0.0f});
    n += len;
    auto before = heads;
    step(shape, heads, n, s, p);
    for (std::size_t h = 0; h < heads.size(); ++h)
      for (const auto& e : before[h]) {
        bool kept = false;
        for (const auto& k : heads[h]) kept = kept || k.position == e.position;
        if (!kept) at[h * static_cast<std::size_t>(tr.tokens) + static_cast<std::size_t>(e.position)] = n;
      }
  }
  return at;
}

replay::Trace random_trace(std::mt19937_64& rng) {
  replay::Trace tr;
  tr.layers = std::uniform_int_distribution<int>(1, 3)(rng);
  tr.kv_heads = std::uniform_int_distribution<int>(1, 3)(rng);
  tr.tokens = std::uniform_int_distribution<std::int64_t>(1, 120)(rng);
  tr.log_beta.resize(static_cast<std::size_t>(tr.layers * tr.kv_heads * tr.tokens));
  for (auto& x : tr.log_beta) x = oracle::tie_prone_log_beta(rng);
  return tr;
}

}  // namespace

TEST_CASE("replay: evicted_at equals the oracle's for trimkv and dbtrimkv, with and without prefill") {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    const auto tr = random_trace(rng);
    replay::Options o;
    const std::int64_t budget = std::uniform_int_distribution<std::int64_t>(1, 10)(rng);
    const std::int64_t buffer = std::uniform_int_distribution<std::int64_t>(1, 5)(rng);
    o.prefill = trial % 2 ? std::uniform_int_distribution<std::int64_t>(0, 60)(rng) : 0;
    const std::int64_t window = trial % 3 == 0 ? std::uniform_int_distribution<std::int64_t>(0, budget)(rng) : 0;
    const double threshold = trial % 5 == 1 ? 0.3 : 0.0;
    const std::int64_t min_tokens = threshold > 0.0 && trial % 2 == 0 ? 2 : 0;  // the threshold's floor
    o.set("budget", budget).set("buffer", buffer).set("window", window).set("threshold", threshold);
    o.set("min-tokens", min_tokens);
    oracle::Params p{budget, buffer, window, threshold, 0.0};
    p.min_tokens = min_tokens;
    o.policy = "trimkv";
    const auto a = replay::replay(tr, o);
    CHECK(a.evicted_at == oracle_evicted_at(tr, o.prefill, score::RetentionDecay{}, [](auto&&... x) { oracle::per_head(x...); }, p));
    o.policy = "dbtrimkv";
    o.set("horizon", 3);
    p.floor_ratio = threshold == 0.0 && trial % 4 == 2 ? 0.5 : 0.0;
    o.set("floor", p.floor_ratio);
    const auto b = replay::replay(tr, o);
    CHECK(b.evicted_at == oracle_evicted_at(tr, o.prefill, score::Lookahead{3}, [](auto&&... x) { oracle::global(x...); }, p));
    CHECK(b.step_end.back() == tr.tokens);
    CHECK(b.step_end.size() == (o.prefill > 0 ? 1 + tr.tokens - std::min(o.prefill, tr.tokens) : tr.tokens));
  }
}

TEST_CASE("replay: a budget that never fills is the full cache (zero error, nothing evicted)") {
  const auto tr = replay::synthetic_trace(2, 2, 2, 16, 200);
  const auto full = replay::full_attention(tr);
  replay::Options o;
  o.set("budget", 1000);
  o.set("buffer", 1);
  o.prefill = 37;
  const auto r = replay::replay(tr, o, &full);
  CHECK(r.step_end.size() == 1 + 200 - 37);
  for (auto e : r.evicted_at) REQUIRE(e == -1);
  for (auto e : r.attn_rel_error) REQUIRE(e <= 1e-5f);
  o.set("budget", 16);
  o.set("buffer", 4);
  const auto small = replay::replay(tr, o, &full);
  CHECK(small.peak_entries_per_head == 37);  // the prefill chunk, before its eviction
  float worst = 0.0f;
  for (auto e : small.attn_rel_error) worst = std::max(worst, e);
  CHECK(worst > 1e-3f);  // eviction changes the output
  CHECK(std::isfinite(worst));
}

TEST_CASE("trace files: round trip and shape errors") {
  const auto dir = std::filesystem::temp_directory_path() / ("kvpolicy_test_replay_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto tr = replay::synthetic_trace(1, 2, 2, 8, 20);
  const auto path = (dir / "t.safetensors").string();
  replay::write_trace(tr, path);
  const auto back = replay::read_trace(path);
  CHECK(back.log_beta == tr.log_beta);
  CHECK(back.keys == tr.keys);
  CHECK(back.values == tr.values);
  CHECK(back.queries == tr.queries);
  CHECK(back.layers == 1);
  CHECK(back.kv_heads == 2);
  CHECK(back.q_heads == 4);
  CHECK(back.head_dim == 8);
  CHECK(back.tokens == 20);
  CHECK(back.hidden == tr.hidden);
  CHECK(back.hidden_layers == 2);
  CHECK(back.hidden_size == tr.hidden_size);
  CHECK(back.write_gate == tr.write_gate);
  safetensors::Writer w3;
  w3.add_f32("log_beta", {1, 1, 3}, std::vector<float>(3, -0.1f));
  w3.add_f32("hidden_states", {2, 4, 5}, std::vector<float>(40, 0.0f));
  w3.write((dir / "bad3.safetensors").string());
  CHECK_THROWS_WITH_AS(replay::read_trace((dir / "bad3.safetensors").string()), doctest::Contains("hidden_states has shape [2, 4, 5]"),
                       Error);
  safetensors::Writer w;
  w.add_f32("log_beta", {2, 3}, std::vector<float>(6, -0.1f));
  w.write((dir / "bad.safetensors").string());
  CHECK_THROWS_WITH_AS(replay::read_trace((dir / "bad.safetensors").string()), doctest::Contains("expected [L, Hkv, T]"), Error);
  safetensors::Writer w2;
  w2.add_f32("log_beta", {1, 1, 3}, std::vector<float>(3, -0.1f));
  w2.add_f32("keys", {1, 1, 3, 2}, std::vector<float>(6, 0.0f));
  w2.write((dir / "bad2.safetensors").string());
  CHECK_THROWS_WITH_AS(replay::read_trace((dir / "bad2.safetensors").string()), doctest::Contains("come together"), Error);
  // keys of the wrong width are named as such, not blamed on the values read after them
  safetensors::Writer w4;
  w4.add_f32("log_beta", {1, 1, 3}, std::vector<float>(3, -0.1f));
  w4.add_f32("keys", {1, 1, 3, 5}, std::vector<float>(15, 0.0f));
  w4.add_f32("values", {1, 1, 3, 8}, std::vector<float>(24, 0.0f));
  w4.add_f32("queries", {1, 2, 3, 8}, std::vector<float>(48, 0.0f));
  w4.write((dir / "bad4.safetensors").string());
  CHECK_THROWS_WITH_AS(replay::read_trace((dir / "bad4.safetensors").string()),
                       doctest::Contains("disagree on the head width d: keys [1, 1, 3, 5], values [1, 1, 3, 8], queries [1, 2, 3, 8]"),
                       Error);
  std::filesystem::remove_all(dir);
}

// Whether the Evictor the options build states a bound on what a head holds (memory_bound,
// parts/evict/memory_bound.hpp); none where no budget bounds it (WG-KV without one, KVzap's
// threshold, a prompt-only compression): such a policy holds what its scores keep.
bool states_bound(const registry::Selection& o) {
  return registry::visit(o.policy, [&]<registry::Policy Q>() {
    bool bounded = false;
    const CacheShape shape{1, 1, 1, 16};
    Q::template make<cpu_backend>(registry::values<Q>(o.given), shape, memory::Paged<16>(1),
                                  [&](auto& cache) { bounded = evict::memory_bound(cache.evictor(), shape).has_value(); });
    return bounded;
  });
}

TEST_CASE("replay: every policy runs on the synthetic trace within its budget, and evicted_at is consistent") {
  const auto tr = replay::synthetic_trace(2, 2, 2, 16, 300);
  const auto full = replay::full_attention(tr);
  const std::int64_t M = 24, B = 4, P = 40;
  for (const auto name : registry::names()) {
    const std::string policy(name);
    const registry::InputSource source = registry::input_source(policy);
    const bool without_options = registry::visit(policy, []<registry::Policy Q>() { return std::size(Q::options) == 0; });
    if (without_options) continue;  // the full cache: it keeps every token, no budget to check
    CAPTURE(policy);
    replay::Options o;
    o.policy = policy;
    o.prefill = P;
    o.offer("budget", M).offer("buffer", B);
    o.offer("band-a", 2).offer("band-b", 1);  // the synthetic hidden states jump at layer 2
    o.offer("local", 12);  // wgkv's ring
    // KVzap (SPEC §11): the trace's log_beta as its scores, a window of 12 and a threshold between
    // the synthetic heads' values (kind 1 keeps all, kinds 0 and 2 lose what is not a gist)
    const bool thresholded = policy == "kvzap";
    if (thresholded) o.offer("window", 12).offer("tau", -0.02);
    const bool reconstructs = source.probes;  // KVzip: a probe after the prompt
    if (reconstructs) o.probe = 8;
    const auto r = replay::replay(tr, o, &full);
    // EpiKV's family (SPEC §4): a frozen score per token, the prompt protected
    const bool epikv_family = source.name == "hidden_states" || source.name == "key_value_statistic";
    // resident before an eviction: the prefill chunk, then the bound of the policy plus the new token
    // (DBTrimKV's is the pool of the sequence's L x Hkv = 2 x 2 heads)
    const std::int64_t bound = epikv_family                                    ? P + M + 1
                               : source.name == "tied_retention_gate"    ? 2 * 2 * (M + B)
                                                                             : M + B;
    if (policy == "snapkv") {  // the prompt compressed to M once, then every decode token kept
      CHECK(r.peak_entries_per_head == std::max(P, M + tr.tokens - P));
      for (std::int64_t t = 0; t < tr.tokens; ++t)
        REQUIRE((r.evicted_at[static_cast<std::size_t>(t)] == -1 || r.evicted_at[static_cast<std::size_t>(t)] == P));
    }
    // wgkv holds what its gate admits, kvzap what scores >= tau, a prompt-compressing policy keeps
    // every decode token: the bound is checked where the Evictor states one
    const bool write_gated = source.scores == inputs::Scores::gate;
    const bool bounded = states_bound(o) && !registry::needs_prompt_length(policy);
    if (bounded) CHECK(r.peak_entries_per_head <= std::max(P, bound));
    if (reconstructs) {  // the probe's tokens leave at its own step; the prompt's leave there or never
      CHECK(r.peak_entries_per_head >= P + 8);                // the prompt and the probe, at the probe's step
      CHECK(r.peak_entries_per_head <= std::max(P + 8, tr.tokens - 8));  // never the probe's tokens after it
      for (std::int64_t t = 0; t < tr.tokens; ++t) {
        const auto e = r.evicted_at[static_cast<std::size_t>(t)];
        REQUIRE((t < P + 8 ? (t < P ? e == -1 || e == P + 8 : e == P + 8) : e == -1));
      }
    }
    std::int64_t evicted = 0;
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h)
        for (std::int64_t t = 0; t < tr.tokens; ++t) {
          const auto e = r.evicted_at[static_cast<std::size_t>((l * 2 + h) * tr.tokens + t)];
          REQUIRE((e == -1 || e > t));  // evicted after it was appended
          if (epikv_family) REQUIRE_MESSAGE((t >= P || e == -1), "prompt token ", t, " evicted");  // SPEC §4
          if (write_gated && e != -1) {  // SPEC §3: dropped only once out of the ring, and only if g < tau
            REQUIRE(e >= t + 12 + 1);
            REQUIRE(tr.write_gate[static_cast<std::size_t>((l * 2 + h) * tr.tokens + t)] < 0.1f);
          }
          if (thresholded) {  // SPEC §11: dropped iff its score is < tau, once out of the window
            const bool below = tr.log_beta[static_cast<std::size_t>((l * 2 + h) * tr.tokens + t)] < -0.02f;
            REQUIRE((e != -1) == (below && t < tr.tokens - 12));
            if (e != -1) REQUIRE(e >= t + 12 + 1);
          }
          evicted += e != -1;
        }
    // a policy no budget bounds evicts where its scores say so, which the synthetic scores may not
    // (KVzap's tau, set above); the ones known here do
    if (bounded || write_gated || thresholded || reconstructs || registry::needs_prompt_length(policy)) CHECK(evicted > 0);
    for (float e : r.attn_rel_error) REQUIRE(std::isfinite(e));
    if (source.name == "hidden_states") {  // one score per token: every head evicts the same tokens
      for (std::int64_t i = 1; i < 4; ++i)
        for (std::int64_t t = 0; t < tr.tokens; ++t)
          REQUIRE(r.evicted_at[static_cast<std::size_t>(i * tr.tokens + t)] == r.evicted_at[static_cast<std::size_t>(t)]);
    }
  }
  // every policy with a token-level mode (SPEC §8): the same positions leave every head at the
  // same step, the sequence never holds more than M + B - 1 + one step of them, the budget binds
  for (const auto name : registry::names()) {
    const std::string policy(name);
    if (!registry::takes(policy, "mode")) continue;
    CAPTURE(policy);
    replay::Options o;
    o.policy = policy;
    o.prefill = P;
    o.set("budget", M).set("buffer", B).set("mode", "union");
    const auto r = replay::replay(tr, o, &full);
    CHECK(r.peak_entries_per_head <= std::max(P, M + B));
    std::int64_t evicted = 0;
    for (std::int64_t i = 1; i < 4; ++i)
      for (std::int64_t t = 0; t < tr.tokens; ++t)
        REQUIRE(r.evicted_at[static_cast<std::size_t>(i * tr.tokens + t)] == r.evicted_at[static_cast<std::size_t>(t)]);
    for (std::int64_t t = 0; t < tr.tokens; ++t) evicted += r.evicted_at[static_cast<std::size_t>(t)] != -1;
    CHECK(evicted >= tr.tokens - (M + B));
  }
  {  // what has no token-level form is refused, naming the value
    replay::Options o;
    o.policy = "trimkv";
    o.set("mode", "union").set("threshold", 0.5);
    CHECK_THROWS_WITH_AS(replay::replay(tr, o), doctest::Contains("threshold variant (alpha = 0.5)"), Error);
    o.policy = "dbtrimkv";
    o.given.erase("threshold");
    o.set("floor", 0.25);
    CHECK_THROWS_WITH_AS(replay::replay(tr, o), doctest::Contains("floor f = 0.25"), Error);
    o.given.erase("floor");
    o.set("mode", "token");
    CHECK_THROWS_WITH_AS(replay::replay(tr, o), doctest::Contains("--mode 'token' must be per-head or union"), Error);
    o.policy = "snapkv";
    o.set("mode", "union");
    CHECK_THROWS_WITH_AS(replay::replay(tr, o), doctest::Contains("--mode does not apply to policy snapkv"), Error);
  }
  {  // wgkv under a hard budget (SPEC §3): the global caches stay near L * Hkv * M_avg, the rings beside them
    replay::Options o;
    o.policy = "wgkv";
    o.set("local", 2);
    o.set("avg-budget", 3);
    const auto r = replay::replay(tr, o, &full);
    replay::Options unbounded = o;
    unbounded.set("avg-budget", 0);
    const auto u = replay::replay(tr, unbounded, &full);
    MESSAGE("wgkv peak entries: ", r.peak_entries_total, " with M_avg = 3, ", u.peak_entries_total, " without");
    // floor(10%) drops nothing from a head under 10 global entries: the budget holds each head near 10
    CHECK(r.peak_entries_total <= 2 * 2 * (10 + 2 + 1));
    CHECK(u.peak_entries_total > r.peak_entries_total);
  }
  replay::Trace bare = tr;
  bare.hidden.clear();
  replay::Options o;
  o.policy = "epikv";
  CHECK_THROWS_WITH_AS(replay::replay(bare, o), doctest::Contains("needs the trace's hidden_states"), Error);
  bare.keys.clear();
  bare.values.clear();
  bare.queries.clear();
  o.policy = "h2o";
  CHECK_THROWS_WITH_AS(replay::replay(bare, o), doctest::Contains("needs the trace's keys, values and queries"), Error);
  {  // docs/replay.md: WG-KV needs write_gate; its Scorer reads the attention only under a hard budget
    replay::Trace gates_only = bare;  // as read from a file without K/V: no head_dim either
    gates_only.head_dim = 0;
    replay::Options w;
    w.policy = "wgkv";
    w.set("local", 2);
    CHECK(replay::replay(gates_only, w).step_end.back() == gates_only.tokens);
    w.set("avg-budget", 3);
    CHECK_THROWS_WITH_AS(replay::replay(gates_only, w), doctest::Contains("needs the trace's keys, values and queries"), Error);
  }
  o.policy = "lru";
  CHECK_THROWS_WITH_AS(replay::replay(bare, o), doctest::Contains(("unknown policy 'lru' (known: " + registry::known() + ")").c_str()),
                       Error);
}

// docs/replay.md: hidden_states is [L', T, D] with any L'; the bands index the trace's L' hidden
// states, not the model's L + 1. A band past L (here a copy of band 2 at index L + 2) replays as the
// band it copies, and a band past L' is refused naming L'.
TEST_CASE("replay: hidden-state bands index the trace's L' hidden states, whatever the model's L") {
  replay::Trace tr = replay::synthetic_trace(2, 2, 2, 16, 120);
  const int L = tr.layers;
  REQUIRE(tr.hidden_layers == L + 1);
  const auto band_size = static_cast<std::size_t>(tr.tokens * tr.hidden_size);
  std::vector<float> band2(tr.hidden.begin() + static_cast<std::ptrdiff_t>(2 * band_size),
                           tr.hidden.begin() + static_cast<std::ptrdiff_t>(3 * band_size));
  tr.hidden.insert(tr.hidden.end(), band_size, 0.0f);  // band L + 1: zeros
  tr.hidden.insert(tr.hidden.end(), band2.begin(), band2.end());  // band L + 2: band 2 again
  tr.hidden_layers = L + 3;
  for (const std::string policy : {"epikv", "hs-var"}) {
    CAPTURE(policy);
    replay::Options o;
    o.policy = policy;
    o.prefill = 40;
    o.offer("budget", 24).offer("band-a", 2).offer("band-b", 1);
    const auto in_model = replay::replay(tr, o);
    o.given["band-a"] = std::to_string(L + 2);
    const auto past_model = replay::replay(tr, o);
    CHECK(past_model.evicted_at == in_model.evicted_at);
    CHECK(std::count(past_model.evicted_at.begin(), past_model.evicted_at.end(), -1) <
          static_cast<std::ptrdiff_t>(past_model.evicted_at.size()));  // the budget evicted something
    o.given["band-a"] = std::to_string(L + 3);
    CHECK_THROWS_WITH_AS(replay::replay(tr, o),
                         doctest::Contains(("must be hidden-state indices in [0, " + std::to_string(L + 2) + "] of the L' = " +
                                            std::to_string(L + 3))
                                               .c_str()),
                         Error);
  }
}

// --gate with trimkv and dbtrimkv (SPEC §1-2): the gate runs on the trace's gate_input and its
// log_beta replaces the trace's; the replay then equals one of the trace with those log_beta.
TEST_CASE("replay --gate: TRIM-KV's gate and the authors' rg10 (DBTrimKV's, and TRIM-KV's by choice) on gate_input replace the trace's log_beta") {
  auto tr = replay::synthetic_trace(2, 2, 2, 8, 120);
  const int D = 6, I = 8, H = tr.kv_heads, L = tr.layers;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const auto randn = [&](std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = normal(rng);
    return v;
  };
  tr.gate_input_size = D;
  tr.gate_input = randn(std::int64_t{L} * tr.tokens * D);
  safetensors::Writer trimkv_file, rg10_file;
  const auto w3 = randn(H * I);
  std::vector<float> b(static_cast<std::size_t>(H), 3.0f);
  for (int l = 0; l < L; ++l) {
    const auto p = gate::RetentionGate::prefix(l);
    trimkv_file.add_f32(p + "linear1.weight", {I, D}, randn(I * D));
    trimkv_file.add_f32(p + "linear1.bias", {I}, randn(I));
    trimkv_file.add_f32(p + "linear2.weight", {H, I}, randn(H * I));
    trimkv_file.add_f32(p + "bias", {H}, b);
    rg10_file.add_f32(p + "linear1.weight", {I, D}, randn(I * D));
    rg10_file.add_f32(p + "linear1.bias", {I}, randn(I));
    rg10_file.add_f32(p + "linear2.weight", {I, I}, randn(I * I));
    rg10_file.add_f32(p + "linear2.bias", {I}, randn(I));
    rg10_file.add_f32(p + "linear3.weight", {H, I}, w3);  // tied: the same pair under every layer
    rg10_file.add_f32(p + "bias", {H}, b);
  }
  const std::string dir = std::filesystem::temp_directory_path() / ("kvpolicy_replay_gate_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  trimkv_file.write(dir + "/trimkv.safetensors");
  rg10_file.write(dir + "/rg10.safetensors");
  // TRIM-KV runs an rg10 file too (SPEC §1, "Gate kind"): its log_beta by rg10's formula
  const std::pair<std::string, std::string> runs[] = {{"trimkv", "trimkv"}, {"dbtrimkv", "rg10"}, {"trimkv", "rg10"}};
  for (const auto& run : runs) {
    const std::string& policy = run.first;
    const std::string& file = run.second;
    CAPTURE(policy);
    CAPTURE(file);
    replay::Options o;
    o.policy = policy;
    o.set("budget", 12);
    o.set("buffer", 4);
    o.set("gate", dir + "/" + file + ".safetensors");
    const auto gated = replay::replay(tr, o, replay::Reference{nullptr, false});
    // the same log_beta by the library's gate, by hand
    auto expect = tr;
    const auto f = safetensors::File::read(o.given.at("gate"));
    for (int l = 0; l < L; ++l) {
      const View<const float, 2> x(tr.gate_input.data() + std::int64_t{l} * tr.tokens * D, {tr.tokens, D});
      const View<float, 2> out(expect.log_beta.data() + std::int64_t{l} * H * tr.tokens, {H, tr.tokens});
      if (file == "trimkv")
        gate::RetentionGate::load(f, {L, D, H, I}).forward(l, x, out);
      else
        gate::Rg10Gate::load(f, {L, D, H, I}).forward(l, x, out);
    }
    CHECK(expect.log_beta != tr.log_beta);
    o.given.erase("gate");
    const auto direct = replay::replay(expect, o, replay::Reference{nullptr, false});
    CHECK(gated.evicted_at == direct.evicted_at);
    CHECK(std::count(gated.evicted_at.begin(), gated.evicted_at.end(), -1) < static_cast<long>(gated.evicted_at.size()));
  }
  replay::Options o;
  o.policy = "dbtrimkv";
  o.set("gate", dir + "/rg10.safetensors");
  auto no_input = tr;
  no_input.gate_input.clear();
  CHECK_THROWS_WITH_AS(replay::replay(no_input, o), doctest::Contains("needs the trace's gate_input"), Error);
  std::filesystem::remove_all(dir);
}
