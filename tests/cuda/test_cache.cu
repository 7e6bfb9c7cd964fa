// The Cache composition on the GPU (Backend = cuda_backend) against the same composition on the
// CPU, driven by the same calls: TRIM-KV per head (window, threshold and its floor), DBTrimKV
// global (floor quotas, threshold) and layer-wise, fp32 and fp16 storage. After every step both caches hold the same
// entries in every head (positions and log_beta, bit for bit), report the same trigger and
// evicted count and list, and have the same free pages; decode attention agrees within 1e-5
// (fp32) / 2e-3 (fp16). Sequences come and go; a step taken back changes nothing; errors match.
// Below them, the CPU Cache's state-machine test, run on the device Cache.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvpolicy/core/dtype.hpp"
#include "nan_scorer.hpp"
#include "kvpolicy/cuda/backend.cuh"
#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/epikv.hpp"
#include "kvpolicy/policies/adakv.hpp"
#include "kvpolicy/policies/tova.hpp"
#include "kvpolicy/trimkv.hpp"
#include "kvpolicy/wgkv.hpp"
#include "drive.hpp"
#include "state_machine.hpp"
#include "test_scale.hpp"

namespace kp = kvpolicy;

using cudatest::drive;
using cudatest::DriveOptions;
using cudatest::heads_of;
using cudatest::tie_prone_log_beta;

TEST_CASE("TrimKVCache<cuda_backend> keeps, reports and attends as TrimKVCache<cpu_backend>") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(12); ++seed) {
    std::mt19937_64 rng(seed);
    const kp::CacheShape s{std::uniform_int_distribution<int>(1, 3)(rng), std::uniform_int_distribution<int>(1, 2)(rng), 0, 64};
    kp::CacheShape shape = s;
    shape.q_heads = shape.kv_heads * std::uniform_int_distribution<int>(1, 3)(rng);
    kp::TrimKVConfig c;
    c.budget = std::uniform_int_distribution<std::int64_t>(4, 40)(rng);
    c.buffer = std::uniform_int_distribution<std::int64_t>(1, 8)(rng);
    c.window = seed % 3 == 0 ? std::uniform_int_distribution<std::int64_t>(1, c.budget)(rng) : 0;
    // seed 1, which a simulator's thinned run keeps, draws the threshold and its floor (SPEC §1)
    c.threshold = seed % 4 == 1 ? 0.6 : 0.0;
    c.min_tokens = seed % 8 == 1 ? 5 : 0;
    const std::int64_t pages = 6 * shape.heads_total() * ((c.budget + c.buffer + 40) / 16 + 2);
    kp::TrimKVCache<kp::cpu_backend> cpu(shape, kp::memory::Paged<16>(pages), kp::trimkv_evictor(c));
    kp::TrimKVCache<kp::cuda_backend> gpu(shape, kp::memory::Paged<16>(pages), kp::trimkv_evictor(c));
    drive(cpu, gpu, shape, seed, 1e-5);
  }
}

TEST_CASE("DBTrimKVCache<cuda_backend> (global, floor quotas) and the layer-wise pool match the CPU") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(8); ++seed) {
    const kp::CacheShape shape{2, 2, 4, 64};
    kp::DBTrimKVConfig c;
    c.budget = 12 + static_cast<std::int64_t>(seed);
    c.buffer = 4;
    c.horizon = 1 + static_cast<int>(seed % 3);
    c.floor_ratio = seed % 2 == 0 ? 0.25 : 0.0;
    c.window = seed % 3 == 0 ? 2 : 0;
    // odd seeds (no floor quotas, which exclude it): 1 and 5 global, 3 and 7 layer-wise; seed 1,
    // which a simulator's thinned run keeps, with the floor
    c.threshold = seed % 2 == 1 ? 0.5 : 0.0;
    c.min_tokens = seed % 4 == 1 ? 4 : 0;
    const std::int64_t pages = 6 * shape.heads_total() * (shape.heads_total() * (c.budget + c.buffer + 40) / 16 + 2);
    if (seed % 4 < 2) {
      kp::DBTrimKVCache<kp::cpu_backend> cpu(shape, kp::memory::Paged<16>(pages), kp::dbtrimkv_evictor(c),
                                             kp::dbtrimkv_scorer(c));
      kp::DBTrimKVCache<kp::cuda_backend> gpu(shape, kp::memory::Paged<16>(pages), kp::dbtrimkv_evictor(c),
                                              kp::dbtrimkv_scorer(c));
      drive(cpu, gpu, shape, seed * 31, 1e-5);
    } else {
      kp::DBTrimKVLayerWiseCache<kp::cpu_backend> cpu(shape, kp::memory::Paged<16>(pages),
                                                      kp::dbtrimkv_layerwise_evictor(c), kp::dbtrimkv_scorer(c));
      kp::DBTrimKVLayerWiseCache<kp::cuda_backend> gpu(shape, kp::memory::Paged<16>(pages),
                                                       kp::dbtrimkv_layerwise_evictor(c), kp::dbtrimkv_scorer(c));
      drive(cpu, gpu, shape, seed * 31, 1e-5);
    }
  }
}

TEST_CASE("TrimKVCache<cuda_backend, half, 32>: fp16 storage, the same survivors, attention within 2e-3") {
  const kp::CacheShape shape{2, 2, 4, 128};
  kp::TrimKVCache<kp::cpu_backend, kp::half, 32> cpu(shape, kp::memory::Paged<32, kp::half>(800),
                                                      kp::trimkv_evictor({.budget = 30, .buffer = 5}));
  kp::TrimKVCache<kp::cuda_backend, kp::half, 32> gpu(shape, kp::memory::Paged<32, kp::half>(800),
                                                       kp::trimkv_evictor({.budget = 30, .buffer = 5}));
  drive(cpu, gpu, shape, 99, 2e-3);
}

TEST_CASE("WGKVCache<cuda_backend>: the ring, promotion and the vertical-slash mask match the CPU") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(6); ++seed) {
    const kp::CacheShape shape{2, 2, 4, 64};
    // sinks (SPEC §5) in every other seed: kept whatever their g, and the mask shows them
    const kp::WGKVConfig c{.sinks = seed % 2 == 0 ? 2 : 0, .local = static_cast<std::int64_t>(3 + 5 * seed), .tau = 0.1};
    const std::int64_t pages = 6 * shape.heads_total() * 20;
    kp::WGKVCache<kp::cpu_backend> cpu(shape, kp::memory::Paged<16>(pages), kp::wgkv_evictor(c));
    kp::WGKVCache<kp::cuda_backend> gpu(shape, kp::memory::Paged<16>(pages), kp::wgkv_evictor(c));
    drive(cpu, gpu, shape, seed * 7, 1e-5, [](std::mt19937_64& rng) {  // g: often refused, sometimes exactly tau
      const int pick = std::uniform_int_distribution<int>(0, 9)(rng);
      return pick == 0 ? 0.1f : pick < 6 ? std::uniform_real_distribution<float>(0.001f, 0.1f)(rng)
                                         : std::uniform_real_distribution<float>(0.1f, 1.0f)(rng);
    });
  }
}

// TOVA and AdaKV (policies/tova.hpp, policies/adakv.hpp) through the generic device path: the
// observed attention scored on the device from the queries the Cache records, TOVA's per-head rule
// and AdaKV's per-layer pool with its guaranteed share read as data.
TEST_CASE("TOVA on the device keeps what it keeps on the CPU") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(6); ++seed) {
    const kp::CacheShape shape{2, 2, 4, 64};
    const kp::BaselineConfig c{.budget = static_cast<std::int64_t>(6 + 3 * seed),
                               .buffer = 1,
                               .sinks = seed % 2 == 0 ? 2 : 0,
                               .window = seed % 3 == 0 ? 3 : 0};
    const std::int64_t pages = 6 * shape.heads_total() * 8;
    using Tova = kp::evict::PerHead<kp::trigger::Buffered>;
    kp::Cache<kp::score::ObservedAttention, kp::admit::All, Tova, kp::memory::Paged<16>, kp::cpu_backend> cpu(
        shape, kp::memory::Paged<16>(pages), kp::baseline_evictor(c), kp::policies::tova::scorer);
    kp::Cache<kp::score::ObservedAttention, kp::admit::All, Tova, kp::memory::Paged<16>, kp::cuda_backend> gpu(
        shape, kp::memory::Paged<16>(pages), kp::baseline_evictor(c), kp::policies::tova::scorer);
    CHECK(drive(cpu, gpu, shape, seed * 13, 1e-5, tie_prone_log_beta, DriveOptions{.attend_prefill = true}) > 0);
  }
}

TEST_CASE("AdaKV on the device compresses the prompt as on the CPU") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(6); ++seed) {
    const kp::CacheShape shape{2, 3, 6, 64};
    const std::int64_t budget = static_cast<std::int64_t>(4 + 2 * seed);
    kp::SnapKVConfig c;  // SnapKV's score with its defaults, as policies/adakv.hpp builds it
    c.budget = budget;
    c.window = std::min<std::int64_t>(seed % 2 == 0 ? 2 : 32, budget - 1);
    c.sinks = seed % 3 == 0 ? 1 : 0;
    const kp::policies::adakv::Evictor e{budget, c.window, c.sinks, seed % 4 == 0 ? 0.0 : 0.2 * static_cast<double>(seed % 5)};
    const std::int64_t pages = 6 * shape.heads_total() * 8;
    using AdaKV = kp::policies::adakv::Evictor;
    kp::Cache<kp::score::ObservedAttention, kp::admit::All, AdaKV, kp::memory::Paged<16>, kp::cpu_backend> cpu(
        shape, kp::memory::Paged<16>(pages), e, kp::snapkv_scorer(c));
    kp::Cache<kp::score::ObservedAttention, kp::admit::All, AdaKV, kp::memory::Paged<16>, kp::cuda_backend> gpu(
        shape, kp::memory::Paged<16>(pages), e, kp::snapkv_scorer(c));
    CHECK(drive(cpu, gpu, shape, seed * 17, 1e-5, tie_prone_log_beta,
                DriveOptions{.attend_prefill = true, .declare_prompt = true}) > 0);
  }
}

TEST_CASE("SnapKVCache<cuda_backend> compresses the prompt as on the CPU") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(4); ++seed) {
    const kp::CacheShape shape{2, 2, 4, 64};
    kp::SnapKVConfig c;
    c.budget = static_cast<std::int64_t>(5 + 3 * seed);
    c.window = std::min<std::int64_t>(seed % 2 == 0 ? 3 : 32, c.budget);
    c.pooling = seed % 3 == 0 ? kp::score::Pooling::max : kp::score::Pooling::avg;
    c.group_reduce = seed % 4 == 0 ? kp::score::GroupReduce::max : kp::score::GroupReduce::mean;
    const std::int64_t pages = 6 * shape.heads_total() * 8;
    kp::SnapKVCache<kp::cpu_backend> cpu(shape, kp::memory::Paged<16>(pages), kp::snapkv_evictor(c), kp::snapkv_scorer(c));
    kp::SnapKVCache<kp::cuda_backend> gpu(shape, kp::memory::Paged<16>(pages), kp::snapkv_evictor(c), kp::snapkv_scorer(c));
    CHECK(drive(cpu, gpu, shape, seed * 19, 1e-5, tie_prone_log_beta,
                DriveOptions{.attend_prefill = true, .declare_prompt = true}) > 0);
  }
}

TEST_CASE("EpiKVCache<cuda_backend>: the budget over generated tokens matches the CPU") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(6); ++seed) {
    const kp::CacheShape shape{2, 1, 2, 64};
    // SPEC §5's sinks and window in some seeds
    const kp::evict::Generated e{static_cast<std::int64_t>(8 + 3 * seed), seed % 2 == 0 ? 3 : -1, seed % 3 == 0 ? 2 : 0,
                                 seed % 3 == 1 ? 5 : 0};
    const std::int64_t pages = 6 * shape.heads_total() * 20;
    kp::EpiKVCache<kp::cpu_backend> cpu(shape, kp::memory::Paged<16>(pages), e);
    kp::EpiKVCache<kp::cuda_backend> gpu(shape, kp::memory::Paged<16>(pages), e);
    drive(cpu, gpu, shape, seed * 11, 1e-5, [](std::mt19937_64& rng) {  // frozen scores with ties
      return static_cast<float>(std::uniform_int_distribution<int>(-4, 4)(rng)) * 0.5f;
    });
  }
}

TEST_CASE("KNorm retention and bf16 storage on the device match the CPU") {
  const kp::CacheShape shape{1, 2, 4, 256};
  kp::TrimKVKNormCache<kp::cpu_backend, kp::bfloat16, 64> cpu(shape, kp::memory::Paged<64, kp::bfloat16>(120),
                                                              kp::trimkv_evictor({.budget = 20, .buffer = 3}));
  kp::TrimKVKNormCache<kp::cuda_backend, kp::bfloat16, 64> gpu(shape, kp::memory::Paged<64, kp::bfloat16>(120),
                                                               kp::trimkv_evictor({.budget = 20, .buffer = 3}));
  drive(cpu, gpu, shape, 5, 1e-2);
}

TEST_CASE("a prefill longer than a block-table row widens the rows and keeps what the CPU keeps") {
  const kp::CacheShape shape{1, 2, 2, 64};
  kp::TrimKVCache<kp::cpu_backend> cpu(shape, kp::memory::Paged<16>(400), kp::trimkv_evictor({.budget = 8, .buffer = 1}));
  kp::TrimKVCache<kp::cuda_backend> gpu(shape, kp::memory::Paged<16>(400), kp::trimkv_evictor({.budget = 8, .buffer = 1}));
  std::mt19937_64 rng(3);
  const auto put = [&](std::int64_t seq, std::int64_t T) {
    std::vector<float> k(std::size_t(2) * T * 64), lb(std::size_t(2) * T);
    for (auto& x : k) x = std::normal_distribution<float>()(rng);
    for (auto& x : lb) x = tie_prone_log_beta(rng);
    const kp::View<const float, 4> K(k.data(), {1, 2, T, 64});
    const kp::View<const float, 3> LB(lb.data(), {1, 2, T});
    cpu.step(seq, K, K, LB);
    gpu.step(seq, K, K, LB);
  };
  cpu.add_sequence(7);  // another slot with entries, whose rows the widening must carry over
  gpu.add_sequence(7);
  put(7, 5);
  cpu.add_sequence(0);
  gpu.add_sequence(0);
  for (std::int64_t T : {600, 1, 1, 700, 1}) {  // rows start at about M + B + 256 entries
    std::vector<float> k(std::size_t(2) * T * 64), lb(std::size_t(2) * T);
    for (auto& x : k) x = std::normal_distribution<float>()(rng);
    for (auto& x : lb) x = tie_prone_log_beta(rng);
    const kp::View<const float, 4> K(k.data(), {1, 2, T, 64});
    const kp::View<const float, 3> LB(lb.data(), {1, 2, T});
    const auto a = cpu.step(0, K, K, LB), b = gpu.step(0, K, K, LB);
    CHECK(a.evicted == b.evicted);
    for (int h = 0; h < 2; ++h) {
      const auto x = heads_of(cpu, 0, 0, h), y = heads_of(gpu, 0, 0, h);
      REQUIRE(x.size() == y.size());
      for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(x[i].position == y[i].position);
    }
    CHECK(cpu.allocator().pages_free() == gpu.pages_free());
  }
  for (int h = 0; h < 2; ++h) {
    const auto x = heads_of(cpu, 7, 0, h), y = heads_of(gpu, 7, 0, h);
    REQUIRE(x.size() == y.size());
    for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(x[i].position == y[i].position);
  }
  // decode with attention over the widened rows, both sequences
  for (std::int64_t seq : {0, 7}) {
    std::vector<float> k(2 * 64), lb{-0.1f, -0.2f}, q(2 * 64), out_cpu(q.size()), out_gpu(q.size());
    for (auto& x : k) x = std::normal_distribution<float>()(rng);
    for (auto& x : q) x = std::normal_distribution<float>()(rng);
    const kp::View<const float, 4> K(k.data(), {1, 2, 1, 64}), Q(q.data(), {1, 2, 1, 64});
    const kp::View<const float, 3> LB(lb.data(), {1, 2, 1});
    cpu.step(seq, K, K, LB, Q, kp::View<float, 4>(out_cpu.data(), {1, 2, 1, 64}));
    gpu.step(seq, K, K, LB, Q, kp::View<float, 4>(out_gpu.data(), {1, 2, 1, 64}));
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < q.size(); ++i) {
      num += (double(out_gpu[i]) - out_cpu[i]) * (double(out_gpu[i]) - out_cpu[i]);
      den += double(out_cpu[i]) * out_cpu[i];
    }
    CHECK(std::sqrt(num / den) <= 1e-5);
  }
}

using cudatest::NaNAt;

TEST_CASE("Cache<cuda_backend>: a NaN score is refused at commit, the step stays open, step() takes it back") {
  const kp::CacheShape shape{1, 1, 1, 64};
  kp::Cache<NaNAt, kp::admit::All, kp::evict::PerHead<>, kp::memory::Paged<16>, kp::cuda_backend> gpu(
      shape, kp::memory::Paged<16>(8), kp::trimkv_evictor({.budget = 4, .buffer = 1}), NaNAt{2});
  gpu.add_sequence(0);
  std::vector<float> k(8 * 64, 0.5f), lb(8, -0.1f);
  const kp::View<const float, 3> K(k.data(), {1, 8, 64});
  gpu.append(0, 0, K, K, kp::View<const float, 2>(lb.data(), {1, 8}));
  CHECK_THROWS_WITH(gpu.commit(0), doctest::Contains("the scorer returned NaN"));
  CHECK(gpu.length(0, 0, 0) == 8);  // nothing evicted
  CHECK(gpu.tokens(0) == 0);        // the step is still open
  gpu.abort_step(0);
  CHECK(gpu.length(0, 0, 0) == 0);
  CHECK(gpu.pages_free() == 8);
  CHECK_THROWS_WITH(gpu.step(0, kp::View<const float, 4>(k.data(), {1, 1, 8, 64}), kp::View<const float, 4>(k.data(), {1, 1, 8, 64}),
                             kp::View<const float, 3>(lb.data(), {1, 1, 8})),
                    doctest::Contains("the scorer returned NaN"));
  CHECK(gpu.length(0, 0, 0) == 0);
  CHECK(gpu.pages_free() == 8);
}

TEST_CASE("Cache<cuda_backend>: a NaN score in one sequence of step_batch takes back every step of the batch, as on the CPU") {
  const kp::CacheShape shape{1, 1, 1, 64};
  using Pool = kp::memory::Paged<16>;
  auto check = [&](auto& cache) {
    std::vector<float> k(8 * 64, 0.5f), lb(8, -0.1f);
    const auto K = [&](std::int64_t T) { return kp::View<const float, 4>(k.data(), {1, 1, T, 64}); };
    const auto LB = [&](std::int64_t T) { return kp::View<const float, 3>(lb.data(), {1, 1, T}); };
    for (std::int64_t seq : {0, 1}) {
      cache.add_sequence(seq);
      cache.step(seq, K(4), K(4), LB(4));  // positions 0..3: under budget + buffer, nothing evicted
    }
    const auto free_before = cache.pages_free();
    // both steps fire; sequence 0's reaches position 9, whose score is NaN
    const std::array<kp::SequenceStep, 2> batch{kp::SequenceStep{1, K(4), K(4), LB(4)},
                                                kp::SequenceStep{0, K(8), K(8), LB(8)}};
    CHECK_THROWS_WITH(cache.step_batch(batch), doctest::Contains("the scorer returned NaN for sequence 0"));
    for (std::int64_t seq : {0, 1}) {
      CHECK(cache.tokens(seq) == 4);
      CHECK(cache.length(seq, 0, 0) == 4);  // neither compacted nor left with the step's entries
    }
    CHECK(cache.pages_free() == free_before);
    const std::array<kp::SequenceStep, 2> fine{kp::SequenceStep{1, K(4), K(4), LB(4)},
                                               kp::SequenceStep{0, K(4), K(4), LB(4)}};
    const auto reports = cache.step_batch(fine);  // positions 4..7: the budget of 4 is kept
    REQUIRE(reports.size() == 2);
    for (std::int64_t seq : {0, 1}) {
      CHECK(cache.tokens(seq) == 8);
      CHECK(cache.length(seq, 0, 0) == 4);
    }
    CHECK(reports[0].triggered);
    CHECK(reports[0].evicted == 4);
  };
  kp::Cache<NaNAt, kp::admit::All, kp::evict::PerHead<>, Pool, kp::cpu_backend> cpu(
      shape, Pool(8), kp::trimkv_evictor({.budget = 4, .buffer = 1}), NaNAt{9});
  kp::Cache<NaNAt, kp::admit::All, kp::evict::PerHead<>, Pool, kp::cuda_backend> gpu(
      shape, Pool(8), kp::trimkv_evictor({.budget = 4, .buffer = 1}), NaNAt{9});
  check(cpu);
  check(gpu);
}

TEST_CASE("Cache<cuda_backend>: errors as on the CPU, and a refused or aborted step changes nothing") {
  const kp::CacheShape shape{1, 1, 1, 64};
  kp::TrimKVCache<kp::cuda_backend> gpu(shape, kp::memory::Paged<16>(4), kp::trimkv_evictor({.budget = 64, .buffer = 8}));
  gpu.add_sequence(0);
  std::vector<float> k(40 * 64, 0.5f), lb(40, -0.1f);
  lb[3] = std::numeric_limits<float>::quiet_NaN();
  const auto step = [&](std::int64_t T) {
    return gpu.step(0, kp::View<const float, 4>(k.data(), {1, 1, T, 64}), kp::View<const float, 4>(k.data(), {1, 1, T, 64}),
                    kp::View<const float, 3>(lb.data(), {1, 1, T}));
  };
  CHECK_THROWS_WITH(step(5), doctest::Contains("log_beta[layer 0, head 0, token 3 of the step (position 3)] = nan"));
  lb[3] = -0.1f;
  std::vector<float> big(80 * 64, 0.5f), big_lb(80, -0.1f);
  CHECK_THROWS_WITH(gpu.step(0, kp::View<const float, 4>(big.data(), {1, 1, 80, 64}),
                             kp::View<const float, 4>(big.data(), {1, 1, 80, 64}),
                             kp::View<const float, 3>(big_lb.data(), {1, 1, 80})),
                    doctest::Contains("out of memory"));  // 5 pages of 16 needed, 4 in the pool (out of pages)
  CHECK(gpu.length(0, 0, 0) == 0);
  CHECK(gpu.pages_free() == 4);
  step(20);  // 2 pages
  gpu.append(0, 0, kp::View<const float, 3>(k.data(), {1, 13, 64}), kp::View<const float, 3>(k.data(), {1, 13, 64}),
             kp::View<const float, 2>(lb.data(), {1, 13}));  // 33 entries: a third page
  CHECK(gpu.pages_free() == 1);
  gpu.abort_step(0);
  CHECK(gpu.length(0, 0, 0) == 20);
  CHECK(gpu.pages_free() == 2);
  CHECK(gpu.tokens(0) == 20);
  CHECK_THROWS_WITH(gpu.entry(0, 0, 1, 0), doctest::Contains("head 1 out of range"));
}

TEST_CASE("Cache<cuda_backend>: an evictor's horizon its scorer lacks is refused before any allocation, as on the CPU" *
          doctest::test_suite("host")) {
  const kp::CacheShape shape{2, 2, 2, 64};
  CHECK_THROWS_WITH_AS(kp::DBTrimKVCache<kp::cuda_backend>(shape, kp::memory::Paged<16>(64), kp::dbtrimkv_evictor({.horizon = 5})),
                       doctest::Contains("the config's horizon h = 5 is not the scorer's h = 2"), kp::Error);
}

// ---- the cache API as a state machine --------------------------------------------------------------
// The driver the CPU Cache runs in test_state_machine.cpp (tests/state_machine.hpp), on
// Cache<cuda_backend>: TRIM-KV per head, DBTrimKV global and layer-wise, each against the same
// executable model over random operation streams — sequences added and removed, decode tokens and
// prefill chunks through step(), step_batch() and the layer API, attention (causal inside a chunk),
// aborted steps, and invalid calls that must change nothing. The device's profile: pages of 16
// slots, heads of 64. Under a GPU simulator the streams are fewer (test_scale.hpp).
namespace sm = state_machine;

namespace {

constexpr int kStatePage = 16;
using StatePool = kp::memory::Paged<kStatePage, float>;

sm::Profile device_profile() {
  sm::Profile p;
  p.page = kStatePage;
  p.head_dims = {64};
  p.operations = 120;
  return p;
}

}  // namespace

TEST_CASE("state machine: TRIM-KV per-head Cache<cuda_backend> against its model over random operation streams") {
  using C = kp::Cache<kp::score::RetentionDecay, kp::admit::All, kp::evict::PerHead<kp::trigger::Buffered>, StatePool,
                      kp::cuda_backend>;
  sm::run_streams<C>(sm::Policy::per_head, 100000, static_cast<int>(cudatest::seeds(32)), [](const sm::Model& m) {
    return C(m.shape, StatePool(m.pages_total),
             kp::trimkv_evictor({.budget = m.params.budget,
                                 .buffer = m.params.buffer,
                                 .window = m.params.window,
                                 .threshold = m.params.threshold,
                                 .min_tokens = m.params.min_tokens}));
  }, device_profile());
}

TEST_CASE("state machine: DBTrimKV global Cache<cuda_backend> against its model over random operation streams") {
  using C = kp::Cache<kp::score::Lookahead, kp::admit::All, kp::evict::Global, StatePool, kp::cuda_backend>;
  sm::run_streams<C>(sm::Policy::global, 200000, static_cast<int>(cudatest::seeds(32)), [](const sm::Model& m) {
    const kp::DBTrimKVConfig c{.budget = m.params.budget,
                               .buffer = m.params.buffer,
                               .window = m.params.window,
                               .threshold = m.params.threshold,
                               .horizon = m.horizon,
                               .floor_ratio = m.params.floor_ratio,
                               .min_tokens = m.params.min_tokens};
    return C(m.shape, StatePool(m.pages_total), kp::dbtrimkv_evictor(c), kp::dbtrimkv_scorer(c));
  }, device_profile());
}

TEST_CASE("state machine: DBTrimKV layer-wise Cache<cuda_backend> against its model over random operation streams") {
  using C = kp::Cache<kp::score::Lookahead, kp::admit::All, kp::evict::LayerWise, StatePool, kp::cuda_backend>;
  sm::run_streams<C>(sm::Policy::layer_wise, 300000, static_cast<int>(cudatest::seeds(32)), [](const sm::Model& m) {
    const kp::DBTrimKVConfig c{.budget = m.params.budget,
                               .buffer = m.params.buffer,
                               .window = m.params.window,
                               .threshold = m.params.threshold,
                               .horizon = m.horizon,
                               .floor_ratio = m.params.floor_ratio,
                               .min_tokens = m.params.min_tokens};
    return C(m.shape, StatePool(m.pages_total), kp::dbtrimkv_layerwise_evictor(c), kp::dbtrimkv_scorer(c));
  }, device_profile());
}
