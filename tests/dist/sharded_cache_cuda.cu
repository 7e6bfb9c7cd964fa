// The device Cache sharded over ranks by kv head (Cache<..., cuda_backend> with dist::Sharded, one
// rank per process) against the unsharded CPU Cache:
//   mpirun -np R kvpolicy_dist_sharded_cache_cuda [TRACES] [--nccl]
// Every rank draws the same random traces (tests/dist/sharded_trace.hpp: sequences added and
// removed, prefills and decode steps, log beta with ties, steps one rank refuses) and runs them
// through the unsharded CPU Cache and through its device Cache of the kv heads
// [r Hkv / R, (r + 1) Hkv / R): DBTrimKV global (floor, window, sinks) and layer-wise, whose
// selection runs over the ranks, and TRIM-KV per head, which needs no rank but its own. After every
// step its heads hold exactly the CPU's entries there, its attention outputs match within 1e-5
// (relative L2: the device's kernels round otherwise), and the evictions over the ranks add up.
// Then a NaN that one rank's device scores in a commit refuses it on every rank, changing nothing.
// The group's communicator is the MPI one (dist::Mpi: ranks may share a GPU), or with --nccl an NCCL
// communicator over the same ranks (dist::Nccl: NCCL takes one GPU per rank; built where NCCL is
// found). Exit status 77 (SKIPPED) where a rank has no GPU, or --nccl has too few or no NCCL.
#include <cuda_runtime.h>
#include <mpi.h>
#ifdef KVPOLICY_HAVE_NCCL
#include <nccl.h>

#include "kvpolicy/dist/nccl.hpp"
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kvpolicy/cuda/backend.cuh"
#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/dist/mpi.hpp"
#include "kvpolicy/dist/sharded.hpp"
#include "kvpolicy/trimkv.hpp"
#include "sharded_trace.hpp"

namespace {

using namespace kvpolicy;

struct Tally : disttest::TraceTally {
  std::int64_t pooled = 0, per_head = 0;  // traces of each kind
};

/// A user-defined Scorer (the built-in ones never return NaN): NaN where the write score is
/// -0.125, RetentionDecay elsewhere.
struct NaNAtWriteScore {
  void validate() const {}
  KVPOLICY_HD float operator()(EntryMeta m, StepContext c) const {
    return m.write_score == -0.125f ? dtype::bits_float(0x7fc00000u) : score::RetentionDecay{}(m, c);
  }
};

/// A NaN that the last rank's device scores in a commit (which Cache::check_step cannot foresee)
/// refuses that commit on every rank with the same error, and changes nothing on any (the executor
/// runs its scoring through the sharded Evictor's agree_on). L = 1, one kv head per rank, one global
/// pool of M = 2, B = 1: it fires at the third step. Returns the differences on this rank.
template <dist::Communicator C>
std::int64_t nan_score_refused_everywhere(C& comm) {
  const CacheShape full{1, comm.size(), comm.size(), 64};
  evict::Global inner;
  inner.budget = 2;
  inner.buffer = 1;
  const dist::Sharded<evict::Global, C> e{inner, &comm, full};
  Cache<NaNAtWriteScore, admit::All, std::decay_t<decltype(e)>, memory::Paged<16>, cuda_backend> cache(
      e.local_shape(), memory::Paged<16>(8), e);
  std::vector<float> k(64, 1.0f), q(64, 0.5f), out(64);
  const auto step = [&](std::int64_t seq, float lb) {
    std::vector<float> b{lb};
    return cache.step(seq, View<const float, 4>(k.data(), {1, 1, 1, 64}), View<const float, 4>(k.data(), {1, 1, 1, 64}),
                      View<const float, 3>(b.data(), {1, 1, 1}), View<const float, 4>(q.data(), {1, 1, 1, 64}),
                      View<float, 4>(out.data(), {1, 1, 1, 64}));
  };
  const int refusing = comm.size() - 1;
  cache.add_sequence(0);
  step(0, -0.5f);
  step(0, comm.rank() == refusing ? -0.125f : -0.25f);
  const std::int64_t pages = cache.pages_free(), length = cache.length(0, 0, 0);
  std::string message;
  try {
    step(0, -0.75f);
  } catch (const Error& err) {
    message = err.what();
  }
  std::int64_t bad = 0;
  bad += message.rfind("kvpolicy: rank " + std::to_string(refusing) + " refused: Cache::commit: the scorer returned NaN", 0) != 0;
  bad += cache.tokens(0) != 2 || cache.length(0, 0, 0) != length || cache.pages_free() != pages;
  const auto h = static_cast<std::int64_t>(std::hash<std::string>{}(message) & 0xfffff);
  std::vector<std::int64_t> same{h, h * h};  // every rank's message the same: zero variance
  comm.all_reduce_sum(same);
  bad += same[1] * comm.size() != same[0] * same[0];
  // the ranks go on together: the sequence leaves, a new one steps on every rank
  cache.remove_sequence(0);
  cache.add_sequence(1);
  step(1, -0.5f);
  bad += cache.length(1, 0, 0) != 1;
  if (bad != 0) std::fprintf(stderr, "rank %d: the NaN score's refusal: \"%s\"\n", comm.rank(), message.c_str());
  return bad;
}

/// `traces` random traces over the group `comm`; returns the differences summed over the ranks.
template <dist::Communicator C>
std::int64_t run_traces(C& comm, long traces, Tally& tally) {
  std::int64_t bad = 0;
  for (long seed = 1; seed <= traces; ++seed) {
    const disttest::TraceCaches t(static_cast<std::uint64_t>(seed), comm.size(), 64);
    const CacheShape& full = t.shape;
    const DBTrimKVConfig& c = t.c;
    const CacheShape local{full.layers, full.kv_heads / comm.size(), full.q_heads / comm.size(), full.head_dim};
    const int kind = t.kind;  // DBTrimKV global, layer-wise, TRIM-KV per head
    const std::int64_t pages_full = t.pages, pages_local = pages_full / comm.size();
    // the unsharded CPU Cache and this rank's device Cache, whose Evictor with_sharded_evictor makes
    const auto run = [&](const auto& inner, const auto& scorer) {
      using Inner = std::decay_t<decltype(inner)>;
      using S = std::decay_t<decltype(scorer)>;
      return dist::with_sharded_evictor(inner, &comm, full, [&](const auto& e) {
        Cache<S, admit::All, Inner, memory::Paged<16>, cpu_backend> whole(full, memory::Paged<16>(pages_full), inner,
                                                                          scorer);
        Cache<S, admit::All, std::decay_t<decltype(e)>, memory::Paged<16>, cuda_backend> mine(
            local, memory::Paged<16>(pages_local), e, scorer);
        return disttest::run_trace(comm, static_cast<std::uint64_t>(seed), whole, mine, false, tally, 1e-5);
      });
    };
    std::vector<std::int64_t> b{0};
    if (kind == 0) {
      b[0] = run(dbtrimkv_evictor(c), dbtrimkv_scorer(c));
    } else if (kind == 1) {
      b[0] = run(dbtrimkv_layerwise_evictor(c), dbtrimkv_scorer(c));
    } else {
      TrimKVConfig per_head;
      per_head.budget = c.budget;
      per_head.buffer = c.buffer;
      per_head.window = c.window;
      per_head.threshold = c.threshold;
      per_head.min_tokens = c.min_tokens;
      b[0] = run(trimkv_evictor(per_head), score::RetentionDecay{});
    }
    (kind < 2 ? tally.pooled : tally.per_head) += 1;
    comm.all_reduce_sum(b);
    bad += b[0];
  }
  std::vector<std::int64_t> b{nan_score_refused_everywhere(comm)};
  comm.all_reduce_sum(b);
  return bad + b[0];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    dist::Mpi mpi(MPI_COMM_WORLD);
    long traces = 12;
    bool nccl = false;
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], "--nccl") == 0)
        nccl = true;
      else
        traces = std::atol(argv[i]);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    std::vector<std::int64_t> without{devices == 0 ? 1 : 0};  // every rank must see a GPU
    mpi.all_reduce_sum(without);
    std::string skip;
    if (without[0] > 0) skip = std::to_string(without[0]) + " rank(s) see no GPU";
#ifndef KVPOLICY_HAVE_NCCL
    if (nccl) skip = "built without NCCL";
#endif
    if (skip.empty() && nccl && devices < mpi.size()) skip = "NCCL takes one GPU per rank: " + std::to_string(devices) +
                                                             " GPU(s) for " + std::to_string(mpi.size()) + " ranks";
    if (!skip.empty()) {
      if (mpi.rank() == 0) std::printf("dist_sharded_cache_cuda: SKIPPED (%s)\n", skip.c_str());
      MPI_Finalize();
      return 77;
    }
    if (cudaSetDevice(mpi.rank() % devices) != cudaSuccess) fail("rank ", mpi.rank(), ": cudaSetDevice failed");
    Tally tally;
    std::int64_t bad = 0;
    const char* over = "MPI";
    if (!nccl) {
      bad = run_traces(mpi, traces, tally);
    } else {
#ifdef KVPOLICY_HAVE_NCCL
      ncclUniqueId id;
      if (mpi.rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess) fail("ncclGetUniqueId failed");
      MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
      ncclComm_t comm = nullptr;
      if (ncclCommInitRank(&comm, mpi.size(), id, mpi.rank()) != ncclSuccess) fail("rank ", mpi.rank(), ": ncclCommInitRank failed");
      {
        dist::Nccl group(comm);
        bad = run_traces(group, traces, tally);
      }
      ncclCommDestroy(comm);
      over = "NCCL";
#endif
    }
    if (mpi.rank() == 0)
      std::printf("sharded device Cache on %d ranks over %s: %ld traces of 60 steps (%lld DBTrimKV pooled, %lld "
                  "TRIM-KV per head; %lld entries evicted, %lld steps refused by every rank), %lld differences "
                  "from the unsharded CPU Cache\n",
                  mpi.size(), over, traces, static_cast<long long>(tally.pooled), static_cast<long long>(tally.per_head),
                  static_cast<long long>(tally.evictions), static_cast<long long>(tally.refusals),
                  static_cast<long long>(bad));
    status = bad == 0 && tally.evictions > 0 && tally.refusals > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 2;
  }
  MPI_Finalize();
  return status;
}
