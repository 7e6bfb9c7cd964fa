// cache.hpp end to end on the CPU: the TRIM-KV decode invariant, chunked prefill, attention over the
// survivors, several sequences in one pool, and every rejected call leaving the cache unchanged.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/trimkv.hpp"
#include "snapshot.hpp"

using namespace kvpolicy;

namespace {

struct StepData {
  std::int64_t T;
  std::vector<float> k, v, lb, q, out;
};

StepData random_step(std::mt19937_64& rng, const CacheShape& s, std::int64_t T) {
  std::normal_distribution<float> normal;
  StepData d{T, {}, {}, {}, {}, {}};
  const auto kv = static_cast<std::size_t>(s.layers * s.kv_heads * T * s.head_dim);
  d.k.resize(kv);
  d.v.resize(kv);
  for (auto& x : d.k) x = normal(rng);
  for (auto& x : d.v) x = normal(rng);
  d.lb.resize(static_cast<std::size_t>(s.layers * s.kv_heads * T));
  for (auto& x : d.lb) x = -std::uniform_real_distribution<float>(0.0f, 0.2f)(rng);
  d.q.resize(static_cast<std::size_t>(s.layers * s.q_heads * T * s.head_dim));
  for (auto& x : d.q) x = normal(rng);
  d.out.assign(d.q.size(), std::nanf(""));
  return d;
}

template <class C>
EvictionReport run(C& cache, std::int64_t seq, StepData& d, bool attend = true) {
  const auto& s = cache.shape();
  const std::int64_t L = s.layers, H = s.kv_heads, Hq = s.q_heads, T = d.T, D = s.head_dim;
  return cache.step(seq, View<const float, 4>(d.k.data(), {L, H, T, D}), View<const float, 4>(d.v.data(), {L, H, T, D}),
                    View<const float, 3>(d.lb.data(), {L, H, T}),
                    attend ? View<const float, 4>(d.q.data(), {L, Hq, T, D}) : View<const float, 4>{},
                    attend ? View<float, 4>(d.out.data(), {L, Hq, T, D}) : View<float, 4>{});
}

using testing::snapshot;

// The layer API: append `layer`'s share of step d to `seq`, then attend its queries into d.out.
template <class C>
void append_attend(C& cache, std::int64_t seq, int layer, StepData& d) {
  const auto& s = cache.shape();
  const std::int64_t H = s.kv_heads, Hq = s.q_heads, T = d.T, D = s.head_dim, l = layer;
  cache.append(seq, layer, View<const float, 3>(d.k.data() + l * H * T * D, {H, T, D}),
               View<const float, 3>(d.v.data() + l * H * T * D, {H, T, D}),
               View<const float, 2>(d.lb.data() + l * H * T, {H, T}));
  cache.attend(seq, layer, View<const float, 3>(d.q.data() + l * Hq * T * D, {Hq, T, D}),
               View<float, 3>(d.out.data() + l * Hq * T * D, {Hq, T, D}));
}

// Dense attention over what `layer` of `seq` holds now (the entries as stored, widened to fp32):
// the layer's queries q [Hq, T, d] at positions tokens(seq).. -> out [Hq, T, d].
template <class C>
void dense_layer(const C& cache, std::int64_t seq, int layer, std::int64_t T, const float* q, float* out) {
  const auto& shape = cache.shape();
  const std::int64_t D = shape.head_dim;
  for (int h = 0; h < shape.kv_heads; ++h) {
    const auto head = cache.allocator().layout(seq, layer, h);
    std::vector<float> ks, vs;
    std::vector<std::int32_t> kp, qp;
    for (std::int64_t i = 0; i < head.length; ++i) {
      const auto slot = head.slot(i);
      for (std::int64_t c = 0; c < D; ++c) {
        ks.push_back(to_float(cache.allocator().pool().key(slot)[c]));
        vs.push_back(to_float(cache.allocator().pool().value(slot)[c]));
      }
      kp.push_back(cache.allocator().pool().meta(slot).position);
    }
    for (std::int64_t t = 0; t < T; ++t) qp.push_back(static_cast<std::int32_t>(cache.tokens(seq) + t));
    for (int g = 0; g < shape.group(); ++g) {
      const std::int64_t qh = h * shape.group() + g;
      cpu::attend_dense(View<const float, 2>(q + qh * T * D, {T, D}), View<const float, 2>(ks.data(), {head.length, D}),
                        View<const float, 2>(vs.data(), {head.length, D}), kp, qp, View<float, 2>(out + qh * T * D, {T, D}));
    }
  }
}

double rel_error(const float* a, const float* ref, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

TEST_CASE("TRIM-KV decode: never more than M + B - 1 entries per head after a decode step") {
  const CacheShape shape{2, 2, 4, 8};
  const std::int64_t M = 16, B = 4;
  TrimKVCache<> cache(shape, memory::Paged<16>(pages_for(shape, M + B + 40, 1, 16)), trimkv_evictor({.budget = M, .buffer = B}));
  cache.add_sequence(0);
  std::mt19937_64 rng(1);
  auto prefill = random_step(rng, shape, 40);  // a chunk larger than M + B: the trigger brings it to M
  const auto r = run(cache, 0, prefill);
  CHECK(r.triggered);
  CHECK(r.evicted == shape.heads_total() * (40 - M));
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) CHECK(cache.length(0, l, h) == M);
  int triggers = 0;
  for (int step = 0; step < 200; ++step) {
    auto d = random_step(rng, shape, 1);
    triggers += run(cache, 0, d).triggered;
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h) REQUIRE(cache.length(0, l, h) <= M + B - 1);
  }
  CHECK(triggers == 200 / B);  // the buffer amortises eviction: once every B decode steps
  CHECK(cache.tokens(0) == 240);
  CHECK(cache.allocator().pages_free() + cache.allocator().pages_used(0) == cache.allocator().pages_total());
}

TEST_CASE("attention through the cache equals dense attention over the survivors (and the full cache before eviction)") {
  const CacheShape shape{2, 2, 6, 16};
  for (int variant = 0; variant < 2; ++variant) {
    std::mt19937_64 rng(7 + variant);
    TrimKVCache<cpu_backend, float, 8> cache(shape, memory::Paged<8>(400), trimkv_evictor({.budget = 12, .buffer = 5}));
    TrimKVCache<cpu_backend, float, 8> full(shape, memory::Paged<8>(400), trimkv_evictor({.budget = 100000, .buffer = 1}));
    cache.add_sequence(3);
    full.add_sequence(3);
    for (int step = 0; step < 60; ++step) {
      const std::int64_t T = (step % 13 == 0) ? 1 + step % 7 : 1;
      auto d = random_step(rng, shape, T);
      auto e = d;
      // dense reference: gather this layer's survivors (after this step's append) and attend densely
      std::vector<float> want(d.q.size());
      {
        run(full, 3, e);  // full cache: nothing ever evicted
      }
      // cache under test: attend via the layer API so the survivors can be read between append and commit
      const std::int64_t L = shape.layers, Hq = shape.q_heads, D = shape.head_dim;
      for (int l = 0; l < L; ++l) {
        append_attend(cache, 3, l, d);
        dense_layer(cache, 3, l, T, d.q.data() + l * Hq * T * D, want.data() + l * Hq * T * D);
      }
      cache.commit(3);
      for (float x : d.out) REQUIRE(std::isfinite(x));
      CHECK(rel_error(d.out.data(), want.data(), want.size()) <= 1e-5);
      if (step < 12) CHECK(rel_error(d.out.data(), e.out.data(), want.size()) <= 1e-5);  // nothing evicted yet
    }
  }
}

TEST_CASE("flash-decoding through the cache: heads of several ranges equal dense attention, the same bits on any thread count") {
  // 3 kv heads of up to 1,700 entries (over 3 ranges of cpu_backend::decode_range), G = 2, fp16:
  // decode steps of T = 1 and 4 (G·T <= 8: split into ranges) and T = 5 (10 rows: one task a head)
  static_assert(cpu_backend::decode_range < 1500);
  const CacheShape shape{2, 3, 6, 32};
  const std::int64_t L = shape.layers, Hq = shape.q_heads, D = shape.head_dim;
  std::vector<std::vector<float>> outs;
#ifdef _OPENMP
  const std::initializer_list<int> thread_counts{1, 2};
#else
  const std::initializer_list<int> thread_counts{1};  // one thread only: nothing to compare across counts
#endif
  for (const int threads : thread_counts) {
#ifdef _OPENMP
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
#endif
    std::mt19937_64 rng(31);
    TrimKVCache<cpu_backend, half> cache(shape, memory::Paged<16, half>(800), trimkv_evictor({.budget = 100000, .buffer = 1}));
    cache.add_sequence(0);
    std::vector<float> all;
    for (const std::int64_t T : {std::int64_t{600}, std::int64_t{900}, std::int64_t{1}, std::int64_t{4}, std::int64_t{5},
                                 std::int64_t{1}, std::int64_t{200}, std::int64_t{1}}) {
      auto d = random_step(rng, shape, T);
      std::vector<float> want(d.q.size());
      for (int l = 0; l < L; ++l) {
        append_attend(cache, 0, l, d);
        dense_layer(cache, 0, l, T, d.q.data() + l * Hq * T * D, want.data() + l * Hq * T * D);
      }
      cache.commit(0);
      CAPTURE(threads);
      CAPTURE(T);
      for (float x : d.out) REQUIRE(std::isfinite(x));
      CHECK(rel_error(d.out.data(), want.data(), want.size()) <= 1e-5);
      all.insert(all.end(), d.out.begin(), d.out.end());
    }
    outs.push_back(all);
#ifdef _OPENMP
    omp_set_num_threads(before);
#endif
  }
  for (std::size_t i = 1; i < outs.size(); ++i) {
    REQUIRE(outs[0].size() == outs[i].size());
    CHECK(std::memcmp(outs[0].data(), outs[i].data(), outs[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("several sequences share one pool, and removing one returns its pages") {
  const CacheShape shape{1, 2, 2, 4};
  DBTrimKVCache<cpu_backend, float, 4> cache(shape, memory::Paged<4>(64), dbtrimkv_evictor({.budget = 4, .buffer = 2}));
  std::mt19937_64 rng(3);
  for (std::int64_t seq : {5, 9, 2}) cache.add_sequence(seq);
  for (int step = 0; step < 30; ++step) {
    std::vector<StepData> data;
    std::vector<DBTrimKVCache<cpu_backend, float, 4>::SequenceStep> batch;
    for (std::int64_t seq : {5, 9, 2}) data.push_back(random_step(rng, shape, seq == 9 && step == 0 ? 7 : 1));
    std::size_t i = 0;
    for (std::int64_t seq : {5, 9, 2}) {
      auto& d = data[i++];
      batch.push_back({seq, View<const float, 4>(d.k.data(), {1, 2, d.T, 4}), View<const float, 4>(d.v.data(), {1, 2, d.T, 4}),
                       View<const float, 3>(d.lb.data(), {1, 2, d.T}), View<const float, 4>(d.q.data(), {1, 2, d.T, 4}),
                       View<float, 4>(d.out.data(), {1, 2, d.T, 4})});
    }
    cache.step_batch(batch);
    for (std::int64_t seq : {5, 9, 2}) REQUIRE(cache.total_length(seq) < 2 * (4 + 2));  // global: < L Hkv (M + B)
  }
  CHECK(cache.tokens(9) == 36);
  const auto used = cache.allocator().pages_used(5) + cache.allocator().pages_used(9) + cache.allocator().pages_used(2);
  CHECK(cache.allocator().pages_free() + used == 64);
  const auto freed = cache.allocator().pages_used(9);
  const auto free_before = cache.allocator().pages_free();
  cache.remove_sequence(9);
  CHECK(cache.allocator().pages_free() == free_before + freed);
  CHECK_THROWS_WITH_AS(cache.tokens(9), doctest::Contains("unknown sequence 9"), Error);
  // every read of a removed sequence is the Cache's error, as on the device
  CHECK_THROWS_WITH_AS(cache.length(9, 0, 0), doctest::Contains("Cache: unknown sequence 9"), Error);
  CHECK_THROWS_WITH_AS(cache.total_length(9), doctest::Contains("Cache: unknown sequence 9"), Error);
  CHECK_THROWS_WITH_AS(cache.entry(9, 0, 0, 0), doctest::Contains("Cache: unknown sequence 9"), Error);
  CHECK_THROWS_WITH_AS(cache.head_contents(9, 0, 0), doctest::Contains("Cache: unknown sequence 9"), Error);
}

TEST_CASE("every rejected call leaves the cache exactly as it was (SPEC §7)") {
  const CacheShape shape{2, 2, 4, 4};
  using Small = TrimKVCache<cpu_backend, float, 4>;
  Small cache(shape, memory::Paged<4>(14), trimkv_evictor({.budget = 4, .buffer = 2}));
  cache.add_sequence(1);
  cache.add_sequence(2);
  std::mt19937_64 rng(11);
  for (int i = 0; i < 5; ++i) {
    auto d = random_step(rng, shape, 1);
    run(cache, 1, d);
  }
  const std::vector<std::int64_t> seqs{1, 2};
  const auto before = snapshot(cache, seqs);
  auto expect_unchanged = [&](auto&& call, const char* message) {
    CHECK_THROWS_WITH_AS(call(), doctest::Contains(message), Error);
    CHECK(snapshot(cache, seqs) == before);
  };
  const std::int64_t L = 2, H = 2, D = 4;
  auto d = random_step(rng, shape, 3);
  auto view4 = [&](std::vector<float>& v, std::int64_t T) { return View<const float, 4>(v.data(), {L, H, T, D}); };
  auto lb3 = [&](std::vector<float>& v, std::int64_t T) { return View<const float, 3>(v.data(), {L, H, T}); };

  expect_unchanged([&] { cache.step(7, view4(d.k, 3), view4(d.v, 3), lb3(d.lb, 3)); }, "unknown sequence 7");
  expect_unchanged([&] { cache.step(1, View<const float, 4>(d.k.data(), {L, H, 3, 2}), view4(d.v, 3), lb3(d.lb, 3)); },
                   "keys has shape [2, 2, 3, 2], expected [2, 2, 3, 4]");
  expect_unchanged([&] { cache.step(1, view4(d.k, 3), view4(d.v, 3), View<const float, 3>(d.lb.data(), {L, H, 2})); },
                   "log_beta has shape");
  auto bad = d;
  bad.lb[7] = std::nanf("");
  expect_unchanged([&] { cache.step(1, view4(bad.k, 3), view4(bad.v, 3), lb3(bad.lb, 3)); }, "= nan is not in [-inf, 0]");
  bad = d;
  bad.lb[11] = 0.25f;
  expect_unchanged([&] { cache.step(1, view4(bad.k, 3), view4(bad.v, 3), lb3(bad.lb, 3)); },
                   "log_beta[layer 1, head 1, token 2 of the step (position 7)] = 0.25");
  bad = d;
  bad.v[40] = std::numeric_limits<float>::infinity();
  expect_unchanged([&] { cache.step(1, view4(bad.k, 3), view4(bad.v, 3), lb3(bad.lb, 3)); }, "not finite in float32 at flat index 16");
  expect_unchanged([&] { cache.step(1, view4(d.k, 3), view4(d.v, 3), lb3(d.lb, 3), View<const float, 4>(d.q.data(), {L, 4, 3, D}), View<float, 4>{}); },
                   "out has shape [0, 0, 0, 0]");
  // the pool: 14 pages of 4; sequence 1 holds 5 tokens in 4 heads (8 pages, 6 free). 4 more tokens
  // in sequence 1 (4 pages) fit, and so do 4 in sequence 2 (4 pages), but not both; 9 never fit.
  auto big = random_step(rng, shape, 9);
  expect_unchanged([&] { cache.step(2, view4(big.k, 9), view4(big.v, 9), lb3(big.lb, 9)); }, "out of memory");
  auto d2 = random_step(rng, shape, 4);
  auto d1 = random_step(rng, shape, 4);
  std::vector<Small::SequenceStep> batch{{1, view4(d1.k, 4), view4(d1.v, 4), lb3(d1.lb, 4)},
                                                 {2, view4(d2.k, 4), view4(d2.v, 4), lb3(d2.lb, 4)}};
  expect_unchanged([&] { cache.step_batch(batch); }, "the batch needs 8 pages, 6 of 14 are free");
  batch[1].seq = 1;
  expect_unchanged([&] { cache.step_batch(batch); }, "sequence 1 appears twice");
  // layer API misuse
  expect_unchanged([&] { cache.commit(1); }, "has no open step");
  expect_unchanged([&] { cache.append(1, 2, View<const float, 3>(d.k.data(), {H, 3, D}), View<const float, 3>(d.v.data(), {H, 3, D}), View<const float, 2>(d.lb.data(), {H, 3})); },
                   "layer 2 out of range [0, 2)");
  std::vector<float> o(64);
  expect_unchanged([&] { cache.attend(1, 0, View<const float, 3>(d.q.data(), {4, 1, D}), View<float, 3>(o.data(), {4, 1, D})); },
                   "has not been appended in this step");
  CHECK_THROWS_WITH_AS(Small(shape, memory::Paged<4>(4), trimkv_evictor({.budget = 0})), doctest::Contains("budget M = 0"), Error);
  CHECK_THROWS_WITH_AS(Small(CacheShape{1, 2, 3, 4}, memory::Paged<4>(4)), doctest::Contains("q_heads = 3"), Error);

  // an open step: mismatched T and a repeated layer are rejected without touching the open step
  cache.append(1, 0, View<const float, 3>(d.k.data(), {H, 3, D}), View<const float, 3>(d.v.data(), {H, 3, D}), View<const float, 2>(d.lb.data(), {H, 3}));
  const auto open = snapshot(cache, seqs);
  CHECK_THROWS_WITH_AS(cache.append(1, 1, View<const float, 3>(d.k.data(), {H, 2, D}), View<const float, 3>(d.v.data(), {H, 2, D}), View<const float, 2>(d.lb.data(), {H, 2})),
                       doctest::Contains("step has T = 3 tokens, this layer has T = 2"), Error);
  CHECK_THROWS_WITH_AS(cache.append(1, 0, View<const float, 3>(d.k.data(), {H, 3, D}), View<const float, 3>(d.v.data(), {H, 3, D}), View<const float, 2>(d.lb.data(), {H, 3})),
                       doctest::Contains("layer 0 of sequence 1 was already appended"), Error);
  CHECK_THROWS_WITH_AS(cache.commit(1), doctest::Contains("layer 1 of sequence 1 was not appended"), Error);
  CHECK(snapshot(cache, seqs) == open);
}

TEST_CASE("fp16 and bf16 storage caches run the same policy") {
  const CacheShape shape{1, 2, 4, 8};
  TrimKVCache<cpu_backend, half> c16(shape, memory::Paged<16, half>(64), trimkv_evictor({.budget = 8, .buffer = 2}));
  TrimKVCache<cpu_backend, bfloat16> cb16(shape, memory::Paged<16, bfloat16>(64), trimkv_evictor({.budget = 8, .buffer = 2}));
  TrimKVCache<> c32(shape, memory::Paged<16>(64), trimkv_evictor({.budget = 8, .buffer = 2}));
  c16.add_sequence(0);
  cb16.add_sequence(0);
  c32.add_sequence(0);
  std::mt19937_64 rng(9);
  for (int step = 0; step < 40; ++step) {
    auto d = random_step(rng, shape, 1);
    auto a = d, b = d;
    run(c32, 0, d);
    run(c16, 0, a);
    run(cb16, 0, b);
    // survivors depend only on log_beta and positions: identical whatever the storage
    for (int h = 0; h < 2; ++h) {
      std::vector<std::int32_t> p32, p16, pb;
      for (std::int64_t i = 0; i < c32.length(0, 0, h); ++i) p32.push_back(c32.entry(0, 0, h, i).position);
      for (std::int64_t i = 0; i < c16.length(0, 0, h); ++i) p16.push_back(c16.entry(0, 0, h, i).position);
      for (std::int64_t i = 0; i < cb16.length(0, 0, h); ++i) pb.push_back(cb16.entry(0, 0, h, i).position);
      CHECK(p16 == p32);
      CHECK(pb == p32);
    }
    CHECK(rel_error(a.out.data(), d.out.data(), d.out.size()) <= 2e-3);
    CHECK(rel_error(b.out.data(), d.out.data(), d.out.size()) <= 1e-2);
  }
}

TEST_CASE("values that are finite in fp32 but not in the storage dtype, non-finite queries, overflowing key norms") {
  const CacheShape shape{1, 1, 1, 2};
  TrimKVCache<cpu_backend, half> c16(shape, memory::Paged<16, half>(4), trimkv_evictor({.budget = 4, .buffer = 1}));
  c16.add_sequence(0);
  std::vector<float> k{70000.0f, 1.0f}, v{1.0f, 1.0f}, lb{-0.5f}, q{1.0f, std::nanf("")}, out(2);
  auto kv = [](std::vector<float>& x) { return View<const float, 4>(x.data(), {1, 1, 1, 2}); };
  CHECK_THROWS_WITH_AS(c16.step(0, kv(k), kv(v), View<const float, 3>(lb.data(), {1, 1, 1})),
                       doctest::Contains("not finite in float16 at flat index 0 (key 70000"), Error);
  CHECK(c16.length(0, 0, 0) == 0);
  k[0] = 60000.0f;  // finite in fp16
  CHECK_THROWS_WITH_AS(c16.step(0, kv(k), kv(v), View<const float, 3>(lb.data(), {1, 1, 1}), kv(q), View<float, 4>(out.data(), {1, 1, 1, 2})),
                       doctest::Contains("queries hold nan at flat index 1"), Error);
  CHECK(c16.length(0, 0, 0) == 0);
  c16.step(0, kv(k), kv(v), View<const float, 3>(lb.data(), {1, 1, 1}));
  CHECK(c16.length(0, 0, 0) == 1);

  TrimKVKNormCache<> knorm(shape, memory::Paged<16>(4), trimkv_evictor({.budget = 4, .buffer = 1}));
  knorm.add_sequence(0);
  std::vector<float> big{3e38f, 3e38f};
  CHECK_THROWS_WITH_AS(knorm.step(0, kv(big), kv(v), View<const float, 3>(lb.data(), {1, 1, 1})),
                       doctest::Contains("the key's norm overflows fp32"), Error);
  CHECK(knorm.length(0, 0, 0) == 0);
}

namespace {
// Drops every token whose log_beta is below -1 at write time (a stand-in for write-time admission).
struct DropFastDecay {
  Admission admit(EntryMeta m) const { return m.write_score < -1.0f ? Admission::drop : Admission::keep; }
};
static_assert(Admitter<DropFastDecay>);
}  // namespace

TEST_CASE("an admitter's dropped tokens are never stored, and kept ones keep their positions") {
  const CacheShape shape{1, 1, 1, 2};
  Cache<score::RetentionDecay, DropFastDecay, evict::PerHead<>, memory::Paged<4>, cpu_backend> cache(
      shape, memory::Paged<4>(8), trimkv_evictor({.budget = 8, .buffer = 1}));
  cache.add_sequence(0);
  std::vector<float> k{1, 0, 0, 1, 1, 1}, lb{-0.5f, -2.0f, -0.1f};
  cache.step(0, View<const float, 4>(k.data(), {1, 1, 3, 2}), View<const float, 4>(k.data(), {1, 1, 3, 2}),
             View<const float, 3>(lb.data(), {1, 1, 3}));
  CHECK(cache.tokens(0) == 3);
  REQUIRE(cache.length(0, 0, 0) == 2);
  CHECK(cache.entry(0, 0, 0, 0).position == 0);
  CHECK(cache.entry(0, 0, 0, 1).position == 2);
  CHECK(cache.entry(0, 0, 0, 1).write_score == -0.1f);
  CHECK_THROWS_WITH_AS(cache.entry(0, 0, 0, 2), doctest::Contains("index 2 out of range [0, 2)"), Error);
}

TEST_CASE("layer API: out of memory for one layer, wrong query shapes, and step() during an open step") {
  const CacheShape shape{2, 1, 2, 2};
  using C = TrimKVCache<cpu_backend, float, 4>;
  C cache(shape, memory::Paged<4>(3), trimkv_evictor({.budget = 8, .buffer = 1}));
  cache.add_sequence(0);
  std::vector<float> k(2 * 5 * 2, 0.5f), lb(2 * 5, -0.1f), q(2 * 5 * 2, 1.0f), out(q.size());
  // 5 tokens take 2 pages per head: layer 0 fits (3 free), then layer 1 does not (1 free)
  cache.append(0, 0, View<const float, 3>(k.data(), {1, 5, 2}), View<const float, 3>(k.data(), {1, 5, 2}),
               View<const float, 2>(lb.data(), {1, 5}));
  CHECK_THROWS_WITH_AS(cache.append(0, 1, View<const float, 3>(k.data(), {1, 5, 2}), View<const float, 3>(k.data(), {1, 5, 2}),
                                    View<const float, 2>(lb.data(), {1, 5})),
                       doctest::Contains("out of memory: sequence 0 layer 1 cannot take 5"), Error);
  CHECK(cache.length(0, 1, 0) == 0);
  CHECK_THROWS_WITH_AS(cache.attend(0, 0, View<const float, 3>(q.data(), {2, 4, 2}), View<float, 3>(out.data(), {2, 4, 2})),
                       doctest::Contains("queries has shape [2, 4, 2], expected [2, 5, 2]"), Error);
  q[3] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(cache.attend(0, 0, View<const float, 3>(q.data(), {2, 5, 2}), View<float, 3>(out.data(), {2, 5, 2})),
                       doctest::Contains("queries hold inf at flat index 3"), Error);
  CHECK_THROWS_WITH_AS(cache.step(0, View<const float, 4>(k.data(), {2, 1, 1, 2}), View<const float, 4>(k.data(), {2, 1, 1, 2}),
                                  View<const float, 3>(lb.data(), {2, 1, 1})),
                       doctest::Contains("has a step open by append()"), Error);
  CHECK(cache.length(0, 0, 0) == 5);
  CHECK(cache.tokens(0) == 0);
}

TEST_CASE("shapes and evictor parameters are validated") {
  CHECK_THROWS_WITH_AS(CacheShape({0, 1, 1, 1}).validate(), doctest::Contains("layers = 0"), Error);
  CHECK_THROWS_WITH_AS(CacheShape({1, 1, 1, 0}).validate(), doctest::Contains("head_dim = 0"), Error);
  CHECK_THROWS_WITH_AS(CacheShape({1, 2, 1, 4}).validate(), doctest::Contains("q_heads = 1"), Error);
  CHECK_THROWS_WITH_AS(trimkv_evictor({.budget = 4, .window = -1}).validate(CacheShape{1, 1, 1, 1}),
                       doctest::Contains("window w = -1"), Error);
  CHECK_THROWS_WITH_AS(trimkv_evictor({.threshold = std::numeric_limits<double>::infinity()}).validate(CacheShape{1, 1, 1, 1}),
                       doctest::Contains("threshold alpha = inf"), Error);
}

TEST_CASE("sizing: pools sized by trimkv_pages and dbtrimkv_pages never run out, ragged heads included") {
  // 60 random geometries, budgets, chunk sizes and 1-3 sequences; heads of very different retention.
  // (Before the page per head, pages_for(M + B) ran a ragged DBTrimKV pool out in most such runs.)
  std::mt19937_64 rng(2026);
  auto draw = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng); };
  for (int run_index = 0; run_index < 60; ++run_index) {
    const int layers = static_cast<int>(draw(1, 3)), kv_heads = static_cast<int>(draw(1, 3));
    const CacheShape s{layers, kv_heads, kv_heads, 4};
    const std::int64_t M = draw(1, 12), B = draw(1, 6), C = draw(1, 8), sequences = draw(1, 3);
    const DBTrimKVConfig dc{.budget = M, .buffer = B};
    const TrimKVConfig tc{.budget = M, .buffer = B};
    using Pool = memory::Paged<4>;
    // the global rule (a floor in a third of the runs) and the layer-wise one, sized alike
    const DBTrimKVConfig fc{.budget = M, .buffer = B, .floor_ratio = run_index % 3 == 0 ? 0.5 : 0.0};
    DBTrimKVCache<cpu_backend, float, 4> global(s, Pool(dbtrimkv_pages<Pool>(s, fc, sequences, C)), dbtrimkv_evictor(fc));
    DBTrimKVLayerWiseCache<cpu_backend, float, 4> layer_wise(s, Pool(dbtrimkv_pages<Pool>(s, dc, sequences, C)),
                                                            dbtrimkv_layerwise_evictor(dc));
    TrimKVCache<cpu_backend, float, 4> per_head(s, Pool(trimkv_pages<Pool>(s, tc, sequences, C)), trimkv_evictor(tc));
    // heads of very different retention, so the global budget makes them ragged
    std::vector<float> head_scale(static_cast<std::size_t>(s.heads_total()));
    for (auto& x : head_scale) x = std::uniform_real_distribution<float>(0.0f, 0.5f)(rng);
    for (std::int64_t seq = 0; seq < sequences; ++seq) {
      global.add_sequence(seq);
      layer_wise.add_sequence(seq);
      per_head.add_sequence(seq);
    }
    for (int step = 0; step < 40; ++step)
      for (std::int64_t seq = 0; seq < sequences; ++seq) {
        auto d = random_step(rng, s, step == 0 ? C : draw(1, C));
        for (std::size_t i = 0; i < d.lb.size(); ++i) d.lb[i] *= 5.0f * head_scale[i / static_cast<std::size_t>(d.T)];
        auto again = d, third = d;
        REQUIRE_NOTHROW(run(global, seq, d, false));  // out of pages would throw here
        REQUIRE_NOTHROW(run(layer_wise, seq, third, false));
        REQUIRE_NOTHROW(run(per_head, seq, again, false));
      }
  }
}

TEST_CASE("sizing: the page size comes from the allocator, bytes from its storage type") {
  const CacheShape shape{2, 3, 6, 64};
  CHECK(memory::Paged<16>::pages_for(shape, 33, 2) == 2 * 6 * 3);
  CHECK(memory::Paged<4>::pages_for(shape, 33, 2) == 2 * 6 * 9);
  CHECK(trimkv_pages<memory::Paged<16>>(shape, {.budget = 256, .buffer = 32}, 1, 64) ==
        6 * ((256 + 32 - 1 + 64 + 15) / 16));
  // one page per head on top: ragged heads leave their last pages partly empty
  CHECK(dbtrimkv_pages<memory::Paged<16>>(shape, {.budget = 256, .buffer = 32}, 2) == 2 * ((6 * 288 + 15) / 16 + 6));
  const auto meta = static_cast<std::int64_t>(sizeof(EntryMeta));
  CHECK(memory::Paged<16>::bytes_for(shape, 10) == 10 * 16 * (2 * 64 * 4 + meta) + 10 * 4);
  CHECK(memory::Paged<16, half>::bytes_for(shape, 10) == 10 * 16 * (2 * 64 * 2 + meta) + 10 * 4);
  CHECK_THROWS_WITH_AS(trimkv_pages(shape, {.budget = 8, .buffer = 2, .threshold = 0.5}, 1),
                       doctest::Contains("trimkv_pages: the threshold variant (alpha = 0.5)"), Error);
  CHECK_THROWS_WITH_AS(dbtrimkv_pages(shape, {.budget = 8, .buffer = 0}, 1),
                       doctest::Contains("dbtrimkv_pages: budget M = 8, buffer B = 0"), Error);
  // the free pages_for names its page size: 0 would divide by zero
  CHECK(pages_for(shape, 33, 2, 16) == 2 * 6 * 3);
  CHECK_THROWS_WITH_AS(pages_for(shape, 33, 2, 0), doctest::Contains("pages_for: page_size = 0 must be >= 1"), Error);
  CHECK_THROWS_WITH_AS(pages_for(shape, -1, 2, 16), doctest::Contains("entries_per_head = -1"), Error);
}
