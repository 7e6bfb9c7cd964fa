// cpu/attention.hpp (SPEC §6): the paged ragged path against the dense reference — GQA, ragged
// lengths, partly filled pages, causal prefill chunks, float/fp16/bf16 storage, fp32 accumulation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kvpolicy/cpu/attention.hpp"
#include "kvpolicy/memory/paged.hpp"

using namespace kvpolicy;

namespace {

double rel_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// One kv head of `n` keys (positions 0..n-1) stored paged; queries at the given positions.
template <class Storage>
void check_head(std::mt19937_64& rng, std::int64_t n, int G, int d, std::int64_t T, double tol_vs_fp32) {
  std::normal_distribution<float> normal;
  const CacheShape shape{1, 1, G, d};
  memory::Paged<16, Storage> a(static_cast<std::int64_t>((n + 15) / 16) + 1);
  a.bind(shape);
  a.add_sequence(0);
  std::vector<float> k(static_cast<std::size_t>(n * d)), v(k.size());
  for (auto& x : k) x = normal(rng);
  for (auto& x : v) x = normal(rng);
  std::vector<EntryMeta> m;
  for (std::int64_t i = 0; i < n; ++i) m.push_back({static_cast<std::int32_t>(i), 0.0f, 0.0f});
  a.append(0, 0, 0, n, k.data(), v.data(), m.data());

  std::vector<float> q(static_cast<std::size_t>(G * T * d));
  for (auto& x : q) x = normal(rng);
  std::vector<std::int32_t> q_pos(static_cast<std::size_t>(T)), key_pos(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < T; ++t) q_pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(n - T + t);
  for (std::int64_t i = 0; i < n; ++i) key_pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);

  std::vector<float> out(q.size(), std::nanf(""));  // poisoned: every element must be written
  cpu::attend_paged(a.pool(), a.layout(0, 0, 0), 0, G, View<const float, 3>(q.data(), {G, T, d}), q_pos,
                    View<float, 3>(out.data(), {G, T, d}));

  // dense reference over (a) the stored values widened to fp32, (b) the original fp32 values
  std::vector<float> ks(k.size()), vs(v.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    ks[i] = to_float(from_float<Storage>(k[i]));
    vs[i] = to_float(from_float<Storage>(v[i]));
  }
  std::vector<float> ref_stored(q.size()), ref_fp32(q.size());
  for (int g = 0; g < G; ++g) {
    const auto qv = View<const float, 2>(q.data() + g * T * d, {T, d});
    cpu::attend_dense(qv, View<const float, 2>(ks.data(), {n, d}), View<const float, 2>(vs.data(), {n, d}), key_pos, q_pos,
                      View<float, 2>(ref_stored.data() + g * T * d, {T, d}));
    cpu::attend_dense(qv, View<const float, 2>(k.data(), {n, d}), View<const float, 2>(v.data(), {n, d}), key_pos, q_pos,
                      View<float, 2>(ref_fp32.data() + g * T * d, {T, d}));
  }
  for (float x : out) REQUIRE(std::isfinite(x));
  CHECK(rel_error(out, ref_stored) <= 1e-5);
  CHECK(rel_error(out, ref_fp32) <= tol_vs_fp32);
}

}  // namespace

TEST_CASE("dense reference by hand") {
  // one key: the output is its value; two keys with equal logits: the mean of the values
  const float q[2] = {1, 0}, k[4] = {0, 1, 0, 1}, v[4] = {2, 4, 6, 8};
  const std::int32_t kp[2] = {0, 1}, qp[1] = {5};
  float out[2];
  cpu::attend_dense(View<const float, 2>(q, {1, 2}), View<const float, 2>(k, {1, 2}), View<const float, 2>(v, {1, 2}),
                    std::span(kp, 1), std::span(qp, 1), View<float, 2>(out, {1, 2}));
  CHECK(out[0] == 2.0f);
  CHECK(out[1] == 4.0f);
  cpu::attend_dense(View<const float, 2>(q, {1, 2}), View<const float, 2>(k, {2, 2}), View<const float, 2>(v, {2, 2}),
                    std::span(kp, 2), std::span(qp, 1), View<float, 2>(out, {1, 2}));
  CHECK(out[0] == doctest::Approx(4.0f));
  CHECK(out[1] == doctest::Approx(6.0f));
  // unequal logits: q = (1, 0), keys (1, 0) and (0, 0), d = 2: weights e^(1/sqrt 2) : 1
  {
    const float k2[4] = {1, 0, 0, 0};
    cpu::attend_dense(View<const float, 2>(q, {1, 2}), View<const float, 2>(k2, {2, 2}), View<const float, 2>(v, {2, 2}),
                      std::span(kp, 2), std::span(qp, 1), View<float, 2>(out, {1, 2}));
    const double w = std::exp(1.0 / std::sqrt(2.0)), p0 = w / (w + 1), p1 = 1 / (w + 1);
    CHECK(out[0] == doctest::Approx(p0 * 2 + p1 * 6));
    CHECK(out[1] == doctest::Approx(p0 * 4 + p1 * 8));
    // the paged path on the same entries
    memory::Paged<1> a(4);
    a.bind(CacheShape{1, 1, 1, 2});
    a.add_sequence(0);
    const EntryMeta m[2] = {{0, 0.0f, 0.0f}, {1, 0.0f, 0.0f}};
    a.append(0, 0, 0, 2, k2, v, m);
    float paged[2];
    cpu::attend_paged(a.pool(), a.layout(0, 0, 0), 0, 1, View<const float, 3>(q, {1, 1, 2}), std::span(qp, 1),
                      View<float, 3>(paged, {1, 1, 2}));
    CHECK(paged[0] == doctest::Approx(p0 * 2 + p1 * 6));
    CHECK(paged[1] == doctest::Approx(p0 * 4 + p1 * 8));
    // a query that sees none of the keys gets zeros on the paged path too
    const std::int32_t before[1] = {-1};
    cpu::attend_paged(a.pool(), a.layout(0, 0, 0), 0, 1, View<const float, 3>(q, {1, 1, 2}), std::span(before, 1),
                      View<float, 3>(paged, {1, 1, 2}));
    CHECK(paged[0] == 0.0f);
    CHECK(paged[1] == 0.0f);
  }
  // a query that sees no key (all keys in its future) gets zeros
  const std::int32_t early[1] = {-1};
  cpu::attend_dense(View<const float, 2>(q, {1, 2}), View<const float, 2>(k, {2, 2}), View<const float, 2>(v, {2, 2}),
                    std::span(kp, 2), std::span(early, 1), View<float, 2>(out, {1, 2}));
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == 0.0f);
}

TEST_CASE("paged ragged attention matches the dense reference: fp32, fp16, bf16, GQA, causal chunks") {
  std::mt19937_64 rng(42);
  for (std::int64_t n : {1, 2, 15, 16, 17, 100, 257, 1000}) {
    for (int G : {1, 4}) {
      const std::int64_t T = std::min<std::int64_t>(n, n % 3 == 0 ? 1 : 5);  // decode and causal prefill chunks
      check_head<float>(rng, n, G, 32, T, 1e-5);
      check_head<half>(rng, n, G, 32, T, 2e-3);
      check_head<bfloat16>(rng, n, G, 64, T, 1e-2);
    }
  }
}
