// SPEC §1–2 numerics: logsigmoid, the lookahead ratio, storage dtypes, and every score by hand.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/math.hpp"
#include "kvpolicy/parts/score/retention.hpp"

using namespace kvpolicy;

TEST_CASE("logsigmoid is stable and exact on both tails") {
  for (double z : {-100.0, -20.0, -1.0, -1e-3, 0.0, 1e-3, 1.0, 20.0, 100.0}) {
    const double ref = -std::log1p(std::exp(-z));
    CHECK(math::logsigmoid(static_cast<float>(z)) == doctest::Approx(ref).epsilon(1e-6));
  }
  CHECK(math::logsigmoid(0.0f) == doctest::Approx(-std::log(2.0)));
  CHECK(math::logsigmoid(-200.0f) == doctest::Approx(-200.0f));  // naive log(sigmoid) gives -inf
  CHECK(math::logsigmoid(200.0f) == 0.0f);
  CHECK(math::logsigmoid(-std::numeric_limits<float>::infinity()) == -std::numeric_limits<float>::infinity());
  CHECK(math::logsigmoid(std::numeric_limits<float>::infinity()) == 0.0f);
}

TEST_CASE("lookahead ratio: log((1-beta^h)/(1-beta)) via expm1 (SPEC §2, Eq. 9)") {
  CHECK(math::lookahead_log_ratio(-0.7f, 1) == 0.0f);
  CHECK(math::lookahead_log_ratio(0.0f, 5) == doctest::Approx(std::log(5.0)));
  // beta = 0.5, h = 2: (1 - 0.25) / (1 - 0.5) = 1.5
  CHECK(math::lookahead_log_ratio(static_cast<float>(std::log(0.5)), 2) == doctest::Approx(std::log(1.5)));
  // beta = 0.9, h = 3: 1 + 0.9 + 0.81
  CHECK(math::lookahead_log_ratio(static_cast<float>(std::log(0.9)), 3) == doctest::Approx(std::log(2.71)));
  // beta within 1e-8 of 1: the naive fp32 form divides 0 by 0; the ratio tends to log(h).
  CHECK(math::lookahead_log_ratio(-1e-8f, 4) == doctest::Approx(std::log(4.0)).epsilon(1e-6));
  CHECK(math::lookahead_log_ratio(-1e-30f, 4) == doctest::Approx(std::log(4.0)));
  CHECK(math::lookahead_log_ratio(-std::numeric_limits<float>::infinity(), 3) == 0.0f);  // beta -> 0: G = beta^e
}

TEST_CASE("fp16 and bf16 conversion rounds to nearest even and keeps specials") {
  CHECK(to_float(from_float<half>(1.0f)) == 1.0f);
  CHECK(to_float(from_float<half>(65504.0f)) == 65504.0f);
  CHECK(std::isinf(to_float(from_float<half>(65520.0f))));
  CHECK(to_float(from_float<half>(5.9604644775390625e-8f)) == 5.9604644775390625e-8f);  // smallest subnormal
  CHECK(to_float(from_float<half>(1.0f + 1.0f / 2048)) == 1.0f);                        // tie -> even
  CHECK(to_float(from_float<half>(1.0f + 3.0f / 2048)) == 1.0f + 2.0f / 1024);          // tie -> even (up)
  CHECK(std::isnan(to_float(from_float<half>(std::nanf("")))));
  CHECK(to_float(from_float<bfloat16>(1.0f)) == 1.0f);
  CHECK(to_float(from_float<bfloat16>(1.0f + 1.0f / 256)) == 1.0f);  // tie -> even
  CHECK(to_float(from_float<bfloat16>(-3.5f)) == -3.5f);
  CHECK(std::isnan(to_float(from_float<bfloat16>(std::nanf("")))));
  CHECK(to_float(from_float<half>(65519.99f)) == 65504.0f);
  CHECK(to_float(from_float<half>(-65504.0f)) == -65504.0f);
  CHECK(std::isinf(to_float(from_float<bfloat16>(3.4e38f))));  // rounds past bf16's largest finite
  CHECK(to_float(from_float<bfloat16>(-1.0f - 3.0f / 256)) == -1.0f - 4.0f / 256);  // tie -> even, negative
#if defined(__FLT16_MAX__)
  // every float rounds as the compiler's own _Float16 conversion does (RNE, subnormals, overflow)
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = bits(rng);
    if (i % 2) u = (u & 0x80000000u) | (0x33000000u + u % 0x0f000000u);  // half's range, subnormals included
    const float f = dtype::bits_float(u);
    if (std::isnan(f)) continue;
    const auto want = static_cast<float>(static_cast<_Float16>(f));
    REQUIRE_MESSAGE(to_float(from_float<half>(f)) == want, "float bits ", u);
  }
#endif
  // every half bit pattern survives half -> float -> half
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = dtype::half_to_float(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) continue;
    CHECK_EQ(dtype::float_to_half(f), static_cast<std::uint16_t>(b));
  }
}

TEST_CASE("scores by hand (SPEC §1–2)") {
  const EntryMeta m{10, -0.5f, 4.0f};
  const StepContext c{20};  // e = n + 1 - p = 11
  CHECK(score::RetentionDecay{}(m, c) == doctest::Approx(-5.5));
  CHECK(score::KNormRetention{}(m, c) == doctest::Approx(-5.5 + std::log(4.0)));
  CHECK(score::KNormRetention{}(EntryMeta{10, -0.5f, 0.0f}, c) == doctest::Approx(-5.5 + std::log(1e-12)));
  CHECK(score::Lookahead{1}(m, c) == score::RetentionDecay{}(m, c));
  // h = 2: log(beta^11 + beta^12)
  const double beta = std::exp(-0.5);
  CHECK(score::Lookahead{2}(m, c) == doctest::Approx(std::log(std::pow(beta, 11) + std::pow(beta, 12))));
  // beta = 1: every entry scores 0 under TRIM-KV, log(h) under lookahead
  CHECK(score::RetentionDecay{}(EntryMeta{0, 0.0f, 1.0f}, c) == 0.0f);
  CHECK(score::Lookahead{3}(EntryMeta{0, 0.0f, 1.0f}, c) == doctest::Approx(std::log(3.0)));
  CHECK(score::RetentionDecay{}(EntryMeta{0, -std::numeric_limits<float>::infinity(), 1.0f}, c) ==
        -std::numeric_limits<float>::infinity());
  CHECK_THROWS_WITH_AS(score::Lookahead{0}.validate(), doctest::Contains("horizon h = 0"), Error);
}
