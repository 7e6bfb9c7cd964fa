// dist::select_pools without MPI: one rank (dist::Local) and groups of 2-4 ranks as threads of this
// process (a test communicator below), each against the unsharded selection on the same random
// cases with ties (tests/dist/sharded_selection.hpp). The same check runs under mpirun in ctest's
// dist_select_mpi_* tests where OpenMPI is installed.
#include <doctest/doctest.h>

#include <barrier>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/sharded_selection.hpp"
#include "kvpolicy/dist/communicator.hpp"

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
