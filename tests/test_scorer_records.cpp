// A new kind of recorded signal, written outside the library in one type (core/concepts.hpp,
// RecordingScorer): the Cache keeps its record per sequence, calls its hooks (open, open a step,
// record, commit, discard on a step taken back, drop with the sequence) and scores a head from it
// with the K/V it declares, without naming it; the device and engine-owned K/V refuse it. Its
// survivors are checked against the signal recomputed from the steps as they were committed.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "kvpolicy/baselines.hpp"
#include "kvpolicy/cpu.hpp"
#include "kvpolicy/cuda/device_parts.hpp"
#include "kvpolicy/trimkv.hpp"

using namespace kvpolicy;

namespace {

/// What the hooks were called with, shared by the test and the Cache's copy of the Scorer.
struct HookLog {
  std::vector<std::int64_t> opened_steps;  // open_step's `first`
  int records = 0, commits = 0, discards = 0, scored_heads = 0;
  std::int64_t live_records = 0;           // records opened and not yet dropped
};

/// Ranks a layer's entries by the sign of the sum of every query's first component at that layer
/// so far: non-negative keeps the newest (score = position), negative the oldest (score = -position);
/// and checks that it is handed the head's keys as stored.
struct QuerySignScorer {
  struct Record {
    std::vector<double> committed, pending;  // per layer
    std::shared_ptr<HookLog> log;
    Record() = default;
    Record(std::size_t layers, std::shared_ptr<HookLog> l) : committed(layers), pending(layers), log(std::move(l)) {
      ++log->live_records;
    }
    Record(Record&& o) noexcept : committed(std::move(o.committed)), pending(std::move(o.pending)), log(std::move(o.log)) {}
    Record& operator=(Record&& o) noexcept {
      if (log) --log->live_records;
      committed = std::move(o.committed);
      pending = std::move(o.pending);
      log = std::move(o.log);
      return *this;
    }
    ~Record() {
      if (log) --log->live_records;
    }
  };
  static constexpr EntryData head_data{.keys = true};
  std::shared_ptr<HookLog> log = std::make_shared<HookLog>();

  void validate() const {}
  Record open_record(const CacheShape& shape, std::int64_t) const { return Record(static_cast<std::size_t>(shape.layers), log); }
  void open_step(Record&, std::int64_t first) const { log->opened_steps.push_back(first); }
  void record_queries(Record& r, int layer, View<const float, 3> queries, std::int64_t) const {
    ++log->records;
    for (std::int64_t h = 0; h < queries.dim(0); ++h)
      for (std::int64_t t = 0; t < queries.dim(1); ++t) r.pending[static_cast<std::size_t>(layer)] += queries(h, t, 0);
  }
  void commit_record(Record& r) const {
    ++log->commits;
    for (std::size_t l = 0; l < r.pending.size(); ++l) r.committed[l] += std::exchange(r.pending[l], 0.0);
  }
  void discard_record(Record& r, EntryFields) const {
    ++log->discards;
    std::fill(r.pending.begin(), r.pending.end(), 0.0);
  }
  void score_recorded(const Record& r, HeadEntries e, StepContext, std::span<float> out) const {
    ++log->scored_heads;
    REQUIRE(e.keys.dim(0) == static_cast<std::int64_t>(e.meta.size()));
    REQUIRE(e.values.size() == 0);  // not declared in head_data
    const auto l = static_cast<std::size_t>(e.layer);
    const bool newest = r.committed[l] + r.pending[l] >= 0.0;
    for (std::size_t j = 0; j < e.meta.size(); ++j) {
      CHECK(e.keys(static_cast<std::int64_t>(j), 0) == static_cast<float>(e.meta[j].position));  // key[0] = position below
      out[j] = static_cast<float>(newest ? e.meta[j].position : -e.meta[j].position);
    }
  }
};
static_assert(RecordScorer<QuerySignScorer> && Scorer<QuerySignScorer>);

/// Declares the device's observed-attention kernel without score::ObservedAttention's settings.
struct MisdeclaredScorer : QuerySignScorer {
  static constexpr DeviceScoring device_scoring = DeviceScoring::observed_attention;
};

/// The same, reading each head's values too.
struct ValueReadingScorer : QuerySignScorer {
  static constexpr EntryData head_data{.keys = true, .values = true};
};

using UserCache = Cache<QuerySignScorer, admit::All, evict::PerHead<>, memory::Paged<4>, cpu_backend>;

}  // namespace

TEST_CASE("a user's recording Scorer: where it runs, decided by what it declares") {
  static_assert(detail::ScorerRecords<QuerySignScorer>::observes_attention);
  static_assert(!detail::ScorerRecords<QuerySignScorer>::needs_mass);
  static_assert(UserCache::observes_attention && UserCache::reads_stored_kv);
  // the device runs what a Scorer declares it runs (core/record.hpp), and refuses the rest
  static_assert(!gpu::device_scores<QuerySignScorer>);
  static_assert(!gpu::device_scores<MisdeclaredScorer>);
  static_assert(gpu::device_scores<score::ObservedAttention>);
  static_assert(gpu::device_scores<score::Recency> && gpu::device_scores<score::RetentionDecay>);
  static_assert(!gpu::device_scores<score::AttentionMass> && !gpu::device_scores<score::KeyDiff>);
  static_assert(!gpu::device_scores<score::ExpectedAttention> && !gpu::device_scores<score::GatedObservedAttention>);
  // over engine-owned K/V it reads the engine's keys (a step without them is refused); one that
  // also reads values cannot run so: the Cache says why
  using EngineOwned = Cache<QuerySignScorer, admit::All, evict::PerHead<>, memory::Paged<4, engine_owned>, cpu_backend>;
  static_assert(EngineOwned::reads_engine_keys);
  evict::PerHead<> e;
  e.rule = {4, 1};
  EngineOwned owned(CacheShape{1, 1, 1, 2}, memory::Paged<4, engine_owned>(16), e);
  owned.add_sequence(0);
  const std::vector<float> k{1.0f, 2.0f}, lb{0.0f};
  CHECK_THROWS_WITH(owned.append(0, 0, View<const float, 3>(k.data(), {1, 1, 2}), {}, View<const float, 2>(lb.data(), {1, 1})),
                    doctest::Contains("Cache::use_engine_keys"));
  CHECK(owned.length(0, 0, 0) == 0);
  using ValuesOwned = Cache<ValueReadingScorer, admit::All, evict::PerHead<>, memory::Paged<4, engine_owned>, cpu_backend>;
  CHECK_THROWS_WITH(ValuesOwned(CacheShape{1, 1, 1, 2}, memory::Paged<4, engine_owned>(16), e),
                    doctest::Contains("reads the values of stored entries"));
}

TEST_CASE("a user's recording Scorer: the Cache calls its hooks, takes a step back through them, and keeps what its record ranks") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int L = 1 + trial % 3, H = 1 + trial % 2, G = 1 + (trial / 2) % 2, d = 2;
    const CacheShape shape{L, H, H * G, d};
    const std::int64_t M = std::uniform_int_distribution<int>(2, 8)(rng), B = std::uniform_int_distribution<int>(1, 3)(rng);
    evict::PerHead<> e;
    e.rule = {M, B};
    QuerySignScorer scorer;
    const auto log = scorer.log;
    {
      UserCache cache(shape, memory::Paged<4>(4096), e, scorer);
      cache.add_sequence(3);
      CHECK(log->live_records == 1);
      std::vector<double> sign_sum(static_cast<std::size_t>(L), 0.0);  // the committed steps' sums, recomputed here
      std::vector<std::set<std::int32_t>> kept(static_cast<std::size_t>(L * H));  // the oracle's survivors
      std::int64_t n = 0;
      int steps = 0, aborted = 0;
      std::vector<std::int64_t> opened;  // each step's first position, as open_step must see it
      for (int step = 0; step < 30; ++step) {
        const std::int64_t T = step == 0 ? std::uniform_int_distribution<int>(1, 12)(rng) : std::uniform_int_distribution<int>(1, 3)(rng);
        std::vector<float> k(static_cast<std::size_t>(L * H * T * d)), q(static_cast<std::size_t>(L * H * G * T * d)), out(q.size()),
            lb(static_cast<std::size_t>(L * H * T), 0.0f);
        for (int l = 0; l < L; ++l)
          for (int h = 0; h < H; ++h)
            for (std::int64_t t = 0; t < T; ++t) {
              const auto at = static_cast<std::size_t>(((l * H + h) * T + t) * d);
              k[at] = static_cast<float>(n + t);  // key[0] = position: score_recorded checks it is handed the keys
              k[at + 1] = std::normal_distribution<float>()(rng);
            }
        std::vector<double> step_sum(static_cast<std::size_t>(L), 0.0);
        for (int l = 0; l < L; ++l)
          for (int h = 0; h < H * G; ++h)
            for (std::int64_t t = 0; t < T; ++t) {
              const auto at = static_cast<std::size_t>(((l * H * G + h) * T + t) * d);
              q[at] = static_cast<float>(std::uniform_int_distribution<int>(-3, 3)(rng));
              q[at + 1] = std::normal_distribution<float>()(rng);
              step_sum[static_cast<std::size_t>(l)] += q[at];
            }
        const View<const float, 4> K(k.data(), {L, H, T, d}), Q(q.data(), {L, H * G, T, d});
        const View<const float, 3> LB(lb.data(), {L, H, T});
        if (step % 4 == 3) {  // the same step attended, then taken back: its queries must not count
          ++aborted;
          opened.push_back(n);
          for (int l = 0; l < L; ++l) {
            cache.append(3, l, View<const float, 3>(&k[static_cast<std::size_t>(l * H * T * d)], {H, T, d}),
                         View<const float, 3>(&k[static_cast<std::size_t>(l * H * T * d)], {H, T, d}),
                         View<const float, 2>(&lb[static_cast<std::size_t>(l * H * T)], {H, T}));
            std::vector<float> flipped(q.begin() + l * H * G * T * d, q.begin() + (l + 1) * H * G * T * d);
            for (std::size_t i = 0; i < flipped.size(); i += d) flipped[i] = -100.0f;
            cache.attend(3, l, View<const float, 3>(flipped.data(), {H * G, T, d}),
                         View<float, 3>(&out[static_cast<std::size_t>(l * H * G * T * d)], {H * G, T, d}));
          }
          cache.abort_step(3);
        }
        cache.step(3, K, K, LB, Q, View<float, 4>(out.data(), {L, H * G, T, d}));
        ++steps;
        opened.push_back(n);
        // the oracle: every head appends T, then any head at M + B keeps its M best by the layer's sign
        for (int l = 0; l < L; ++l) {
          sign_sum[static_cast<std::size_t>(l)] += step_sum[static_cast<std::size_t>(l)];
          for (int h = 0; h < H; ++h) {
            auto& s = kept[static_cast<std::size_t>(l * H + h)];
            for (std::int64_t t = 0; t < T; ++t) s.insert(static_cast<std::int32_t>(n + t));
            if (static_cast<std::int64_t>(s.size()) >= M + B) {
              std::vector<std::int32_t> v(s.begin(), s.end());
              if (sign_sum[static_cast<std::size_t>(l)] >= 0.0)
                v.erase(v.begin(), v.end() - M);  // the newest M
              else
                v.resize(static_cast<std::size_t>(M));  // the oldest M
              s = std::set<std::int32_t>(v.begin(), v.end());
            }
          }
        }
        n += T;
        for (int l = 0; l < L; ++l)
          for (int h = 0; h < H; ++h) {
            std::set<std::int32_t> got;
            for (std::int64_t j = 0; j < cache.length(3, l, h); ++j) got.insert(cache.entry(3, l, h, j).position);
            REQUIRE_MESSAGE(got == kept[static_cast<std::size_t>(l * H + h)], "trial ", trial, " step ", step, " layer ", l,
                            " head ", h);
          }
      }
      CHECK(log->commits == steps);
      CHECK(log->discards == aborted);
      CHECK(log->records == (steps + aborted) * L);
      CHECK(log->opened_steps == opened);
      CHECK(log->scored_heads > 0);
      CHECK(log->live_records == 1);
      cache.remove_sequence(3);
      CHECK(log->live_records == 0);  // dropped with its sequence
    }
  }
}
