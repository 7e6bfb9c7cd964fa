// Append, compaction and the whole eviction step on the device against memory::Paged and the CPU
// evictors (SPEC §1–2; DESIGN, Device path): after every operation the device's lengths, block
// tables, free-page count, metadata and K/V bits equal the CPU's — the same page ids, since both
// pop and push their free lists in the same order. H2O's attention mass (SPEC §5) rides along:
// evict_step ranks by it with score::AttentionMass and compaction carries it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "device_buffer.hpp"
#include "nan_scorer.hpp"
#include "kvpolicy/cuda/kernels/append.cuh"
#include "kvpolicy/cuda/kernels/compact.cuh"
#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/cuda/kernels/evict_step.cuh"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/score/baseline.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"
#include "kvpolicy/parts/score/retention.hpp"
#include "test_scale.hpp"

namespace kp = kvpolicy;
namespace kc = kvpolicy::gpu;
using cudatest::DeviceBuffer;

namespace {

constexpr int kPage = 16;

/// One pool twice: memory::Paged on the host, the device views over device buffers.
struct Twin {
  kp::CacheShape shape;
  int sequences, pages, segments;
  kp::memory::Paged<kPage, float> cpu;
  DeviceBuffer<float> keys, values, meta, mass;  // mass: H2O's, in use with with_mass
  DeviceBuffer<std::int32_t> position, table, length, free_pages, free_count;
  DeviceBuffer<kc::Status> status;
  bool with_mass = false;

  Twin(kp::CacheShape s, int seqs, int pool_pages)
      : shape(s), sequences(seqs), pages(pool_pages), segments(seqs * static_cast<int>(s.heads_total())),
        cpu(pool_pages), keys(std::size_t(pool_pages) * kPage * s.head_dim), values(keys.size()),
        meta(std::size_t(pool_pages) * kPage), mass(meta.size()), position(meta.size()), table(std::size_t(segments) * pool_pages),
        length(std::vector<std::int32_t>(segments, 0)), free_pages(pool_pages),
        free_count(std::vector<std::int32_t>{pool_pages}), status(std::vector<kc::Status>{kc::Status{}}) {
    cpu.bind(shape);
    for (int q = 0; q < seqs; ++q) cpu.add_sequence(q);
    std::vector<std::int32_t> free(pool_pages);
    for (int i = 0; i < pool_pages; ++i) free[i] = pool_pages - 1 - i;  // page 0 on top, as memory::Paged
    free_pages.upload(free);
    table.upload(std::vector<std::int32_t>(table.size(), 0));
  }
  kc::PagedKV<float> kv() const {
    kc::PagedKV<float> kv{keys.get(), values.get(), position.get(), meta.get(), pages, kPage, shape.head_dim};
    kv.fields[kp::Field::attention_mass] = with_mass ? mass.get() : nullptr;
    return kv;
  }
  kc::BlockTableView tables() const { return {table.get(), length.get(), segments, pages}; }
  kc::FreeList free() const { return {free_pages.get(), free_count.get(), pages}; }
  int seq_of(int seg) const { return seg / static_cast<int>(shape.heads_total()); }
  int layer_of(int seg) const { return (seg % static_cast<int>(shape.heads_total())) / shape.kv_heads; }
  int head_of(int seg) const { return seg % shape.kv_heads; }
  /// Entries the CPU side holds, over every head of every sequence.
  std::int64_t held() const {
    std::int64_t n = 0;
    for (int s = 0; s < segments; ++s) n += cpu.length(seq_of(s), layer_of(s), head_of(s));
    return n;
  }

  /// `tokens` entries to every head of every sequence, positions from `first`.
  void append(std::mt19937_64& rng, int tokens, std::int32_t first) {
    const int d = shape.head_dim;
    std::vector<float> k(std::size_t(segments) * tokens * d), v(k.size()), lb(std::size_t(segments) * tokens);
    std::vector<std::int32_t> pos(lb.size()), seg(segments);
    std::normal_distribution<float> normal;
    static const float betas[] = {0.0f, -0.25f, -0.5f, -1.0f, -std::numeric_limits<float>::infinity()};
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (std::size_t i = 0; i < lb.size(); ++i) {
      lb[i] = i % 3 == 0 ? betas[std::uniform_int_distribution<int>(0, 4)(rng)]
                         : -std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
      pos[i] = first + static_cast<std::int32_t>(i % tokens);
    }
    for (int s = 0; s < segments; ++s) {
      seg[s] = s;
      std::vector<kp::EntryMeta> m(tokens);
      for (int t = 0; t < tokens; ++t) m[t] = kp::EntryMeta{pos[s * tokens + t], lb[s * tokens + t], 0.0f, 0.0f};
      cpu.append(seq_of(s), layer_of(s), head_of(s), tokens, &k[std::size_t(s) * tokens * d],
                 &v[std::size_t(s) * tokens * d], m.data());
    }
    DeviceBuffer<float> dk(k), dv(v), dlb(lb);
    DeviceBuffer<std::int32_t> dpos(pos), dseg(seg);
    kc::AppendRows<float> rows{dseg.get(), segments, tokens, dk.get(), dv.get(), dpos.get(), dlb.get()};
    std::size_t bytes = 0;
    kc::append(nullptr, bytes, kv(), tables(), free(), rows, status.get(), nullptr);
    DeviceBuffer<unsigned char> ws(bytes);
    kc::append(ws.get(), bytes, kv(), tables(), free(), rows, status.get(), nullptr);
    cudatest::sync();
  }

  /// Every length, table row, free count, metadata and K/V row equal to the CPU's.
  void compare(const char* when, int step) const {
    const auto len = length.download(), tab = table.download(), pos = position.download();
    const auto lb = meta.download(), k = keys.download(), v = values.download(), am = mass.download();
    REQUIRE(status.download()[0].code == kc::Status::ok);
    REQUIRE_MESSAGE(free_count.download()[0] == cpu.pages_free(), when, " step ", step);
    const int d = shape.head_dim;
    for (int s = 0; s < segments; ++s) {
      const auto layout = cpu.layout(seq_of(s), layer_of(s), head_of(s));
      REQUIRE_MESSAGE(len[s] == layout.length, when, " step ", step, " segment ", s);
      for (std::size_t p = 0; p < layout.block_table.size(); ++p)
        REQUIRE_MESSAGE(tab[std::size_t(s) * pages + p] == layout.block_table[p], when, " step ", step, " segment ", s);
      for (std::int64_t i = 0; i < layout.length; ++i) {
        const std::int64_t slot = layout.slot(i);
        const auto& m = cpu.pool().meta(slot);
        REQUIRE_MESSAGE(pos[slot] == m.position, when, " step ", step, " segment ", s, " entry ", i);
        REQUIRE_MESSAGE(std::memcmp(&lb[slot], &m.write_score, sizeof(float)) == 0, when, " step ", step,
                        " segment ", s, " entry ", i, ": write_score on the device ", lb[slot], ", on the CPU ",
                        m.write_score);
        if (with_mass) REQUIRE(std::memcmp(&am[slot], &m.attention_mass, sizeof(float)) == 0);
        REQUIRE(std::memcmp(&k[slot * d], cpu.pool().key(slot), sizeof(float) * d) == 0);
        REQUIRE(std::memcmp(&v[slot * d], cpu.pool().value(slot), sizeof(float) * d) == 0);
      }
    }
  }
};

/// The CPU side of one eviction step, as Cache::commit plans and applies it: per sequence, trigger
/// on the head lengths, score the active heads at n, select, compact the active heads in order.
template <class Evictor, class Scorer = kp::score::RetentionDecay>
void cpu_evict(Twin& tw, const Evictor& e, std::int64_t n, const Scorer& scorer = {}) {
  const kp::CacheShape& shape = tw.shape;
  for (int q = 0; q < tw.sequences; ++q) {
    const auto heads = static_cast<std::size_t>(shape.heads_total());
    std::vector<std::int64_t> lengths(heads), offsets{0};
    std::vector<std::uint8_t> active(heads);
    for (int l = 0; l < shape.layers; ++l)
      for (int h = 0; h < shape.kv_heads; ++h) lengths[kp::head_index(shape, l, h)] = tw.cpu.length(q, l, h);
    const kp::StepContext ctx{n, 0, false, 0};
    if (!kp::evict::trigger_heads(e, shape, ctx, lengths, active)) continue;
    std::vector<float> score;
    std::vector<std::int32_t> position;
    for (std::size_t i = 0; i < heads; ++i) {
      if (active[i]) {
        const auto layout = tw.cpu.layout(q, static_cast<int>(i) / shape.kv_heads, static_cast<int>(i) % shape.kv_heads);
        for (std::int64_t j = 0; j < layout.length; ++j) {
          const auto& m = tw.cpu.pool().meta(layout.slot(j));
          kp::StepContext head_ctx = ctx;  // scored per (layer, kv head), as the Cache does
          head_ctx.head = static_cast<std::int64_t>(i);
          score.push_back(scorer(m, head_ctx));
          position.push_back(m.position);
        }
      }
      offsets.push_back(static_cast<std::int64_t>(score.size()));
    }
    std::vector<std::uint8_t> keep(score.size());
    kp::evict::select_survivors(e, shape, ctx, kp::SegmentedScores{score, position, offsets}, keep);
    for (std::size_t i = 0; i < heads; ++i)
      if (active[i])
        tw.cpu.compact(q, static_cast<int>(i) / shape.kv_heads, static_cast<int>(i) % shape.kv_heads,
                       std::span<const std::uint8_t>(keep).subspan(offsets[i], offsets[i + 1] - offsets[i]));
  }
}

template <class Evictor, class Scorer = kp::score::RetentionDecay>
void device_evict(Twin& tw, const Evictor& e, std::int64_t n, const Scorer& scorer = {}) {
  DeviceBuffer<kp::StepContext> ctx(std::vector<kp::StepContext>(tw.sequences, kp::StepContext{n, 0, false, 0}));
  std::size_t bytes = 0;
  kc::evict_step(nullptr, bytes, scorer, e, tw.shape, tw.kv(), tw.tables(), tw.free(), ctx.get(), nullptr,
                 tw.status.get(), nullptr);
  DeviceBuffer<unsigned char> ws(bytes);
  kc::evict_step(ws.get(), bytes, scorer, e, tw.shape, tw.kv(), tw.tables(), tw.free(), ctx.get(), nullptr,
                 tw.status.get(), nullptr);
  cudatest::sync();
}

}  // namespace

TEST_CASE("append and compact leave the pool as memory::Paged leaves it") {
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(40); ++seed) {
    std::mt19937_64 rng(seed);
    const kp::CacheShape shape{2, 3, 6, 64};
    Twin tw(shape, 3, 600);
    std::int32_t n = 0;
    for (int round = 0; round < 12; ++round) {
      const int tokens = round % 3 == 0 ? std::uniform_int_distribution<int>(1, 40)(rng) : 1;
      tw.append(rng, tokens, n);
      n += tokens;
      tw.compare("append", round);
      // random survivors on a random subset of heads
      std::vector<std::uint8_t> active(tw.segments), keep;
      std::vector<std::int64_t> offsets{0};
      for (int s = 0; s < tw.segments; ++s) {
        active[s] = std::uniform_int_distribution<int>(0, 2)(rng) != 0;
        const auto len = active[s] ? tw.cpu.length(tw.seq_of(s), tw.layer_of(s), tw.head_of(s)) : 0;
        const double p = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
        for (std::int64_t i = 0; i < len; ++i) keep.push_back(std::bernoulli_distribution(p)(rng));
        offsets.push_back(static_cast<std::int64_t>(keep.size()));
      }
      for (int s = 0; s < tw.segments; ++s)
        if (active[s])
          tw.cpu.compact(tw.seq_of(s), tw.layer_of(s), tw.head_of(s),
                         std::span<const std::uint8_t>(keep).subspan(offsets[s], offsets[s + 1] - offsets[s]));
      DeviceBuffer<std::uint8_t> dactive(active), dkeep(keep.empty() ? std::vector<std::uint8_t>{0} : keep);
      DeviceBuffer<std::int64_t> doffsets(tw.segments + 1);
      kc::segment_offsets(tw.tables(), dactive.get(), doffsets.get(), nullptr);
      DeviceBuffer<std::int64_t> evicted(tw.segments);
      std::size_t bytes = 0;
      kc::compact(nullptr, bytes, tw.kv(), tw.tables(), doffsets.get(), dkeep.get(), dactive.get(), tw.free(),
                  evicted.get(), tw.kv().slots(), nullptr);
      DeviceBuffer<unsigned char> ws(bytes);
      kc::compact(ws.get(), bytes, tw.kv(), tw.tables(), doffsets.get(), dkeep.get(), dactive.get(), tw.free(),
                  evicted.get(), tw.kv().slots(), nullptr);
      cudatest::sync();
      REQUIRE(doffsets.download() == offsets);
      tw.compare("compact", round);
    }
  }
}

TEST_CASE("evict_step keeps what the CPU evictors keep, step after step") {
  enum class Scope { per_head, layer_wise, global };
  struct Case {
    Scope scope;
    std::int64_t budget, buffer, window;
    double threshold, floor_ratio;
    bool random = false;  // score::SeededRandom (per (layer, head, position), SPEC §5) instead of TRIM-KV's
    std::int64_t sinks = 0;  // SPEC §5: the S oldest entries of each head protected
    std::int64_t min_tokens = 0;  // the threshold's floor per head (SPEC §1)
  };
  const Case cases[] = {{Scope::per_head, 24, 4, 0, 0.0, 0.0},    {Scope::per_head, 17, 1, 5, 0.0, 0.0},
                        // SPEC §5: sinks on every selection, and Random drawn per (layer, head, position)
                        {Scope::per_head, 12, 3, 2, 0.0, 0.0, true, 3},   {Scope::per_head, 20, 4, 0, 0.5, 0.0, false, 2, 6},
                        {Scope::global, 14, 3, 2, 0.0, 0.0, true, 4},     {Scope::global, 16, 4, 1, 0.0, 0.4, false, 2},
                        {Scope::layer_wise, 12, 2, 0, 0.0, 0.0, true, 3},
                        {Scope::per_head, 30, 8, 3, 0.6, 0.0},    {Scope::global, 20, 6, 0, 0.0, 0.0},
                        {Scope::global, 20, 6, 4, 0.0, 0.3},      {Scope::global, 12, 2, 2, 0.5, 0.0, false, 0, 4},
                        {Scope::layer_wise, 16, 4, 0, 0.0, 0.0},  {Scope::layer_wise, 16, 4, 2, 0.0, 0.5}};
  std::uint64_t seed = 0;
  for (const Case& c : cases) {
    std::mt19937_64 rng(++seed);
    const kp::CacheShape shape{3, 2, 4, 64};
    Twin tw(shape, 3, 3 * 6 * 8);
    std::int64_t n = 0;
    // A prompt chunk, then decode. On a GPU the prompt is 21 entries and 160 steps (80 for the
    // random and sink cases) pass every trigger many times. Under the simulator, where each step
    // costs a few seconds of launches, the prompt stops 3 entries short of the case's trigger
    // (M + B) and 12 steps follow: the trigger fires by step 3 and again after B more steps, as the
    // check at the end of the case makes sure. A threshold case runs its rule every step (SPEC §1)
    // and evicts wherever a score has fallen below log(alpha) and out of the head's floor.
    const bool short_case = c.random || c.sinks > 0;
    const bool scaled = cudatest::test_scale() > 1;
    const int prompt = scaled ? static_cast<int>(std::max<std::int64_t>(21, c.budget + c.buffer - 3)) : 21;
    const int steps = scaled ? 12 : short_case ? 80 : 160;
    int evictions = 0;
    for (int step = 0; step < steps; ++step) {
      const int tokens = step == 0 ? prompt : 1;
      tw.append(rng, tokens, static_cast<std::int32_t>(n));
      n += tokens;
      const auto both = [&](const auto& scorer) {
        // the same Evictor on both sides: the host runs its select(), the device its stated rule
        const auto run = [&](const auto& e) {
          const std::int64_t before = tw.held();
          cpu_evict(tw, e, n, scorer);
          device_evict(tw, e, n, scorer);
          evictions += tw.held() < before;
        };
        if (c.scope == Scope::per_head) {
          kp::evict::PerHead<> e;
          e.rule = {c.budget, c.buffer};
          e.window = c.window;
          e.threshold = c.threshold;
          e.sinks = c.sinks;
          e.min_tokens = c.min_tokens;
          run(e);
        } else if (c.scope == Scope::global) {
          run(kp::evict::Global{c.budget, c.buffer, c.floor_ratio, c.window, c.threshold, c.sinks, 0, c.min_tokens});
        } else {
          run(kp::evict::LayerWise{c.budget, c.buffer, c.floor_ratio, c.window, c.threshold, c.sinks, 0, c.min_tokens});
        }
      };
      if (c.random)
        both(kp::score::SeededRandom{seed});
      else
        both(kp::score::RetentionDecay{});
      tw.compare("evict_step", step);
    }
    INFO("case with budget ", c.budget, ", buffer ", c.buffer, ", window ", c.window, ", sinks ", c.sinks,
         ", min_tokens ", c.min_tokens);
    // a threshold case evicts only where scores fall past its bound, which a short run may meet once
    CHECK(evictions >= (c.threshold > 0.0 ? 1 : 2));
  }
}

TEST_CASE("H2O on the device: evict_step ranks by the attention mass and compaction carries it") {
  // The masses grow as decode attention would grow them (decode_attention's accumulate_mass, checked
  // against the dense reference in test_attention.cu), from a tie-prone set of increments.
  for (std::uint64_t seed = 1; seed <= cudatest::seeds(6); ++seed) {
    std::mt19937_64 rng(seed);
    const kp::CacheShape shape{2, 2, 4, 64};
    Twin tw(shape, 3, 3 * 4 * 6);
    tw.with_mass = true;
    const std::int64_t M = 24, B = seed % 2 == 0 ? 1 : 4;  // B = 1: one eviction per decode step, as H2O
    kp::evict::PerHead<> e;
    e.rule = {M, B};
    e.window = M / 2;  // h2o_evictor: the recent half of the budget
    std::int64_t n = 0;
    static const float increments[] = {0.0f, 0.0f, 0.25f, 0.5f, 1.0f};
    for (int step = 0; step < cudatest::steps(120, 24); ++step) {
      const int tokens = step == 0 ? 30 : 1;
      tw.append(rng, tokens, static_cast<std::int32_t>(n));
      n += tokens;
      tw.compare("append", step);  // append zeroed the new entries' mass on both sides
      auto& pool = tw.cpu.pool();
      for (int s = 0; s < tw.segments; ++s) {
        const auto layout = tw.cpu.layout(tw.seq_of(s), tw.layer_of(s), tw.head_of(s));
        for (std::int64_t i = 0; i < layout.length; ++i)
          pool.add_to_field(layout.slot(i), kp::Field::attention_mass, increments[std::uniform_int_distribution<int>(0, 4)(rng)]);
      }
      std::vector<float> am(tw.mass.size(), 0.0f);
      for (std::int64_t slot = 0; slot < pool.slots(); ++slot) am[slot] = pool.meta(slot).attention_mass;
      tw.mass.upload(am);
      cpu_evict(tw, e, n, kp::score::AttentionMass{});
      device_evict(tw, e, n, kp::score::AttentionMass{});
      tw.compare("evict_step (H2O)", step);
    }
  }
}

using cudatest::NaNAt;

TEST_CASE("an eviction step meeting a NaN score reports it and changes nothing") {
  std::mt19937_64 rng(9);
  const kp::CacheShape shape{2, 2, 2, 64};
  Twin tw(shape, 2, 64);
  tw.append(rng, 40, 0);
  const auto before_len = tw.length.download(), before_table = tw.table.download();
  const auto before_free = tw.free_count.download();
  const auto before_meta = tw.meta.download();
  kp::evict::PerHead<> e;
  e.rule = {8, 1};
  DeviceBuffer<kp::StepContext> ctx(std::vector<kp::StepContext>(2, kp::StepContext{40, 0, false, 0}));
  std::size_t bytes = 0;
  kc::evict_step(nullptr, bytes, NaNAt{7}, e, shape, tw.kv(), tw.tables(), tw.free(), ctx.get(), nullptr,
                 tw.status.get(), nullptr);
  DeviceBuffer<unsigned char> ws(bytes);
  kc::evict_step(ws.get(), bytes, NaNAt{7}, e, shape, tw.kv(), tw.tables(), tw.free(), ctx.get(), nullptr,
                 tw.status.get(), nullptr);
  cudatest::sync();
  CHECK(tw.status.download()[0].code == kc::Status::nan_score);
  CHECK(tw.length.download() == before_len);
  CHECK(tw.table.download() == before_table);
  CHECK(tw.free_count.download() == before_free);
  CHECK(std::memcmp(tw.meta.download().data(), before_meta.data(), before_meta.size() * sizeof(float)) == 0);
}

TEST_CASE("append that does not fit reports it and changes nothing") {
  std::mt19937_64 rng(3);
  const kp::CacheShape shape{1, 2, 2, 64};
  Twin tw(shape, 1, 3);  // 2 heads, 3 pages of 16
  tw.append(rng, 16, 0);  // one page each
  const auto before_len = tw.length.download(), before_table = tw.table.download();
  const auto before_free = tw.free_count.download();
  std::vector<float> k(2 * 20 * 64, 1.0f), lb(2 * 20, -0.5f);
  std::vector<std::int32_t> pos(2 * 20, 99), seg{0, 1};
  DeviceBuffer<float> dk(k), dv(k), dlb(lb);
  DeviceBuffer<std::int32_t> dpos(pos), dseg(seg);
  kc::AppendRows<float> rows{dseg.get(), 2, 20, dk.get(), dv.get(), dpos.get(), dlb.get()};  // needs 4 pages, 1 free
  std::size_t bytes = 0;
  kc::append(nullptr, bytes, tw.kv(), tw.tables(), tw.free(), rows, tw.status.get(), nullptr);
  DeviceBuffer<unsigned char> ws(bytes);
  kc::append(ws.get(), bytes, tw.kv(), tw.tables(), tw.free(), rows, tw.status.get(), nullptr);
  cudatest::sync();
  const kc::Status st = tw.status.download()[0];
  CHECK(st.code == kc::Status::out_of_pages);
  CHECK(st.needed == 4);
  CHECK(st.available == 1);
  CHECK(tw.length.download() == before_len);
  CHECK(tw.table.download() == before_table);
  CHECK(tw.free_count.download() == before_free);
}

TEST_CASE("memory and eviction arguments are checked before any launch" * doctest::test_suite("host")) {
  kc::PagedKV<float> kv;
  kc::BlockTableView t;
  kc::FreeList f;
  kc::AppendRows<float> rows;
  rows.tokens = -1;
  std::size_t bytes = 0;
  CHECK_THROWS_WITH(kc::append(nullptr, bytes, kv, t, f, rows, nullptr, nullptr), doctest::Contains("tokens = -1"));
  rows.tokens = 1;
  rows.rows = 5;
  kc::append(nullptr, bytes, kv, t, f, rows, nullptr, nullptr);  // a size query needs no device
  CHECK(bytes > 0);
  CHECK_THROWS_WITH(kc::append(reinterpret_cast<void*>(256), bytes, kv, t, f, rows, nullptr, nullptr),
                    doctest::Contains("the K/V pool needs keys, values, position and write_score"));

  const kp::CacheShape shape{2, 2, 2, 64};
  kp::evict::PerHead<> r;
  r.rule = {8, 128};
  r.window = 9;
  const auto decay = kp::score::RetentionDecay{};
  CHECK_THROWS_WITH(kc::evict_step(nullptr, bytes, decay, r, shape, kv, t, f, nullptr, nullptr, nullptr, nullptr),
                    doctest::Contains("window w = 9 must be in [0, budget M = 8]"));
  kp::evict::Global g{8, 128};
  g.floor_ratio = 0.5;
  g.threshold = 0.5;
  CHECK_THROWS_WITH(kc::evict_step(nullptr, bytes, decay, g, shape, kv, t, f, nullptr, nullptr, nullptr, nullptr),
                    doctest::Contains("are exclusive variants"));
  g.threshold = 0.0;
  float dummy = 0.0f;
  std::int32_t idummy = 0;
  kv = kc::PagedKV<float>{&dummy, &dummy, &idummy, &dummy, 10, 16, 64};
  t = kc::BlockTableView{&idummy, &idummy, 6, 10};
  CHECK_THROWS_WITH(kc::evict_step(nullptr, bytes, decay, g, shape, kv, t, f, nullptr, nullptr, nullptr, nullptr),
                    doctest::Contains("segments = 6 is not a multiple of L x Hkv = 4"));
  t.segments = 8;
  kc::evict_step(nullptr, bytes, decay, g, shape, kv, t, f, nullptr, nullptr, nullptr, nullptr);
  CHECK(bytes >= 160 * (sizeof(float) + sizeof(std::int32_t) + 1));
  // a Scorer reading what the pool does not hold is refused (it would read 0 for every entry)
  r.window = 4;
  CHECK_THROWS_WITH(kc::evict_step(nullptr, bytes, kp::score::AttentionMass{}, r, shape, kv, t, f, nullptr, nullptr,
                                   nullptr, nullptr),
                    doctest::Contains("this Scorer ranks by attention_mass (H2O); the pool has none"));
  CHECK_THROWS_WITH(kc::evict_step(nullptr, bytes, kp::score::NegKeyNorm{}, r, shape, kv, t, f, nullptr, nullptr,
                                   nullptr, nullptr),
                    doctest::Contains("this Scorer reads key_norm; the pool has none"));
  kv.fields[kp::Field::attention_mass] = &dummy;
  kc::evict_step(nullptr, bytes, kp::score::AttentionMass{}, r, shape, kv, t, f, nullptr, nullptr, nullptr, nullptr);
}
