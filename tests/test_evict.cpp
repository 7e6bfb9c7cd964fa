// SPEC §1–2 triggers and survivors: hand-computed cases, then the whole Cache against the
// brute-force oracle on thousands of random traces, ties included.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/cache/evictor_hooks.hpp"
#include "kvpolicy/parts/evict/union.hpp"
#include "kvpolicy/baselines.hpp"
#include "kvpolicy/trimkv.hpp"
#include "oracle.hpp"

using namespace kvpolicy;

namespace {

// keep mask of evict::select on one segment set built from (score, position) lists per head.
template <class E>
std::vector<std::uint8_t> run_select(const E& e, const CacheShape& shape, const std::vector<std::vector<float>>& sc,
                                     const std::vector<std::vector<std::int32_t>>& pos) {
  std::vector<float> score;
  std::vector<std::int32_t> position;
  std::vector<std::int64_t> offsets{0};
  for (std::size_t h = 0; h < sc.size(); ++h) {
    score.insert(score.end(), sc[h].begin(), sc[h].end());
    position.insert(position.end(), pos[h].begin(), pos[h].end());
    offsets.push_back(static_cast<std::int64_t>(score.size()));
  }
  std::vector<std::uint8_t> keep(score.size(), 1);
  evict::select_survivors(e, shape, {}, SegmentedScores{score, position, offsets}, keep);
  return keep;
}

}  // namespace

TEST_CASE("per-head buffered trigger fires at len >= M + B (SPEC §1)") {
  const CacheShape shape{1, 2, 2, 4};
  const auto e = trimkv_evictor({.budget = 4, .buffer = 2});
  std::vector<std::uint8_t> active(2);
  std::vector<std::int64_t> lengths{5, 6};
  CHECK(evict::trigger_heads(e, shape, {}, lengths, active));
  CHECK(active == std::vector<std::uint8_t>{0, 1});
  lengths = {5, 5};
  CHECK_FALSE(evict::trigger_heads(e, shape, {}, lengths, active));
}

namespace {

// An Evictor that states its rule and declares no hook: every hook is EvictorHooks' default.
struct Plain {
  void validate(const CacheShape&) const {}
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  bool fires(std::int64_t length, std::int64_t, StepContext) const { return length > 3; }
  evict::HeadSelection selection() const { return {.keep = 2}; }
};
// The same rule, declaring the hooks (each one's effect is visible).
struct Hooked : Plain {
  mutable int agreed = 0, checked = 0;
  void validate_scorer(const score::RetentionDecay&) const { ++checked; }
  StepContext shared_context(StepContext c) const {
    c.entries *= 2;
    return c;
  }
  bool trigger(const CacheShape&, StepContext, std::span<const std::int64_t> lengths, std::span<std::uint8_t> active) const {
    for (std::size_t i = 0; i < lengths.size(); ++i) active[i] = i == 1;  // not what fires() says
    return true;
  }
  bool budget_binds(StepContext, std::span<const EntryMeta> meta, std::span<const std::int64_t>) const {
    return meta.size() > 5;
  }
  template <class F>
  void agree_on(F&& f) const {
    ++agreed;
    f();
  }
  static constexpr bool selects_heads_alone = true;
};

}  // namespace

TEST_CASE("EvictorHooks: an undeclared hook is its default, a declared one is called") {
  const CacheShape shape{1, 2, 2, 4};
  const StepContext ctx{.n = 10, .entries = 7};
  const std::vector<std::int64_t> lengths{4, 3};
  std::vector<std::uint8_t> active(2, 0);
  const std::vector<EntryMeta> meta(6);
  const std::vector<std::int64_t> offsets{0, 6, 6};
  int ran = 0;

  const Plain plain;
  using P = EvictorHooks<Plain>;
  P::validate_scorer(plain, score::RetentionDecay{});  // nothing to check
  CHECK(P::shared_context(plain, ctx).entries == 7);
  CHECK(P::trigger(plain, shape, ctx, lengths, active));  // fires() per head: 4 > 3, 3 is not
  CHECK(active == std::vector<std::uint8_t>{1, 0});
  CHECK(P::budget_binds(plain, ctx, meta, offsets));  // always binds
  P::agree_on(plain, [&] { ++ran; });
  CHECK(ran == 1);
  CHECK_FALSE(P::selects_heads_alone);
  CHECK_FALSE(P::counts_prompt_by_length);
  CHECK_FALSE(P::tells_binding);

  const Hooked hooked;
  using H = EvictorHooks<Hooked>;
  H::validate_scorer(hooked, score::RetentionDecay{});
  CHECK(hooked.checked == 1);
  CHECK(H::shared_context(hooked, ctx).entries == 14);
  active.assign(2, 0);
  CHECK(H::trigger(hooked, shape, ctx, lengths, active));
  CHECK(active == std::vector<std::uint8_t>{0, 1});
  CHECK(H::tells_binding);
  CHECK(H::budget_binds(hooked, ctx, meta, offsets));
  CHECK_FALSE(H::budget_binds(hooked, ctx, std::span<const EntryMeta>(meta).first(5), offsets));
  H::agree_on(hooked, [&] { ++ran; });
  CHECK(hooked.agreed == 1);
  CHECK(ran == 2);
  CHECK(H::selects_heads_alone);
  CHECK(EvictorHooks<evict::Generated>::counts_prompt_by_length);
}

namespace {

// Plain's rule with its own selection: keeps each active head's oldest entry only.
struct Selecting : Plain {
  void select(const CacheShape&, StepContext, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    for (std::size_t h = 0; h + 1 < s.offsets.size(); ++h)
      for (auto i = s.offsets[h]; i < s.offsets[h + 1]; ++i) keep[static_cast<std::size_t>(i)] = i == s.offsets[h];
  }
};

// One step of five tokens (positions 0..4, equal scores) through a Cache with evictor E; what each
// of the two heads then holds, by position.
template <class E>
std::vector<std::vector<std::int32_t>> held_after_step(const E& evictor, int* validated = nullptr, int* agreed = nullptr) {
  const CacheShape shape{1, 2, 2, 4};
  Cache<score::RetentionDecay, admit::All, E, memory::Paged<4>, cpu_backend> cache(shape, memory::Paged<4>(16), evictor);
  cache.add_sequence(0, 5);
  std::vector<float> kv(2 * 5 * 4, 0.5f), log_beta(2 * 5, -0.1f);
  cache.step(0, View<const float, 4>(kv.data(), {1, 2, 5, 4}), View<const float, 4>(kv.data(), {1, 2, 5, 4}),
             View<const float, 3>(log_beta.data(), {1, 2, 5}));
  if constexpr (requires { evictor.agreed; }) {
    *validated = cache.evictor().checked;
    *agreed = cache.evictor().agreed;
  }
  std::vector<std::vector<std::int32_t>> held(2);
  for (int h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < cache.length(0, 0, h); ++i) held[static_cast<std::size_t>(h)].push_back(cache.entry(0, 0, h, i).position);
  for (auto& p : held) std::sort(p.begin(), p.end());
  return held;
}

}  // namespace

TEST_CASE("EvictorHooks through a Cache: the defaults and the declared hooks decide a real step") {
  using Held = std::vector<std::vector<std::int32_t>>;
  // no hook declared: fires() fires both heads (5 > 3), selection() keeps the newest 2 of equal scores
  CHECK(held_after_step(Plain{}) == Held{{3, 4}, {3, 4}});
  // the declared trigger fires head 1 only, whatever fires() says; the Scorer was validated once
  // and the scoring agreed on once
  int validated = 0, agreed = 0;
  CHECK(held_after_step(Hooked{}, &validated, &agreed) == Held{{0, 1, 2, 3, 4}, {3, 4}});
  CHECK(validated == 1);
  CHECK(agreed == 1);
  // a declared select() replaces the stated selection
  CHECK(held_after_step(Selecting{}) == Held{{0}, {0}});
  // the select hook's default is the stated selection; with select() declared it is that
  const CacheShape shape{1, 2, 2, 4};
  const std::vector<float> score{-1.0f, -3.0f, -2.0f};
  const std::vector<std::int32_t> position{0, 1, 2};
  const std::vector<std::int64_t> offsets{0, 3};
  std::vector<std::uint8_t> keep(3, 1);
  EvictorHooks<Plain>::select(Plain{}, shape, {}, SegmentedScores{score, position, offsets}, keep);
  CHECK(keep == std::vector<std::uint8_t>{1, 0, 1});
  EvictorHooks<Selecting>::select(Selecting{}, shape, {}, SegmentedScores{score, position, offsets}, keep);
  CHECK(keep == std::vector<std::uint8_t>{1, 0, 0});
  // needs_every_token: false unless declared; token-level eviction declares it
  CHECK_FALSE(EvictorHooks<Plain>::needs_every_token);
  CHECK_FALSE(EvictorHooks<Hooked>::needs_every_token);
  CHECK(EvictorHooks<evict::Union>::needs_every_token);
}

TEST_CASE("ties go to the larger position, across heads to the lower (layer, head) (SPEC, Ties)") {
  const CacheShape shape{1, 2, 2, 4};
  // all scores equal: per head the newest M survive
  const auto keep = run_select(trimkv_evictor({.budget = 2, .buffer = 1}), shape, {{0, 0, 0, 0}, {}},
                               {{7, 3, 9, 1}, {}});
  CHECK(keep == std::vector<std::uint8_t>{1, 0, 1, 0});
  // global, K = L*Hkv*M = 2 of 4 equal scores: the two position-5 entries (one per head) win
  const auto g = run_select(evict::Global{1, 1, 0.0, 0, 0.0}, CacheShape{1, 2, 2, 4}, {{-1, -1}, {-1, -1}},
                            {{5, 4}, {5, 4}});
  CHECK(g == std::vector<std::uint8_t>{1, 0, 1, 0});
  // L = 1, Hkv = 3, M = 1: K = 3 seats for 4 entries tied at (score -1, position 5) in heads 0, 1, 2
  // and a better one in head 2: heads 0 and 1 win the tie, head 2's tied entry loses
  const auto g2 = run_select(evict::Global{1, 1, 0.0, 0, 0.0}, CacheShape{1, 3, 3, 4}, {{-1}, {-1}, {-1, 0}},
                             {{5}, {5}, {5, 1}});
  CHECK(g2 == std::vector<std::uint8_t>{1, 1, 0, 1});
  // K = 2: the (0, pos 1) entry of head 1 first, then the tie (-1, pos 5) in heads 0 and 1: head 0 wins
  const auto g3 = run_select(evict::Global{1, 1, 0.0, 0, 0.0}, CacheShape{1, 2, 2, 4}, {{-1}, {-1, 0}}, {{5}, {5, 1}});
  CHECK(g3 == std::vector<std::uint8_t>{1, 0, 1});
}

TEST_CASE("sliding-window protection keeps the w newest whatever their score (SPEC §1)") {
  const CacheShape shape{1, 1, 1, 4};
  const auto keep = run_select(trimkv_evictor({.budget = 3, .buffer = 1, .window = 2}), shape,
                               {{5.f, -9.f, 4.f, -8.f, 3.f}}, {{0, 4, 1, 3, 2}});
  // positions 4 and 3 protected; the last seat goes to the best other score (5, position 0)
  CHECK(keep == std::vector<std::uint8_t>{1, 1, 0, 1, 0});
}

TEST_CASE("threshold variant keeps every score >= log(alpha) (SPEC §1)") {
  const CacheShape shape{1, 1, 1, 4};
  const auto keep = run_select(trimkv_evictor({.budget = 1, .buffer = 1, .threshold = 0.5}), shape,
                               {{-0.1f, -0.7f, std::log(0.5f), -5.f}}, {{0, 1, 2, 3}});
  CHECK(keep == std::vector<std::uint8_t>{1, 0, 1, 0});
}

TEST_CASE("the threshold's floor: each head keeps its min_tokens best whatever the bound (SPEC §1, §2)") {
  const CacheShape one{1, 1, 1, 4};
  // scores -0.1 (pos 0), -0.7 (1), -3 (2), -5 (3); alpha 0.5 keeps -0.1 alone; a floor of 3 adds
  // the next two best, -0.7 and -3; the window's entry (position 3) counts among the three
  const std::vector<std::vector<float>> scores{{-0.1f, -0.7f, -3.f, -5.f}};
  const std::vector<std::vector<std::int32_t>> pos{{0, 1, 2, 3}};
  CHECK(run_select(trimkv_evictor({.threshold = 0.5, .min_tokens = 3}), one, scores, pos) ==
        std::vector<std::uint8_t>{1, 1, 1, 0});
  CHECK(run_select(trimkv_evictor({.window = 1, .threshold = 0.5, .min_tokens = 3}), one, scores, pos) ==
        std::vector<std::uint8_t>{1, 1, 0, 1});
  // ties in score go to the larger position, as the top-M's
  CHECK(run_select(trimkv_evictor({.threshold = 0.5, .min_tokens = 2}), one, {{-0.1f, -2.f, -2.f}}, {{0, 1, 2}}) ==
        std::vector<std::uint8_t>{1, 0, 1});
  // pooled: the floor is per head, not the pool's; above it the bound alone decides
  const CacheShape two{1, 2, 2, 4};
  CHECK(run_select(dbtrimkv_evictor({.threshold = 0.5, .min_tokens = 1}), two, {{-0.1f, -0.2f, -4.f}, {-6.f, -5.f}},
                   {{0, 1, 2}, {0, 1}}) == std::vector<std::uint8_t>{1, 1, 0, 0, 1});
}

TEST_CASE("the threshold variant runs after every step, whatever the lengths (SPEC §1, §2)") {
  const CacheShape shape{2, 2, 2, 4};
  std::vector<std::uint8_t> active(4);
  const std::vector<std::int64_t> lengths{1, 0, 2, 1};  // far below any M + B
  CHECK(evict::trigger_heads(trimkv_evictor({.budget = 8, .buffer = 4, .threshold = 0.5}), shape, {}, lengths, active));
  CHECK(active == std::vector<std::uint8_t>{1, 1, 1, 1});
  CHECK_FALSE(evict::trigger_heads(trimkv_evictor({.budget = 8, .buffer = 4}), shape, {}, lengths, active));
  CHECK(evict::trigger_heads(dbtrimkv_evictor({.budget = 8, .buffer = 4, .threshold = 0.5}), shape, {}, lengths, active));
  CHECK(active == std::vector<std::uint8_t>{1, 1, 1, 1});
  CHECK(evict::trigger_heads(dbtrimkv_layerwise_evictor({.budget = 8, .buffer = 4, .threshold = 0.5}), shape, {}, lengths,
                             active));
  CHECK(active == std::vector<std::uint8_t>{1, 1, 1, 1});
}

TEST_CASE("global trigger is >= L Hkv (M + B), layer-wise is > Hkv (M + B) (SPEC §2)") {
  const CacheShape shape{2, 2, 2, 4};
  std::vector<std::uint8_t> active(4);
  const evict::Global g{4, 2, 0.0, 0, 0.0};
  std::vector<std::int64_t> lengths{6, 6, 6, 5};  // 23 < 24
  CHECK_FALSE(evict::trigger_heads(g, shape, {}, lengths, active));
  lengths = {9, 3, 6, 6};  // 24: fires, every head takes part
  CHECK(evict::trigger_heads(g, shape, {}, lengths, active));
  CHECK(active == std::vector<std::uint8_t>{1, 1, 1, 1});
  const evict::LayerWise lw{4, 2, 0.0, 0, 0.0};
  lengths = {6, 6, 7, 6};  // layer 0 total 12 = Hkv (M+B): no; layer 1 total 13: yes
  CHECK(evict::trigger_heads(lw, shape, {}, lengths, active));
  CHECK(active == std::vector<std::uint8_t>{0, 0, 1, 1});
}

TEST_CASE("threshold bound is log(alpha) even for alpha outside fp32's range") {
  const CacheShape shape{1, 1, 1, 4};
  const float ninf = -std::numeric_limits<float>::infinity();
  // alpha = 1e-50: log(alpha) = -115.13; a -inf score is below it, -100 above it
  const auto keep = run_select(trimkv_evictor({.budget = 1, .buffer = 1, .threshold = 1e-50}), shape,
                               {{ninf, -100.0f, -116.0f}}, {{0, 1, 2}});
  CHECK(keep == std::vector<std::uint8_t>{0, 1, 0});
  const auto huge = run_select(trimkv_evictor({.budget = 1, .buffer = 1, .threshold = 1e300}), shape, {{690.0f, 691.0f}}, {{0, 1}});
  CHECK(huge == std::vector<std::uint8_t>{0, 1});  // log(1e300) = 690.78
}

TEST_CASE("floor_ratio quotas by hand (SPEC §2)") {
  // L = 1, Hkv = 2, M = 4, f = 0.5: K = 8, top floor(0.5 * 8) = 4 pooled, each head + floor(4 * 0.5) = 2.
  const CacheShape shape{1, 2, 2, 4};
  const evict::Global g{4, 1, 0.5, 0, 0.0};
  // head 0 holds the 4 best scores; head 1 the rest.
  const auto keep = run_select(g, shape, {{9, 8, 7, 6, 0}, {-1, -2, -3, -4, -5}}, {{0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}});
  // head 0: quota 4 + 2 = 6 >= 5 entries -> all; head 1: quota 0 + 2 -> its top 2
  CHECK(keep == std::vector<std::uint8_t>{1, 1, 1, 1, 1, 1, 1, 0, 0, 0});
}

TEST_CASE("a DBTrimKV config's horizon cannot be dropped: the scorer must have it") {
  const CacheShape shape{2, 2, 2, 4};
  // the horizon reaches only the evictor's factory: the scorer would be Lookahead{2}
  CHECK_THROWS_WITH_AS(DBTrimKVCache<>(shape, memory::Paged<16>(64), dbtrimkv_evictor({.horizon = 5})),
                       doctest::Contains("evict::Global: the config's horizon h = 5 is not the scorer's h = 2"), Error);
  CHECK_THROWS_WITH_AS(DBTrimKVLayerWiseCache<>(shape, memory::Paged<16>(64), dbtrimkv_layerwise_evictor({.horizon = 3})),
                       doctest::Contains("evict::LayerWise: the config's horizon h = 3 is not the scorer's h = 2"), Error);
  const DBTrimKVConfig c{.budget = 8, .buffer = 2, .horizon = 5};
  CHECK_NOTHROW(DBTrimKVCache<>(shape, memory::Paged<16>(64), dbtrimkv_evictor(c), dbtrimkv_scorer(c)));
  CHECK_NOTHROW(DBTrimKVCache<>(shape, memory::Paged<16>(64), dbtrimkv_evictor()));  // the defaults agree
  // an evictor built field by field names no horizon: any scorer goes
  CHECK_NOTHROW(DBTrimKVCache<>(shape, memory::Paged<16>(64), evict::Global{8, 2}, score::Lookahead{7}));
}

TEST_CASE("invalid evictor parameters are rejected with the value named") {
  const CacheShape shape{1, 1, 1, 4};
  CHECK_THROWS_WITH_AS(trimkv_evictor({.budget = 0}).validate(shape), doctest::Contains("budget M = 0"), Error);
  CHECK_THROWS_WITH_AS(trimkv_evictor({.budget = 4, .buffer = 0}).validate(shape), doctest::Contains("buffer B = 0"), Error);
  CHECK_THROWS_WITH_AS(trimkv_evictor({.budget = 4, .window = 5}).validate(shape), doctest::Contains("window w = 5"), Error);
  CHECK_THROWS_WITH_AS(trimkv_evictor({.budget = 4, .sinks = 3, .window = 2}).validate(shape), doctest::Contains("sinks S = 3"), Error);
  CHECK_THROWS_WITH_AS(baseline_evictor({.budget = 4, .sinks = -1}).validate(shape), doctest::Contains("sinks S = -1"), Error);
  CHECK_THROWS_WITH_AS(dbtrimkv_evictor({.budget = 4, .sinks = 5}).validate(shape), doctest::Contains("sinks S = 5"), Error);
  CHECK_THROWS_WITH_AS(trimkv_evictor({.threshold = -1}).validate(shape), doctest::Contains("threshold alpha = -1"), Error);
  CHECK_THROWS_WITH_AS(dbtrimkv_evictor({.floor_ratio = 1.0}).validate(shape), doctest::Contains("floor_ratio f = 1"), Error);
  CHECK_THROWS_WITH_AS(dbtrimkv_layerwise_evictor({.floor_ratio = -0.5}).validate(shape), doctest::Contains("floor_ratio f = -0.5"), Error);
  CHECK_THROWS_WITH_AS(dbtrimkv_evictor({.budget = std::int64_t{1} << 62, .buffer = 1}).validate(shape),
                       doctest::Contains("exceeds 2^31 - 1 entries per head"), Error);
  CHECK_THROWS_WITH_AS(dbtrimkv_evictor({.threshold = 0.1, .floor_ratio = 0.2}).validate(shape),
                       doctest::Contains("exclusive"), Error);
  CHECK_THROWS_WITH_AS(trimkv_evictor({.threshold = 0.5, .min_tokens = -1}).validate(shape),
                       doctest::Contains("evict::PerHead: min_tokens = -1 must be >= 0"), Error);
  CHECK_THROWS_WITH_AS(trimkv_evictor({.min_tokens = 4}).validate(shape),
                       doctest::Contains("min_tokens = 4 is the threshold variant's floor per head"), Error);
  CHECK_THROWS_WITH_AS(dbtrimkv_evictor({.min_tokens = 2}).validate(shape),
                       doctest::Contains("evict::Global: min_tokens = 2 is the threshold variant's floor"), Error);
  CHECK_THROWS_WITH_AS(dbtrimkv_layerwise_evictor({.threshold = 0.5, .min_tokens = -3}).validate(shape),
                       doctest::Contains("evict::LayerWise: min_tokens = -3"), Error);
}

// ---- the whole Cache against the oracle ------------------------------------------------------

namespace {

struct Trial {
  CacheShape shape;
  oracle::Params p;
  std::vector<std::int64_t> chunks;  // tokens per step
};

Trial random_trial(std::mt19937_64& rng, bool allow_threshold, bool allow_floor) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Trial t;
  t.shape = CacheShape{pick(1, 3), pick(1, 3), 0, 2};
  t.shape.q_heads = t.shape.kv_heads;
  t.p.budget = pick(1, 8);
  t.p.buffer = pick(1, 4);
  t.p.window = pick(0, 3) == 0 ? pick(0, static_cast<int>(t.p.budget)) : 0;
  t.p.sinks = pick(0, 3) == 0 ? pick(0, static_cast<int>(t.p.budget - t.p.window)) : 0;
  if (allow_threshold && pick(0, 4) == 0) t.p.threshold = std::vector<double>{0.05, 0.3, 0.5, 1.0}[pick(0, 3)];
  if (t.p.threshold > 0.0 && pick(0, 1) == 0) t.p.min_tokens = pick(1, 6);
  if (allow_floor && t.p.threshold == 0.0 && pick(0, 2) == 0) t.p.floor_ratio = std::vector<double>{0.1, 0.25, 0.5, 0.9}[pick(0, 3)];
  const int steps = pick(1, 40);
  for (int s = 0; s < steps; ++s) t.chunks.push_back(pick(0, 5) == 0 ? pick(1, 3 * static_cast<int>(t.p.budget + t.p.buffer)) : 1);
  return t;
}

template <class C>
oracle::Heads survivors(const C& cache, std::int64_t seq) {
  const auto& s = cache.shape();
  oracle::Heads out(static_cast<std::size_t>(s.heads_total()));
  for (int l = 0; l < s.layers; ++l)
    for (int h = 0; h < s.kv_heads; ++h)
      for (std::int64_t i = 0; i < cache.length(seq, l, h); ++i)
        out[static_cast<std::size_t>(head_index(s, l, h))].push_back(cache.entry(seq, l, h, i));
  return out;
}

std::vector<std::vector<std::int32_t>> positions(const oracle::Heads& heads) {
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& h : heads) {
    std::vector<std::int32_t> p;
    for (const auto& e : h) p.push_back(e.position);
    std::sort(p.begin(), p.end());
    out.push_back(p);
  }
  return out;
}

// Runs `trials` random traces through Cache<Scorer, Evictor> and the oracle step by step.
template <class Alloc>
Alloc make_allocator(const CacheShape& shape, std::int64_t entries_per_head) {
  if constexpr (std::is_same_v<Alloc, memory::Contiguous<float>>)
    return Alloc(entries_per_head, 1);
  else
    return Alloc(pages_for(shape, entries_per_head, 1, Alloc::page_size));
}

template <class Scorer, class MakeEvictor, class OracleStep, class Alloc = memory::Paged<4>>
void differential(std::uint64_t seed, int trials, Scorer scorer, MakeEvictor make_evictor, OracleStep oracle_step,
                  bool allow_threshold, bool allow_floor, const Alloc& = Alloc(1)) {
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    const Trial t = random_trial(rng, allow_threshold, allow_floor);
    const auto evictor = make_evictor(t.p);
    std::int64_t max_chunk = *std::max_element(t.chunks.begin(), t.chunks.end());
    std::int64_t total = 0;
    for (auto c : t.chunks) total += c;
    using Evictor = std::decay_t<decltype(evictor)>;
    Cache<Scorer, admit::All, Evictor, Alloc, cpu_backend> cache(
        t.shape, make_allocator<Alloc>(t.shape, total + max_chunk), evictor, scorer);
    cache.add_sequence(7);
    oracle::Heads ref(static_cast<std::size_t>(t.shape.heads_total()));
    std::int64_t n = 0;
    for (std::size_t step = 0; step < t.chunks.size(); ++step) {
      const std::int64_t T = t.chunks[step];
      const auto L = t.shape.layers, H = t.shape.kv_heads, d = t.shape.head_dim;
      std::vector<float> kv(static_cast<std::size_t>(L * H * T * d));
      std::normal_distribution<float> normal;
      for (auto& x : kv) x = normal(rng);
      std::vector<float> lb(static_cast<std::size_t>(L * H * T));
      for (auto& x : lb) x = oracle::tie_prone_log_beta(rng);
      cache.step(7, View<const float, 4>(kv.data(), {L, H, T, d}), View<const float, 4>(kv.data(), {L, H, T, d}),
                 View<const float, 3>(lb.data(), {L, H, T}));
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < T; ++i) {
            const float* k = &kv[static_cast<std::size_t>(((l * H + h) * T + i) * d)];
            ref[static_cast<std::size_t>(l * H + h)].push_back(
                EntryMeta{static_cast<std::int32_t>(n + i), lb[static_cast<std::size_t>((l * H + h) * T + i)],
                          reads_field<Scorer>(Field::key_norm) ? memory::key_norm(k, static_cast<int>(d)) : 0.0f});
          }
      n += T;
      oracle_step(t.shape, ref, n, scorer, t.p);
      const auto got = positions(survivors(cache, 7));
      const auto want = positions(ref);
      if (got != want) {
        FAIL("seed ", seed, " trial ", trial, " step ", step, ": survivors differ (L=", t.shape.layers, " Hkv=",
             t.shape.kv_heads, " M=", t.p.budget, " B=", t.p.buffer, " w=", t.p.window, " alpha=", t.p.threshold,
             " min_tokens=", t.p.min_tokens, " f=", t.p.floor_ratio, ")");
      }
    }
    // pages conserved: free + used = pool
    CHECK(cache.allocator().pages_free() + cache.allocator().pages_used(7) == cache.allocator().pages_total());
  }
}

}  // namespace

TEST_CASE("oracle: TRIM-KV per-head eviction, random traces with ties") {
  differential(
      1, 1500, score::RetentionDecay{},
      [](const oracle::Params& p) {
        return trimkv_evictor({.budget = p.budget,
                               .buffer = p.buffer,
                               .sinks = p.sinks,
                               .window = p.window,
                               .threshold = p.threshold,
                               .min_tokens = p.min_tokens});
      },
      [](auto&&... a) { oracle::per_head(a...); }, true, false);
}

TEST_CASE("oracle: KNorm-weighted per-head eviction") {
  differential(
      2, 500, score::KNormRetention{},
      [](const oracle::Params& p) {
        return trimkv_evictor({.budget = p.budget, .buffer = p.buffer, .sinks = p.sinks, .window = p.window});
      },
      [](auto&&... a) { oracle::per_head(a...); }, false, false);
}

TEST_CASE("oracle: DBTrimKV global eviction with lookahead, floor_ratio and threshold") {
  for (int h : {1, 2, 5})
    differential(
        3 + static_cast<std::uint64_t>(h), 600, score::Lookahead{h},
        [h](const oracle::Params& p) {
          return dbtrimkv_evictor({.budget = p.budget,
                                   .buffer = p.buffer,
                                   .sinks = p.sinks,
                                   .window = p.window,
                                   .threshold = p.threshold,
                                   .horizon = h,
                                   .floor_ratio = p.floor_ratio,
                                   .min_tokens = p.min_tokens});
        },
        [](auto&&... a) { oracle::global(a...); }, true, true);
}

TEST_CASE("oracle: DBTrimKV layer-wise eviction") {
  differential(
      11, 800, score::Lookahead{2},
      [](const oracle::Params& p) {
        return dbtrimkv_layerwise_evictor({.budget = p.budget,
                                           .buffer = p.buffer,
                                           .sinks = p.sinks,
                                           .window = p.window,
                                           .threshold = p.threshold,
                                           .floor_ratio = p.floor_ratio,
                                           .min_tokens = p.min_tokens});
      },
      [](auto&&... a) { oracle::layer_wise(a...); }, true, true);
}

TEST_CASE("oracle: token-level (union) eviction, max and mean over heads, random traces with ties (SPEC §8)") {
  for (const bool mean : {false, true}) {
    const auto aggregate = mean ? evict::Aggregate::mean : evict::Aggregate::max;
    const auto make = [aggregate](const oracle::Params& p) {
      return evict::Union{.budget = p.budget, .buffer = p.buffer, .window = p.window, .sinks = p.sinks, .aggregate = aggregate};
    };
    const auto step = [mean](auto&&... a) { oracle::token_level(a..., mean); };
    differential(21 + mean, 1200, score::RetentionDecay{}, make, step, false, false);
    differential(23 + mean, 400, score::Lookahead{2}, make, step, false, false);
    differential(25 + mean, 300, score::NegKeyNorm{}, make, step, false, false);
    differential(27 + mean, 200, score::Recency{2}, make, step, false, false);
  }
}

TEST_CASE("token-level eviction by hand: one decision per position, max against mean (SPEC §8)") {
  // two heads, three positions; M = 2, B = 1 fires at three positions. The scores make max, mean and
  // mean with a sink keep three different pairs, so each setting is seen to act.
  const std::vector<float> score{-2.0f, -1.0f, -3.0f,     // head 0: positions 0, 1, 2
                                 -30.0f, -20.0f, -3.0f};  // head 1
  const std::vector<std::int32_t> position{0, 1, 2, 0, 1, 2};
  const std::vector<std::int64_t> offsets{0, 3, 6};
  const SegmentedScores s{score, position, offsets};
  const CacheShape shape{1, 2, 2, 2};
  std::vector<std::uint8_t> keep(6);
  evict::Union u{.budget = 2, .buffer = 1};
  CHECK(u.fires(6, 2, StepContext{}));
  CHECK_FALSE(u.fires(5, 2, StepContext{}));
  u.select(shape, StepContext{}, s, keep);  // max: 0 -> -2, 1 -> -1, 2 -> -3
  CHECK(keep == std::vector<std::uint8_t>{1, 1, 0, 1, 1, 0});
  u.aggregate = evict::Aggregate::mean;  // mean: 0 -> -16, 1 -> -10.5, 2 -> -3
  u.select(shape, StepContext{}, s, keep);
  CHECK(keep == std::vector<std::uint8_t>{0, 1, 1, 0, 1, 1});
  u.sinks = 1;  // position 0 protected; then 2 over 1 by the mean
  u.select(shape, StepContext{}, s, keep);
  CHECK(keep == std::vector<std::uint8_t>{1, 0, 1, 1, 0, 1});
  u = evict::Union{.budget = 1, .buffer = 1, .window = 1};  // the newest position stays, though 1's max is best
  u.select(shape, StepContext{}, s, keep);
  CHECK(keep == std::vector<std::uint8_t>{0, 0, 1, 0, 0, 1});
  // an equal aggregate goes to the newer position (SPEC, Ties)
  const std::vector<float> tied{-1.0f, -1.0f, -7.0f, -1.0f, -1.0f, -7.0f};
  u = evict::Union{.budget = 1, .buffer = 1};
  u.select(shape, StepContext{}, SegmentedScores{tied, position, offsets}, keep);
  CHECK(keep == std::vector<std::uint8_t>{0, 1, 0, 0, 1, 0});
}

TEST_CASE("token-level eviction refuses bad parameters with the value named") {
  const CacheShape shape{1, 2, 2, 2};
  CHECK_THROWS_WITH_AS((evict::Union{.budget = 0}.validate(shape)), doctest::Contains("budget M = 0"), Error);
  CHECK_THROWS_WITH_AS((evict::Union{.budget = 4, .buffer = 0}.validate(shape)), doctest::Contains("buffer B = 0"), Error);
  CHECK_THROWS_WITH_AS((evict::Union{.budget = 4, .window = 5}.validate(shape)), doctest::Contains("window w = 5"), Error);
  CHECK_THROWS_WITH_AS((evict::Union{.budget = 4, .window = 2, .sinks = 3}.validate(shape)), doctest::Contains("sinks S = 3"),
                       Error);
}

TEST_CASE("oracle: TRIM-KV on the contiguous allocator") {
  differential(
      12, 300, score::RetentionDecay{},
      [](const oracle::Params& p) {
        return trimkv_evictor({.budget = p.budget, .buffer = p.buffer, .sinks = p.sinks, .window = p.window});
      },
      [](auto&&... a) { oracle::per_head(a...); }, false, false, memory::Contiguous<float>(1, 1));
}

TEST_CASE("baseline scores by hand (SPEC §5): recency with sinks, negative key norm, seeded random") {
  const StepContext c{100};
  CHECK(score::Recency{4}(EntryMeta{3, 0.0f, 1.0f}, c) == std::numeric_limits<float>::infinity());
  CHECK(score::Recency{4}(EntryMeta{4, 0.0f, 1.0f}, c) == 4.0f);
  CHECK(score::Recency{0}(EntryMeta{0, 0.0f, 1.0f}, c) == 0.0f);
  CHECK(score::NegKeyNorm{}(EntryMeta{9, -1.0f, 2.5f}, c) == -2.5f);
  // seeded random: in [0, 1), a function of (seed, position) only, different across seeds
  const score::SeededRandom r1{1}, r2{2};
  double sum = 0;
  int same = 0;
  for (std::int32_t p = 0; p < 4000; ++p) {
    const float a = r1(EntryMeta{p, 0.0f, 0.0f}, c);
    CHECK(a >= 0.0f);
    CHECK(a < 1.0f);
    CHECK(a == r1(EntryMeta{p, -3.0f, 7.0f}, StepContext{5}));
    same += a == r2(EntryMeta{p, 0.0f, 0.0f}, c);
    sum += a;
  }
  CHECK(sum / 4000 == doctest::Approx(0.5).epsilon(0.05));
  CHECK(same < 5);
  CHECK_THROWS_AS(score::Recency{-1}.validate(), Error);
}

// SPEC §5: Random draws per (layer, kv head, position). SplitMix64 written out again from its
// published constants, over seed + golden * ((head << 32 | position) + 1).
TEST_CASE("seeded random is independent per (layer, kv head, position) (SPEC §5)") {
  const auto splitmix = [](std::uint64_t seed, std::int64_t head, std::int32_t p) {
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (((std::uint64_t(head) << 32) | std::uint32_t(p)) + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return float((z ^ (z >> 31)) >> 40) / 16777216.0f;
  };
  const score::SeededRandom r{7};
  int same_as_head0 = 0;
  for (std::int64_t head = 0; head < 6; ++head)
    for (std::int32_t p = 0; p < 500; ++p) {
      const StepContext c{1000, 0, false, 0, head};
      CHECK(r(EntryMeta{p}, c) == splitmix(7, head, p));
      if (head > 0) same_as_head0 += r(EntryMeta{p}, c) == r(EntryMeta{p}, StepContext{1000});
    }
  CHECK(same_as_head0 < 5);
  // On a cache: two heads of one layer, 64 tokens, M = 8. Their survivors differ.
  const CacheShape shape{1, 2, 2, 4};
  RandomCache<> cache(shape, memory::Paged<16>(64), baseline_evictor({.budget = 8, .buffer = 1}), score::SeededRandom{3});
  cache.add_sequence(0);
  std::vector<float> kv(std::size_t(shape.kv_heads) * 4, 0.5f), lb(shape.kv_heads, 0.0f);
  for (int t = 0; t < 64; ++t) {
    cache.append(0, 0, View<const float, 3>(kv.data(), {2, 1, 4}), View<const float, 3>(kv.data(), {2, 1, 4}),
                 View<const float, 2>(lb.data(), {2, 1}));
    cache.commit(0);
  }
  std::vector<std::int32_t> kept[2];
  for (int h = 0; h < 2; ++h) {
    const auto layout = cache.allocator().layout(0, 0, h);
    for (std::int64_t i = 0; i < layout.length; ++i) kept[h].push_back(cache.allocator().pool().meta(layout.slot(i)).position);
    // exactly the 8 best by the formula of this head
    std::vector<std::int32_t> expect(64);
    std::iota(expect.begin(), expect.end(), 0);
    std::sort(expect.begin(), expect.end(), [&](std::int32_t a, std::int32_t b) {
      const float sa = splitmix(3, h, a), sb = splitmix(3, h, b);
      return sa > sb || (sa == sb && a > b);
    });
    expect.resize(8);
    std::sort(expect.begin(), expect.end());
    std::sort(kept[h].begin(), kept[h].end());
    CHECK(kept[h] == expect);
  }
  CHECK(kept[0] != kept[1]);
}

TEST_CASE("oracle: StreamingLLM, KNorm and Random baselines under the per-head budget") {
  const auto evictor = [](const oracle::Params& p) {  // SPEC §5: sinks and window for every evictor
    return baseline_evictor({.budget = p.budget, .buffer = p.buffer, .sinks = p.sinks, .window = p.window});
  };
  const auto per_head_no_window = [](const CacheShape& s, oracle::Heads& h, std::int64_t n, const auto& sc,
                                     oracle::Params p) { oracle::per_head(s, h, n, sc, p); };
  differential(11, 400, score::Recency{4}, evictor, per_head_no_window, false, false);
  differential(12, 400, score::Recency{0}, evictor, per_head_no_window, false, false);
  differential(13, 400, score::NegKeyNorm{}, evictor, per_head_no_window, false, false);
  differential(14, 400, score::SeededRandom{99}, evictor, per_head_no_window, false, false);
}
