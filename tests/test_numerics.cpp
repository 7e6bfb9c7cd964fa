// Numerics at the edges (docs/numerics.md): log_beta exactly 0, -inf and denormal, very large
// horizons, positions near 2^31, and NaN — refused at append, never ranked.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/evict/rank.hpp"
#include "kvpolicy/parts/score/retention.hpp"
#include "kvpolicy/trimkv.hpp"
#include "nan_scorer.hpp"
#include "snapshot.hpp"

using namespace kvpolicy;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kDenormMin = std::numeric_limits<float>::denorm_min();  // 1.4e-45
constexpr std::int32_t kMaxPos = std::numeric_limits<std::int32_t>::max();

EntryMeta entry(std::int32_t pos, float lb, float knorm = 1.0f) { return EntryMeta{pos, lb, knorm}; }

using testing::NaNScorer;

}  // namespace

TEST_CASE("log_beta = 0 (beta = 1) scores exactly 0, log h and log ||k|| at every distance") {
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1} << 24, std::int64_t{kMaxPos} - 1}) {
    const auto m = entry(0, 0.0f, 3.0f);
    CHECK(score::RetentionDecay{}(m, {n}) == 0.0f);
    CHECK(std::signbit(score::RetentionDecay{}(m, {n})) == false);  // +0: equal to a fresh entry's score
    CHECK(score::Lookahead{7}(m, {n}) == static_cast<float>(std::log(7.0)));
    CHECK(score::KNormRetention{}(m, {n}) == std::log(3.0f));
  }
  // -0.0f is a valid log_beta too (it is <= 0); it scores -0, which ranks equal to +0
  CHECK(score::RetentionDecay{}(entry(0, -0.0f), {10}) == 0.0f);
  CHECK(std::signbit(score::RetentionDecay{}(entry(0, -0.0f), {10})));
  CHECK_FALSE(rank::above(0.0f, 3, -0.0f, 3));
  CHECK_FALSE(rank::above(-0.0f, 3, 0.0f, 3));
}

TEST_CASE("log_beta = -inf (beta = 0) scores -inf under every scorer, never NaN, and ranks last") {
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{5}, std::int64_t{kMaxPos} - 1}) {
    const auto m = entry(0, -kInf, 2.0f);
    CHECK(score::RetentionDecay{}(m, {n}) == -kInf);
    for (int h : {1, 2, 1000, std::numeric_limits<int>::max()}) CHECK(score::Lookahead{h}(m, {n}) == -kInf);
    CHECK(score::KNormRetention{}(m, {n}) == -kInf);
  }
  // against the lowest finite score, -inf loses; two -inf entries tie and the newer wins
  CHECK(rank::above(std::numeric_limits<float>::lowest(), 0, -kInf, 9));
  CHECK(rank::above(-kInf, 9, -kInf, 3));
}

TEST_CASE("denormal log_beta: finite, not flushed, below 0 and above any normal negative score") {
  for (float lb : {-kDenormMin, -1e-40f, -std::numeric_limits<float>::min()}) {
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{100}, std::int64_t{kMaxPos} - 1}) {
      const float s = score::RetentionDecay{}(entry(0, lb), {n});
      CHECK(std::isfinite(s));
      CHECK(s < 0.0f);  // strictly: no flush to zero on the CPU path
      CHECK(s > -1e-28f);
      const float g = score::Lookahead{4}(entry(0, lb), {n});
      CHECK(std::isfinite(g));
      CHECK(g == doctest::Approx(std::log(4.0)).epsilon(1e-6));
    }
  }
  // a denormal decay ranks below a beta of exactly 1 at the same position, above a normal one
  CHECK(rank::above(score::RetentionDecay{}(entry(5, 0.0f), {9}), 5, score::RetentionDecay{}(entry(5, -kDenormMin), {9}), 5));
  CHECK(rank::above(score::RetentionDecay{}(entry(5, -kDenormMin), {9}), 5, score::RetentionDecay{}(entry(5, -1e-30f), {9}), 5));
}

TEST_CASE("very large horizons: the lookahead ratio stays finite, in [0, log h], and monotone in beta") {
  for (int h : {2, 1 << 10, 1 << 20, std::numeric_limits<int>::max()}) {
    float previous = -1.0f;
    for (float lb : {-kInf, -100.0f, -1.0f, -1e-3f, -1e-7f, -1e-20f, -kDenormMin, 0.0f}) {
      const float r = math::lookahead_log_ratio(lb, h);
      CHECK(std::isfinite(r));
      CHECK(r >= 0.0f);
      CHECK(r <= static_cast<float>(std::log(static_cast<double>(h))) * (1.0f + 1e-6f));
      CHECK(r >= previous);  // beta closer to 1 keeps more of the horizon
      previous = r;
    }
    CHECK(math::lookahead_log_ratio(0.0f, h) == static_cast<float>(std::log(static_cast<double>(h))));
  }
}

TEST_CASE("positions near 2^31: exact distances up to 2^24, rounded above, ties to the newer entry") {
  // e = n + 1 - p is formed in int64: no overflow at the largest position
  CHECK(score::exponent(entry(kMaxPos - 2, -1.0f), {kMaxPos - 1}) == 2.0f);
  CHECK(score::exponent(entry(0, -1.0f), {kMaxPos}) == 2147483648.0f);  // n = 2^31 - 1: distance 2^31, exact in fp32
  CHECK(score::exponent(entry(1, -1.0f), {kMaxPos}) == 2147483648.0f);  // 2^31 - 1 rounds to 2^31
  CHECK(score::RetentionDecay{}(entry(kMaxPos - 2, -0.5f), {kMaxPos - 1}) == -1.0f);
  // distances 2^31 - 5 .. 2^31 round to the same fp32: the scores tie, the larger position is kept
  const std::vector<float> scores{score::RetentionDecay{}(entry(0, -1.0f), {kMaxPos - 1}),
                                  score::RetentionDecay{}(entry(3, -1.0f), {kMaxPos - 1}),
                                  score::RetentionDecay{}(entry(5, -1.0f), {kMaxPos - 1})};
  CHECK(scores[0] == scores[1]);
  CHECK(scores[1] == scores[2]);
  const std::vector<std::int32_t> positions{0, 3, 5};
  std::vector<std::uint8_t> keep(3);
  rank::keep_top_k(scores, positions, 1, keep);
  CHECK(keep == std::vector<std::uint8_t>{0, 0, 1});
  // near the top of the range the newest entries keep their exact order
  const std::vector<std::int32_t> top{kMaxPos - 3, kMaxPos - 2, kMaxPos - 1};
  std::vector<float> s;
  for (auto p : top) s.push_back(score::RetentionDecay{}(entry(p, -0.25f), {kMaxPos - 1}));
  CHECK(s[0] < s[1]);
  CHECK(s[1] < s[2]);
}

TEST_CASE("positive and +inf log_beta are refused, and a step past position 2^31 - 1 is refused before any read") {
  const CacheShape shape{1, 1, 1, 2};
  TrimKVCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(8), trimkv_evictor({.budget = 2, .buffer = 1}));
  cache.add_sequence(0);
  std::vector<float> k(2, 0.5f);
  for (float bad : {1e-30f, 0.5f, kInf}) {
    std::vector<float> lb{bad};
    CHECK_THROWS_WITH_AS(cache.step(0, View<const float, 4>(k.data(), {1, 1, 1, 2}), View<const float, 4>(k.data(), {1, 1, 1, 2}),
                                    View<const float, 3>(lb.data(), {1, 1, 1})),
                         doctest::Contains("is not in [-inf, 0]"), Error);
  }
  // A chunk of 2^31 tokens: refused by the position check, which runs before shapes or data are
  // read (the views here point at two floats).
  std::vector<float> lb{-0.5f};
  const std::int64_t T = std::int64_t{1} << 31;
  CHECK_THROWS_WITH_AS(cache.step(0, View<const float, 4>(k.data(), {1, 1, T, 2}), View<const float, 4>(k.data(), {1, 1, T, 2}),
                                  View<const float, 3>(lb.data(), {1, 1, T})),
                       doctest::Contains("positions must stay below 2^31 - 1"), Error);
  CHECK(cache.tokens(0) == 0);
  CHECK(cache.length(0, 0, 0) == 0);
}

TEST_CASE("NaN log_beta is refused at append, naming the value's place, and the cache is unchanged") {
  const CacheShape shape{1, 2, 2, 4};
  TrimKVCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(8), trimkv_evictor({.budget = 2, .buffer = 1}));
  cache.add_sequence(0);
  std::vector<float> k(2 * 3 * 4, 0.5f), lb(2 * 3, -0.1f);
  lb[4] = std::nanf("");  // head 1, token 1
  const auto before = testing::snapshot(cache, {0});
  try {
    cache.step(0, View<const float, 4>(k.data(), {1, 2, 3, 4}), View<const float, 4>(k.data(), {1, 2, 3, 4}),
               View<const float, 3>(lb.data(), {1, 2, 3}));
    FAIL("a NaN log_beta was accepted");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("log_beta[layer 0, head 1, token 1") != std::string::npos);
    CHECK(what.find("nan") != std::string::npos);
  }
  CHECK(testing::snapshot(cache, {0}) == before);
}

TEST_CASE("a NaN score from a user-defined scorer never reaches a ranking: commit and step refuse and change nothing") {
  const CacheShape shape{1, 1, 1, 2};
  using C = Cache<NaNScorer, admit::All, evict::PerHead<trigger::Buffered>, memory::Paged<2>, cpu_backend>;
  C cache(shape, memory::Paged<2>(8), evict::PerHead<trigger::Buffered>{trigger::Buffered{2, 1}});
  cache.add_sequence(0);
  std::vector<float> k(2, 1.0f);
  auto lb_of = [](float v) { return std::vector<float>{v}; };
  auto step = [&](float lb) {
    auto b = lb_of(lb);
    return cache.step(0, View<const float, 4>(k.data(), {1, 1, 1, 2}), View<const float, 4>(k.data(), {1, 1, 1, 2}),
                      View<const float, 3>(b.data(), {1, 1, 1}));
  };
  step(-0.5f);
  step(-0.125f);  // stored; its NaN score shows only when eviction ranks the head (length M + B = 3)
  // what a caller can observe (the live entries, tables, free pages); the step's written slots are
  // unreferenced garbage after it is taken back
  const auto before = testing::snapshot(cache, {0}, /*whole_pool=*/false);
  CHECK_THROWS_WITH_AS(step(-0.25f), doctest::Contains("scorer returned NaN"), Error);
  CHECK(testing::snapshot(cache, {0}, false) == before);  // step() took its append back
  CHECK(cache.tokens(0) == 2);

  // the layer API: append, then commit refuses; the step stays open and can be aborted
  auto b = lb_of(-0.25f);
  cache.append(0, 0, View<const float, 3>(k.data(), {1, 1, 2}), View<const float, 3>(k.data(), {1, 1, 2}),
               View<const float, 2>(b.data(), {1, 1}));
  const auto open = testing::snapshot(cache, {0});
  CHECK_THROWS_WITH_AS(cache.commit(0), doctest::Contains("position 1"), Error);
  CHECK(testing::snapshot(cache, {0}) == open);
  cache.abort_step(0);
  CHECK(testing::snapshot(cache, {0}, false) == before);
  CHECK(cache.length(0, 0, 0) == 2);
}

TEST_CASE("step_batch: a NaN score in any sequence takes back every step of the batch") {
  const CacheShape shape{1, 1, 1, 2};
  using C = Cache<NaNScorer, admit::All, evict::PerHead<trigger::Buffered>, memory::Paged<2>, cpu_backend>;
  C cache(shape, memory::Paged<2>(16), evict::PerHead<trigger::Buffered>{trigger::Buffered{2, 1}});
  std::vector<float> k(2, 1.0f);
  for (std::int64_t seq : {0, 1}) {
    cache.add_sequence(seq);
    for (float lb : {-0.5f, seq == 1 ? -0.125f : -0.75f}) {
      std::vector<float> b{lb};
      cache.step(seq, View<const float, 4>(k.data(), {1, 1, 1, 2}), View<const float, 4>(k.data(), {1, 1, 1, 2}),
                 View<const float, 3>(b.data(), {1, 1, 1}));
    }
  }
  const auto before = testing::snapshot(cache, {0, 1}, false);
  std::vector<float> b0{-0.25f}, b1{-0.25f};
  using Step = C::SequenceStep;
  const Step batch[2] = {Step{0, View<const float, 4>(k.data(), {1, 1, 1, 2}), View<const float, 4>(k.data(), {1, 1, 1, 2}),
                              View<const float, 3>(b0.data(), {1, 1, 1})},
                         Step{1, View<const float, 4>(k.data(), {1, 1, 1, 2}), View<const float, 4>(k.data(), {1, 1, 1, 2}),
                              View<const float, 3>(b1.data(), {1, 1, 1})}};
  // sequence 0 would evict fine; sequence 1 holds the entry that scores NaN
  CHECK_THROWS_WITH_AS(cache.step_batch(batch), doctest::Contains("sequence 1"), Error);
  CHECK(testing::snapshot(cache, {0, 1}, false) == before);
  CHECK(cache.tokens(0) == 2);
  CHECK(cache.tokens(1) == 2);
}

namespace {
// An Admitter that fails on one entry (a user-defined admitter may throw).
struct ThrowingAdmitter {
  std::int32_t fail_at = 2;
  Admission admit(EntryMeta m) const {
    if (m.position == fail_at && m.write_score == -0.5f) throw std::runtime_error("admitter failed");
    return Admission::keep;
  }
};
}  // namespace

TEST_CASE("an exception thrown midway through append or step (here by an Admitter) leaves no entry behind") {
  const CacheShape shape{2, 2, 2, 2};
  using C = Cache<score::RetentionDecay, ThrowingAdmitter, evict::PerHead<trigger::Buffered>, memory::Paged<2>, cpu_backend>;
  C cache(shape, memory::Paged<2>(32), evict::PerHead<trigger::Buffered>{trigger::Buffered{4, 2}});
  cache.add_sequence(0);
  std::vector<float> k(static_cast<std::size_t>(2 * 2 * 2 * 2), 1.0f), lb(8, -0.25f);
  cache.step(0, View<const float, 4>(k.data(), {2, 2, 2, 2}), View<const float, 4>(k.data(), {2, 2, 2, 2}),
             View<const float, 3>(lb.data(), {2, 2, 2}));  // positions 0, 1
  const auto before = testing::snapshot(cache, {0}, false);
  lb[static_cast<std::size_t>((1 * 2 + 1) * 2 + 0)] = -0.5f;  // layer 1, head 1, position 2: the admitter throws
  CHECK_THROWS_AS(cache.step(0, View<const float, 4>(k.data(), {2, 2, 2, 2}), View<const float, 4>(k.data(), {2, 2, 2, 2}),
                             View<const float, 3>(lb.data(), {2, 2, 2})),
                  std::runtime_error);
  CHECK(testing::snapshot(cache, {0}, false) == before);
  // the layer API: layer 0 goes in, layer 1 fails at its second head; layer 0 stays, layer 1 leaves nothing
  cache.append(0, 0, View<const float, 3>(k.data(), {2, 2, 2}), View<const float, 3>(k.data(), {2, 2, 2}),
               View<const float, 2>(lb.data(), {2, 2}));
  const auto open = testing::snapshot(cache, {0}, false);
  CHECK_THROWS_AS(cache.append(0, 1, View<const float, 3>(k.data(), {2, 2, 2}), View<const float, 3>(k.data(), {2, 2, 2}),
                               View<const float, 2>(lb.data() + 4, {2, 2})),
                  std::runtime_error);
  CHECK(testing::snapshot(cache, {0}, false) == open);
  cache.abort_step(0);
  CHECK(testing::snapshot(cache, {0}, false) == before);
}
