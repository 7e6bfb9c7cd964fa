// dist::select_pools without MPI: one rank (dist::Local) and groups of 2-4 ranks as threads of this
// process (a test communicator below), each against the unsharded selection on the same random
// cases with ties (tests/dist/sharded_selection.hpp). The same check runs under mpirun in ctest's
// dist_select_mpi_* tests where OpenMPI is installed.
#include <doctest/doctest.h>

#include <barrier>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dist/sharded_selection.hpp"
#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/dist/communicator.hpp"
#include "kvpolicy/dist/sharded.hpp"
#include "kvpolicy/trimkv.hpp"
#include "nan_scorer.hpp"
#include "snapshot.hpp"

namespace {

using namespace kvpolicy;

/// `size` ranks as threads: all_reduce_sum sums every rank's array through shared memory.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), sync_(size) {}
  struct Rank {
    ThreadGroup* group;
    int id;
    int rank() const { return id; }
    int size() const { return group->size_; }
    void all_reduce_sum(std::span<std::int64_t> values) { group->reduce(id, values, group->counts_); }
    void all_reduce_sum(std::span<float> values) { group->reduce(id, values, group->floats_); }
    void broadcast(std::span<std::int64_t> values, int root) { group->share(id, root, values, group->counts_); }
    void broadcast(std::span<float> values, int root) { group->share(id, root, values, group->floats_); }
  };

 private:
  template <class T>
  void reduce(int id, std::span<T> values, std::vector<T>& sum) {
    if (id == 0) sum.assign(values.size(), T{});
    sync_.arrive_and_wait();
    {
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < values.size(); ++i) sum[i] += values[i];
    }
    sync_.arrive_and_wait();
    std::copy(sum.begin(), sum.end(), values.begin());
    sync_.arrive_and_wait();
  }
  template <class T>
  void share(int id, int root, std::span<T> values, std::vector<T>& from) {
    if (id == root) from.assign(values.begin(), values.end());
    sync_.arrive_and_wait();
    if (id != root) std::copy(from.begin(), from.end(), values.begin());
    sync_.arrive_and_wait();
  }
  int size_;
  std::barrier<> sync_;
  std::mutex mutex_;
  std::vector<std::int64_t> counts_;
  std::vector<float> floats_;
};

static_assert(dist::Communicator<ThreadGroup::Rank>);

}  // namespace

TEST_CASE("dist::select_pools on one rank keeps what the unsharded selection keeps") {
  dist::Local local;
  std::int64_t bad = 0;
  for (std::uint64_t seed = 1; seed <= 1000; ++seed) bad += disttest::mismatches(local, disttest::draw(seed, 1));
  CHECK(bad == 0);
}

TEST_CASE("dist::select_pools over 2, 3 and 4 ranks (threads) keeps what one rank keeps") {
  for (int ranks = 2; ranks <= 4; ++ranks) {
    ThreadGroup group(ranks);
    std::vector<std::int64_t> bad(static_cast<std::size_t>(ranks), 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        ThreadGroup::Rank comm{&group, r};
        for (std::uint64_t seed = 1; seed <= 500; ++seed)
          bad[static_cast<std::size_t>(r)] += disttest::mismatches(comm, disttest::draw(seed, ranks));
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < ranks; ++r) {
      INFO("ranks ", ranks, " rank ", r);
      CHECK(bad[static_cast<std::size_t>(r)] == 0);
    }
  }
}

TEST_CASE("dist::pooled_top_k refuses what does not describe pools") {
  dist::Local local;
  std::vector<std::uint64_t> key{1, 2};
  std::vector<std::int64_t> head{0, 5}, k{1};
  std::vector<std::uint8_t> keep(2);
  CHECK_THROWS_WITH_AS(dist::pooled_top_k(local, key, head, 2, 1, k, keep),
                       "kvpolicy: dist::pooled_top_k: entry 1 has head 5, outside the 2 heads of the pools",
                       Error);
  std::vector<std::int64_t> short_head{0};
  CHECK_THROWS_AS(dist::pooled_top_k(local, key, short_head, 2, 1, k, keep), Error);
}

TEST_CASE("dist::Sharded's trigger sums every pool in one round trip, and decides as the unsharded one") {
  // L = 6 layers, so the layer-wise evictor has 6 pools; 2 ranks as threads, each with 1 of 2 kv heads
  const CacheShape full{6, 2, 2, 8};
  DBTrimKVConfig c;
  c.budget = 4;
  c.buffer = 2;
  const evict::LayerWise inner = dbtrimkv_layerwise_evictor(c);
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(full.heads_total()));
    for (auto& n : lengths) n = std::uniform_int_distribution<std::int64_t>(0, 8)(rng);
    std::vector<std::uint8_t> want(lengths.size());
    const bool want_any = evict::trigger_heads(inner, full, StepContext{}, lengths, want);
    ThreadGroup group(2);
    std::vector<std::int64_t> trips(2), mismatches(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        ThreadGroup::Rank rank{&group, r};
        dist::Counted<ThreadGroup::Rank> counted{rank};
        const dist::Sharded<evict::LayerWise, dist::Counted<ThreadGroup::Rank>> e{inner, &counted, full};
        const CacheShape local = e.local_shape();
        std::vector<std::int64_t> mine(static_cast<std::size_t>(local.heads_total()));
        for (std::size_t j = 0; j < mine.size(); ++j)
          mine[j] = lengths[static_cast<std::size_t>(e.global_head(static_cast<std::int64_t>(j)))];
        std::vector<std::uint8_t> active(mine.size());
        const bool any = evict::trigger_heads(e, local, StepContext{}, mine, active);
        for (std::size_t j = 0; j < mine.size(); ++j)
          mismatches[static_cast<std::size_t>(r)] +=
              active[j] != want[static_cast<std::size_t>(e.global_head(static_cast<std::int64_t>(j)))];
        mismatches[static_cast<std::size_t>(r)] += any != want_any;
        trips[static_cast<std::size_t>(r)] = counted.round_trips;
      });
    for (auto& t : ranks) t.join();
    CHECK(trips == std::vector<std::int64_t>{1, 1});
    CHECK(mismatches == std::vector<std::int64_t>{0, 0});
  }
}

TEST_CASE("a user-defined Scorer's NaN on one rank refuses the commit on every rank, and changes nothing") {
  // L = 1, Hkv = 2 over 2 ranks (threads), one global pool of M = 2, B = 1: it fires when the two
  // heads hold 6 entries, at the third step; rank 1's second entry scores NaN
  const CacheShape full{1, 2, 2, 2};
  evict::Global inner;
  inner.budget = 2;
  inner.buffer = 1;
  ThreadGroup group(2);
  std::vector<std::string> errors(2);
  std::vector<int> unchanged(2, 0), later(2, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      ThreadGroup::Rank rank{&group, r};
      const dist::Sharded<evict::Global, ThreadGroup::Rank> e{inner, &rank, full};
      Cache<testing::NaNScorer, admit::All, std::decay_t<decltype(e)>, memory::Paged<2>, cpu_backend> cache(e.local_shape(),
                                                                                       memory::Paged<2>(16), e);
      cache.add_sequence(0);
      std::vector<float> k(2, 1.0f);
      const auto step = [&](float lb) {
        std::vector<float> b{lb};
        return cache.step(0, View<const float, 4>(k.data(), {1, 1, 1, 2}), View<const float, 4>(k.data(), {1, 1, 1, 2}),
                          View<const float, 3>(b.data(), {1, 1, 1}));
      };
      step(-0.5f);
      step(r == 1 ? -0.125f : -0.25f);
      const auto before = testing::snapshot(cache, {0}, /*whole_pool=*/false);
      try {
        step(-0.75f);
      } catch (const Error& err) {
        errors[static_cast<std::size_t>(r)] = err.what();
      }
      unchanged[static_cast<std::size_t>(r)] = testing::snapshot(cache, {0}, false) == before && cache.tokens(0) == 2;
      // the ranks go on together: a step without NaN scores (rank 1's NaN entry is still held, so
      // every rank refuses again until it leaves; here the pool stays below its trigger)
      cache.remove_sequence(0);
      cache.add_sequence(1);
      std::vector<float> b{-0.5f};
      cache.step(1, View<const float, 4>(k.data(), {1, 1, 1, 2}), View<const float, 4>(k.data(), {1, 1, 1, 2}),
                 View<const float, 3>(b.data(), {1, 1, 1}));
      later[static_cast<std::size_t>(r)] = static_cast<int>(cache.length(1, 0, 0));
    });
  for (auto& t : ranks) t.join();
  CHECK(errors[0] == errors[1]);
  CHECK(errors[0].find("rank 1 refused") != std::string::npos);
  CHECK(errors[0].find("scorer returned NaN") != std::string::npos);
  CHECK(unchanged == std::vector<int>{1, 1});
  CHECK(later == std::vector<int>{1, 1});
}
