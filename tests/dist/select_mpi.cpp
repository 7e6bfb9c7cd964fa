// dist::select_pools over MPI ranks against the unsharded selection (tests/dist/sharded_selection.hpp):
//   mpirun -np R kvpolicy_dist_select_mpi [CASES]     every rank draws the same CASES random cases
//   mpirun -np R kvpolicy_dist_select_mpi --cost      bytes and round trips of one selection at
//                                                     L = 32, Hkv = 8 (docs/distributed.md)
// Exit status 1 (on every rank) if any entry's fate differs from the unsharded cache's.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "kvpolicy/dist/mpi.hpp"
#include "sharded_selection.hpp"

namespace {

using namespace kvpolicy;

/// One selection over 1,152 entries per head (M = 1024, B = 128: the trigger's length) with random
/// scores, as the CUDA bench's shape: what a DBTrimKV eviction sends.
void cost(dist::Mpi& mpi, bool layer) {
  const CacheShape shape{32, 8, 32, 128};
  const int per = shape.kv_heads / mpi.size();
  std::mt19937_64 rng(7);
  std::vector<float> score;
  std::vector<std::int32_t> position;
  std::vector<std::int64_t> offsets{0}, global_head;
  for (int l = 0; l < shape.layers; ++l)
    for (int h = 0; h < shape.kv_heads; ++h) {
      for (int i = 0; i < 1152; ++i) {
        const float x = std::uniform_real_distribution<float>(-8.0f, 0.0f)(rng);
        if (h / per != mpi.rank()) continue;
        score.push_back(x);
        position.push_back(i);
      }
      if (h / per != mpi.rank()) continue;
      offsets.push_back(static_cast<std::int64_t>(score.size()));
      global_head.push_back(head_index(shape, l, h));
    }
  dist::Counted<dist::Mpi> counted{mpi};
  std::vector<std::uint8_t> keep(score.size());
  const evict::Global g{1024, 128};
  const evict::LayerWise lw{1024, 128};
  const SegmentedScores s{score, position, offsets};
  if (layer)
    dist::select_pools(counted, lw.selection(), lw.group_heads(shape), shape.heads_total(), s, global_head, keep);
  else
    dist::select_pools(counted, g.selection(), g.group_heads(shape), shape.heads_total(), s, global_head, keep);
  std::int64_t kept = std::count(keep.begin(), keep.end(), std::uint8_t{1});
  std::vector<std::int64_t> total{kept};
  mpi.all_reduce_sum(total);
  if (mpi.rank() == 0)
    std::printf("TP = %d, L = %d, Hkv = %d, %s: %lld round trips, %lld bytes per rank; kept %lld of %lld\n", mpi.size(),
                shape.layers, shape.kv_heads, layer ? "layer-wise" : "global", static_cast<long long>(counted.round_trips),
                static_cast<long long>(counted.bytes), static_cast<long long>(total[0]),
                static_cast<long long>(shape.heads_total() * 1152));
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    dist::Mpi mpi(MPI_COMM_WORLD);
    if (argc > 1 && std::strcmp(argv[1], "--cost") == 0) {
      cost(mpi, false);
      cost(mpi, true);
    } else {
      const long cases = argc > 1 ? std::atol(argv[1]) : 1000;
      std::vector<std::int64_t> bad{0, 0};
      for (long seed = 1; seed <= cases; ++seed) {
        std::vector<std::int64_t> b{disttest::mismatches(mpi, disttest::draw(static_cast<std::uint64_t>(seed), mpi.size()))};
        mpi.all_reduce_sum(b);  // over the ranks: the case's count
        bad[0] += b[0];
        bad[1] += b[0] > 0;
      }
      if (mpi.rank() == 0)
        std::printf("dist::select_pools on %d ranks: %ld cases, %lld entries (or heads' triggers) differ from the unsharded "
                    "selection (in %lld cases)\n", mpi.size(), cases, static_cast<long long>(bad[0]), static_cast<long long>(bad[1]));
      status = bad[0] == 0 ? 0 : 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 2;
  }
  // the verdict over every rank, printed once MPI has finalized: ctest passes on this line
  // (PASS_REGULAR_EXPRESSION), so that Open MPI's launcher losing a rank's finalize notice on a
  // loaded host ("exiting improperly", after every check has run) cannot fail the entry
  int rank = 0, worst = status;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  if (rank == 0 && worst == 0) std::printf("verdict: every rank passed\n");
  return status;
}
