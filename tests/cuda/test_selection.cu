// The selection kernels against their CPU twins (SPEC §1–2): gpu::segmented_select against
// evict::PerHead::select, gpu::pooled_select against evict::Global / evict::LayerWise::select,
// gpu::score_segments against the Scorers — identical keep flags on thousands of random cases,
// ties, -0, ±inf, segments from 0 entries to more than 64K. Every output is poisoned first and
// must come back fully written.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <cstdint>
#include <random>
#include <vector>

#include "device_buffer.hpp"
#include "kvpolicy/cuda/kernels/pooled_topk.cuh"
#include "kvpolicy/cuda/kernels/score.cuh"
#include "kvpolicy/cuda/kernels/segmented_topk.cuh"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/score/retention.hpp"
#include "random_segments.hpp"
#include "test_scale.hpp"

namespace kp = kvpolicy;
namespace kc = kvpolicy::gpu;
using cudatest::DeviceBuffer;

namespace {

struct OnDevice {
  DeviceBuffer<float> score;
  DeviceBuffer<std::int32_t> position;
  DeviceBuffer<std::int64_t> offsets;
  DeviceBuffer<std::uint8_t> keep;
  explicit OnDevice(const cudatest::Segments& s)
      : score(s.score), position(s.position), offsets(s.offsets), keep(s.score.size()) {}
  kc::DeviceSegments view(const cudatest::Segments& s) const {
    return {score.get(), position.get(), offsets.get(), static_cast<std::int32_t>(s.segments())};
  }
};

void check_keep(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want, const char* what,
                std::uint64_t seed) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      FAIL_CHECK(what, ": seed ", seed, ", entry ", i, ": device keeps ", int(got[i]), ", the CPU ", int(want[i]));
      return;
    }
  }
}

// The metadata of a pool that carries the key norm (Field::key_norm) and no other field.
kc::EntryMetaView key_norm_view(std::int32_t* position, float* write_score, float* key_norm) {
  kc::EntryMetaView v{position, write_score};
  v.fields[kp::Field::key_norm] = key_norm;
  return v;
}

}  // namespace

TEST_CASE("segmented_select marks what evict::PerHead::select marks") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(1500); ++seed) {
    std::mt19937_64 rng(seed);
    cudatest::Segments s;
    const int segments = std::uniform_int_distribution<int>(1, 24)(rng);
    const int style = static_cast<int>(seed % 3);
    const std::int64_t big = seed % 100 == 0 ? 70000 : 5000;
    for (int i = 0; i < segments; ++i) cudatest::append_segment(s, rng, cudatest::random_length(rng, big), style);
    const std::int64_t longest = s.max_length();
    kp::evict::PerHead<> cpu;
    cpu.rule.budget = std::uniform_int_distribution<std::int64_t>(1, longest + 2)(rng);
    cpu.window = std::uniform_int_distribution<std::int64_t>(0, cpu.rule.budget)(rng);
    if (seed % 4 == 0) cpu.threshold = std::exp(cudatest::random_score(rng, 1));
    std::vector<std::uint8_t> want(s.score.size());
    kp::CacheShape shape{1, segments, segments, 8};
    kp::evict::select_survivors(cpu, shape, {}, {s.score, s.position, s.offsets}, want);

    OnDevice d(s);
    d.keep.poison();
    kc::SegmentRule rule;
    rule.sel = cpu.selection();
    kc::segmented_select(d.view(s), rule, d.keep.get(), nullptr);
    cudatest::sync();
    check_keep(d.keep.download(), want, "segmented_select", seed);
  }
}

TEST_CASE("segmented_select with one k per segment, and inactive segments kept whole") {
  std::mt19937_64 rng(77);
  cudatest::Segments s;
  for (int i = 0; i < 64; ++i) cudatest::append_segment(s, rng, cudatest::random_length(rng, 9000), i % 3);
  std::vector<std::int64_t> k(64);
  std::vector<std::uint8_t> active(64), want(s.score.size());
  for (int i = 0; i < 64; ++i) {
    k[i] = std::uniform_int_distribution<std::int64_t>(0, s.offsets[i + 1] - s.offsets[i] + 1)(rng);
    active[i] = i % 5 != 0;
    const auto b = static_cast<std::size_t>(s.offsets[i]), n = static_cast<std::size_t>(s.offsets[i + 1] - s.offsets[i]);
    if (active[i])
      kp::rank::keep_top_k(std::span<const float>(s.score).subspan(b, n),
                           std::span<const std::int32_t>(s.position).subspan(b, n), k[i],
                           std::span<std::uint8_t>(want).subspan(b, n));
    else
      std::fill(want.begin() + b, want.begin() + b + n, std::uint8_t{1});
  }
  OnDevice d(s);
  DeviceBuffer<std::int64_t> dk(k);
  DeviceBuffer<std::uint8_t> da(active);
  d.keep.poison();
  kc::SegmentRule rule;
  rule.k_of = dk.get();
  rule.active = da.get();
  kc::segmented_select(d.view(s), rule, d.keep.get(), nullptr);
  cudatest::sync();
  check_keep(d.keep.download(), want, "segmented_select k_of", 77);
}

TEST_CASE("pooled_select marks what evict::Global and evict::LayerWise mark") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(600); ++seed) {
    std::mt19937_64 rng(seed * 7919);
    const int layers = std::uniform_int_distribution<int>(1, 4)(rng);
    const int kv_heads = std::uniform_int_distribution<int>(1, 4)(rng);
    const int sequences = std::uniform_int_distribution<int>(1, 4)(rng);
    const bool global = seed % 2 == 0;
    const int style = static_cast<int>(seed % 3);
    cudatest::Segments s;
    for (int i = 0; i < sequences * layers * kv_heads; ++i)
      cudatest::append_segment(s, rng, cudatest::random_length(rng, seed % 50 == 0 ? 70000 : 4000), style);
    const std::int64_t budget = std::uniform_int_distribution<std::int64_t>(1, 600)(rng);
    const std::int64_t window = std::uniform_int_distribution<std::int64_t>(0, std::min<std::int64_t>(budget, 40))(rng);
    const int variant = static_cast<int>(seed % 3);  // 0: top-K, 1: floor quotas, 2: threshold
    const double floor_ratio = variant == 1 ? std::uniform_real_distribution<double>(0.05, 0.95)(rng) : 0.0;
    const double threshold = variant == 2 ? std::exp(cudatest::random_score(rng, 1)) : 0.0;
    const kp::CacheShape shape{layers, kv_heads, kv_heads, 8};
    const std::int64_t per_sequence = shape.heads_total();

    std::vector<std::uint8_t> want(s.score.size());
    for (int q = 0; q < sequences; ++q) {
      const auto slice = s.slice(q * per_sequence, (q + 1) * per_sequence);
      std::vector<std::uint8_t> k(slice.score.size());
      if (global)
        kp::evict::select_survivors(kp::evict::Global{budget, 1, floor_ratio, window, threshold}, shape, {}, slice.view(), k);
      else
        kp::evict::select_survivors(kp::evict::LayerWise{budget, 1, floor_ratio, window, threshold}, shape, {}, slice.view(), k);
      std::copy(k.begin(), k.end(), want.begin() + s.offsets[q * per_sequence]);
    }

    OnDevice d(s);
    d.keep.poison();
    kc::PooledRule rule;
    rule.segments_per_group = global ? static_cast<std::int32_t>(per_sequence) : kv_heads;
    rule.sel = kp::evict::Global{budget, 1, floor_ratio, window, threshold}.selection();
    std::size_t bytes = 0;
    kc::pooled_select(nullptr, bytes, d.view(s), rule, d.keep.get(), s.max_length(), nullptr);
    DeviceBuffer<unsigned char> workspace(bytes);
    kc::pooled_select(workspace.get(), bytes, d.view(s), rule, d.keep.get(), s.max_length(), nullptr);
    cudatest::sync();
    check_keep(d.keep.download(), want, global ? "pooled_select (global)" : "pooled_select (layer-wise)", seed);
  }
}

TEST_CASE("pooled_select at DBTrimKV's size: L = 36, Hkv = 8, M + B = 1152 per head") {
  std::mt19937_64 rng(36);
  cudatest::Segments s;
  for (int i = 0; i < 36 * 8; ++i) cudatest::append_segment(s, rng, 1152, 1);
  const kp::CacheShape shape{36, 8, 32, 128};
  std::vector<std::uint8_t> want(s.score.size());
  kp::evict::select_survivors(kp::evict::Global{1024, 128, 0.0, 0, 0.0}, shape, {}, {s.score, s.position, s.offsets}, want);
  OnDevice d(s);
  d.keep.poison();
  kc::PooledRule rule;
  rule.segments_per_group = 36 * 8;
  rule.sel.budget = 1024;
  std::size_t bytes = 0;
  kc::pooled_select(nullptr, bytes, d.view(s), rule, d.keep.get(), 1152, nullptr);
  DeviceBuffer<unsigned char> workspace(bytes);
  kc::pooled_select(workspace.get(), bytes, d.view(s), rule, d.keep.get(), 1152, nullptr);
  cudatest::sync();
  check_keep(d.keep.download(), want, "pooled_select (36 x 8 x 1152)", 36);
}

TEST_CASE("score_segments scores as the CPU Scorers do, bit for bit") {
  std::mt19937_64 rng(5);
  constexpr int page = 16, pages = 64, segments = 6;
  std::vector<std::int32_t> position(pages * page), table(segments * 8), length(segments);
  std::vector<float> meta(pages * page), norm(pages * page);
  std::vector<std::int32_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int i = 0; i < pages * page; ++i) {
    position[i] = std::uniform_int_distribution<std::int32_t>(0, 5000)(rng);
    meta[i] = -std::uniform_real_distribution<float>(0.0f, 2.0f)(rng);
    norm[i] = std::uniform_real_distribution<float>(0.0f, 30.0f)(rng);
  }
  meta[3] = -std::numeric_limits<float>::infinity();
  meta[4] = 0.0f;
  for (int s = 0; s < segments; ++s) {
    length[s] = std::uniform_int_distribution<int>(0, 8 * page)(rng);
    for (int j = 0; j < 8; ++j) table[s * 8 + j] = order[s * 8 + j];
  }
  DeviceBuffer<std::int32_t> dpos(position), dtable(table), dlen(length);
  DeviceBuffer<float> dmeta(meta), dnorm(norm);
  std::vector<kp::StepContext> ctx{{6000, 0, false, 0}, {7000, 0, false, 0}};
  DeviceBuffer<kp::StepContext> dctx(ctx);
  kc::BlockTableView t{dtable.get(), dlen.get(), segments, 8};
  DeviceBuffer<std::int64_t> offsets(segments + 1);
  kc::segment_offsets(t, nullptr, offsets.get(), nullptr);
  DeviceBuffer<float> out(pages * page);
  DeviceBuffer<std::int32_t> out_pos(pages * page);
  const auto run = [&](const auto& scorer) {
    out.poison();
    kc::score_segments(scorer, key_norm_view(dpos.get(), dmeta.get(), dnorm.get()), t, page, dctx.get(),
                       segments / 2, nullptr, offsets.get(), out.get(), out_pos.get(), 8 * page, nullptr);
    cudatest::sync();
    const auto got = out.download();
    const auto got_pos = out_pos.download();
    std::int64_t at = 0;
    for (int s = 0; s < segments; ++s)
      for (int i = 0; i < length[s]; ++i, ++at) {
        const int slot = table[s * 8 + i / page] * page + i % page;
        const kp::EntryMeta m{position[slot], meta[slot], norm[slot], 0.0f};
        const float want = scorer(m, ctx[s / (segments / 2)]);
        REQUIRE(got_pos[at] == position[slot]);
        REQUIRE(std::memcmp(&got[at], &want, sizeof want) == 0);
      }
  };
  run(kp::score::RetentionDecay{});
  run(kp::score::Lookahead{4});
  run(kp::score::KNormRetention{});
}

TEST_CASE("selection arguments are checked before any launch" * doctest::test_suite("host")) {
  kc::DeviceSegments s{nullptr, nullptr, nullptr, 3};
  std::uint8_t* keep = nullptr;
  kc::SegmentRule rule;
  CHECK_THROWS_WITH(kc::segmented_select(s, rule, keep, nullptr),
                    doctest::Contains("score, position, offsets and keep must be device pointers"));
  rule.sel.keep = -1;
  s = kc::DeviceSegments{};
  CHECK_THROWS_WITH(kc::segmented_select(s, rule, keep, nullptr), doctest::Contains("k = -1"));
  rule.sel.keep = 4;
  rule.sel.window = -2;
  CHECK_THROWS_WITH(kc::segmented_select(s, rule, keep, nullptr), doctest::Contains("window w = -2"));

  kc::PooledRule pr;
  pr.segments_per_group = 4;
  s.segments = 6;
  std::size_t bytes = 0;
  CHECK_THROWS_WITH(kc::pooled_select(nullptr, bytes, s, pr, keep, 0, nullptr),
                    doctest::Contains("segments = 6 is not a multiple of segments_per_group = 4"));
  s.segments = 8;
  pr.sel.floor_ratio = 1.5;
  CHECK_THROWS_WITH(kc::pooled_select(nullptr, bytes, s, pr, keep, 0, nullptr), doctest::Contains("floor_ratio f = 1.5"));
  pr.sel.floor_ratio = 0.2;
  kc::pooled_select(nullptr, bytes, s, pr, keep, 0, nullptr);  // a size query needs no device
  CHECK(bytes >= sizeof(unsigned long long) * 256 * 2);
  CHECK(bytes % 256 == 0);
  std::size_t small = 16;
  CHECK_THROWS_WITH(kc::pooled_select(reinterpret_cast<void*>(256), small, s, pr, keep, 0, nullptr),
                    doctest::Contains("workspace of 16 bytes"));
}
