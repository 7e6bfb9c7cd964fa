// A DBTrimKV Cache sharded over MPI ranks by kv head (dist::Sharded) against the unsharded Cache:
//   mpirun -np R kvpolicy_dist_sharded_cache_mpi [TRACES]
// Every rank draws the same random traces (sequences added and removed, prefills and decode steps,
// log beta with ties), runs them through the unsharded DBTrimKVCache (global or layer-wise, floor,
// window, sinks) and through its own Cache of the kv heads [r Hkv / R, (r + 1) Hkv / R), and checks
// after every step that its heads hold exactly the entries the unsharded cache holds there, that its
// query heads' attention outputs are bit-identical, and that the evictions over the ranks add up.
// Some steps first go in with a NaN in one rank's share: every rank must refuse that step with the
// same error (dist::step) and change nothing, before the step goes in whole. Exit status 1 on any
// difference.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <cstdlib>
#include <random>
#include <vector>

#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/wgkv.hpp"
#include "kvpolicy/dist/agree.hpp"
#include "kvpolicy/dist/mpi.hpp"
#include "kvpolicy/dist/sharded.hpp"

namespace {

using namespace kvpolicy;

std::int64_t evictions = 0;  // entries the unsharded caches evicted: the traces do evict
std::int64_t refusals = 0;   // steps every rank refused together
std::int64_t wgkv_traces = 0;

/// One trace through `whole` (the unsharded Cache) and `mine` (this rank's share). write_gate: the
/// scores are WG-KV's g in [0, 1] (some exactly tau), else DBTrimKV's log beta; `triggers`: whether
/// the two report the same triggers (WG-KV's sharded trigger fires at every commit).
template <class Whole, class Mine>
std::int64_t run_trace(dist::Mpi& mpi, std::uint64_t seed, Whole& whole, Mine& mine, bool write_gate) {
  const CacheShape full = whole.shape(), local = mine.shape();
  const bool triggers = !write_gate;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const int per = local.kv_heads, G = full.group(), r = mpi.rank();
  std::vector<std::int64_t> live;
  std::int64_t next = 0, bad = 0;
  for (int step = 0; step < 60; ++step) {
    if (live.empty() || (live.size() < 3 && std::uniform_int_distribution<int>(0, 7)(rng) == 0)) {
      whole.add_sequence(next);
      mine.add_sequence(next);
      live.push_back(next++);
    }
    const std::int64_t seq = live[std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng)];
    const std::int64_t T = whole.tokens(seq) == 0 ? std::uniform_int_distribution<std::int64_t>(1, 20)(rng) : 1;
    const auto L = static_cast<std::size_t>(full.layers), Hkv = static_cast<std::size_t>(full.kv_heads),
               Hq = static_cast<std::size_t>(full.q_heads), d = static_cast<std::size_t>(full.head_dim),
               t = static_cast<std::size_t>(T);
    std::vector<float> k(L * Hkv * t * d), v(k.size()), q(L * Hq * t * d), lb(L * Hkv * t), out(q.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (auto& x : q) x = normal(rng);
    // log beta (or g) from a few values (ties across heads and positions), sometimes a continuum
    const std::array<float, 5> few = write_gate ? std::array<float, 5>{0.0f, 0.05f, 0.1f, 0.5f, 1.0f}
                                                : std::array<float, 5>{0.0f, -0.01f, -0.1f, -0.5f, -2.0f};
    for (auto& x : lb) {
      const float u = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
      x = std::uniform_int_distribution<int>(0, 3)(rng) ? few[std::uniform_int_distribution<std::size_t>(0, 4)(rng)]
                                                        : (write_gate ? u : -u);
    }
    // this rank's slices: kv heads [r per, (r+1) per), query heads [r per G, (r+1) per G)
    const auto lper = static_cast<std::size_t>(per), qper = static_cast<std::size_t>(per * G);
    std::vector<float> k_mine(L * lper * t * d), v_mine(k_mine.size()), q_mine(L * qper * t * d), lb_mine(L * lper * t),
        out_mine(q_mine.size());
    for (std::size_t l = 0; l < L; ++l) {
      const std::size_t h0 = static_cast<std::size_t>(r) * lper, q0 = static_cast<std::size_t>(r) * qper;
      std::copy_n(&k[((l * Hkv) + h0) * t * d], lper * t * d, &k_mine[l * lper * t * d]);
      std::copy_n(&v[((l * Hkv) + h0) * t * d], lper * t * d, &v_mine[l * lper * t * d]);
      std::copy_n(&lb[(l * Hkv + h0) * t], lper * t, &lb_mine[l * lper * t]);
      std::copy_n(&q[((l * Hq) + q0) * t * d], qper * t * d, &q_mine[l * qper * t * d]);
    }
    const auto v4 = [](const std::vector<float>& x, std::size_t a, std::size_t b, std::size_t c2, std::size_t e2) {
      return View<const float, 4>(x.data(), {static_cast<std::int64_t>(a), static_cast<std::int64_t>(b),
                                             static_cast<std::int64_t>(c2), static_cast<std::int64_t>(e2)});
    };
    const EvictionReport rw = whole.step(seq, v4(k, L, Hkv, t, d), v4(v, L, Hkv, t, d),
                                         View<const float, 3>(lb.data(), {full.layers, full.kv_heads, T}),
                                         v4(q, L, Hq, t, d), View<float, 4>(out.data(), {full.layers, full.q_heads, T, full.head_dim}));
    const auto mine_step = [&](const std::vector<float>& keys) {
      return SequenceStep{seq, v4(keys, L, lper, t, d), v4(v_mine, L, lper, t, d),
                          View<const float, 3>(lb_mine.data(), {local.layers, local.kv_heads, T}), v4(q_mine, L, qper, t, d),
                          View<float, 4>(out_mine.data(), {local.layers, local.q_heads, T, local.head_dim})};
    };
    if (std::uniform_int_distribution<int>(0, 5)(rng) == 0) {  // one rank's share holds a NaN: all refuse
      const int refusing = std::uniform_int_distribution<int>(0, mpi.size() - 1)(rng);
      std::vector<float> k_bad = k_mine;
      if (r == refusing) k_bad[k_bad.size() / 2] = std::numeric_limits<float>::quiet_NaN();
      const auto state = [&] {
        std::vector<std::int64_t> x{mine.pages_free()};
        for (const std::int64_t s : live) x.insert(x.end(), {mine.tokens(s), mine.total_length(s)});
        return x;
      };
      const auto before = state();
      std::string message;
      try {
        dist::step(mpi, mine, mine_step(k_bad), static_cast<std::vector<EvictedEntry>*>(nullptr));
      } catch (const Error& e) {
        message = e.what();
      }
      bad += message.rfind("kvpolicy: rank " + std::to_string(refusing) + " refused: Cache::", 0) != 0;
      bad += state() != before;
      const auto h = static_cast<std::int64_t>(std::hash<std::string>{}(message) & 0xfffff);
      std::vector<std::int64_t> same{h, h * h};  // every rank's message the same: zero variance
      mpi.all_reduce_sum(same);
      bad += same[1] * mpi.size() != same[0] * same[0];
      refusals += 1;
    }
    const EvictionReport rm = dist::step(mpi, mine, mine_step(k_mine), static_cast<std::vector<EvictedEntry>*>(nullptr));
    std::array<std::int64_t, 1> evicted{rm.evicted};
    mpi.all_reduce_sum(evicted);
    bad += evicted[0] != rw.evicted;
    evictions += rw.evicted;
    if (triggers) bad += rm.triggered != rw.triggered;
    for (std::size_t l = 0; l < L; ++l)
      for (std::size_t i = 0; i < qper * t * d; ++i)
        bad += out_mine[l * qper * t * d + i] != out[((l * Hq) + static_cast<std::size_t>(r) * qper) * t * d + i];
    for (const std::int64_t s : live)
      for (int l = 0; l < full.layers; ++l)
        for (int h = 0; h < per; ++h) {
          std::vector<std::int32_t> a, b;
          for (std::int64_t i = 0; i < whole.length(s, l, r * per + h); ++i) a.push_back(whole.entry(s, l, r * per + h, i).position);
          for (std::int64_t i = 0; i < mine.length(s, l, h); ++i) b.push_back(mine.entry(s, l, h, i).position);
          std::sort(a.begin(), a.end());
          std::sort(b.begin(), b.end());
          bad += a != b;
        }
    if (live.size() > 1 && std::uniform_int_distribution<int>(0, 19)(rng) == 0) {
      const auto it = live.begin() + std::uniform_int_distribution<std::ptrdiff_t>(0, static_cast<std::ptrdiff_t>(live.size()) - 1)(rng);
      whole.remove_sequence(*it);
      mine.remove_sequence(*it);
      live.erase(it);
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    dist::Mpi mpi(MPI_COMM_WORLD);
    const long traces = argc > 1 ? std::atol(argv[1]) : 40;
    std::vector<std::int64_t> bad{0, 0};
    for (long seed = 1; seed <= traces; ++seed) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7919);
      const auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
      const int G = pick(1, 2);
      const CacheShape full{pick(1, 3), mpi.size() * pick(1, 2), 0, 8};
      const CacheShape shape{full.layers, full.kv_heads, full.kv_heads * G, full.head_dim};
      DBTrimKVConfig c;
      c.budget = pick(2, 8);
      c.buffer = pick(1, 4);
      c.horizon = pick(1, 3);
      c.floor_ratio = pick(0, 2) == 0 ? 0.25 : 0.0;
      c.window = pick(0, 3) == 0 ? 1 : 0;
      c.sinks = pick(0, 3) == 0 ? 1 : 0;
      const int kind = pick(0, 2);  // DBTrimKV global, layer-wise, WG-KV's hard budget
      const std::int64_t pages_full = 4 * shape.heads_total() * 16, pages_local = pages_full / mpi.size();
      std::vector<std::int64_t> b{0};
      if (kind < 2) {
        const auto run = [&](const auto& inner) {
          using Inner = std::decay_t<decltype(inner)>;
          const dist::Sharded<Inner, dist::Mpi> e{inner, &mpi, shape};
          Cache<score::Lookahead, admit::All, Inner, memory::Paged<16>, cpu_backend> whole(
              shape, memory::Paged<16>(pages_full), inner, dbtrimkv_scorer(c));
          Cache<score::Lookahead, admit::All, std::decay_t<decltype(e)>, memory::Paged<16>, cpu_backend> mine(
              e.local_shape(), memory::Paged<16>(pages_local), e, dbtrimkv_scorer(c));
          return run_trace(mpi, static_cast<std::uint64_t>(seed), whole, mine, false);
        };
        b[0] = kind == 0 ? run(dbtrimkv_evictor(c)) : run(dbtrimkv_layerwise_evictor(c));
      } else {
        WGKVBudgetConfig w;
        w.local = pick(2, 6);
        w.average_budget = pick(1, 3);
        w.observation_window = pick(2, 8);
        w.pool_kernel = std::array{1, 3, 5}[static_cast<std::size_t>(pick(0, 2))];
        w.fraction = std::array{0.1, 0.25, 0.5}[static_cast<std::size_t>(pick(0, 2))];
        w.sinks = pick(0, 2) == 0 ? 1 : 0;
        const dist::ShardedWriteGatedBudget<dist::Mpi> e{wgkv_budget_evictor(shape, w), &mpi, shape};
        WGKVBudgetCache<> whole(shape, memory::Paged<16>(pages_full), wgkv_budget_evictor(shape, w),
                                wgkv_budget_scorer(shape, w));
        Cache<score::GatedObservedAttention, admit::All, dist::ShardedWriteGatedBudget<dist::Mpi>, memory::Paged<16>,
              cpu_backend> mine(e.local_shape(), memory::Paged<16>(pages_local), e, wgkv_budget_scorer(shape, w));
        b[0] = run_trace(mpi, static_cast<std::uint64_t>(seed), whole, mine, true);
        wgkv_traces += 1;
      }
      mpi.all_reduce_sum(b);
      bad[0] += b[0];
      bad[1] += b[0] > 0;
    }
    if (mpi.rank() == 0)
      std::printf("sharded Cache on %d ranks: %ld traces of 60 steps (%lld of WG-KV's hard budget, the rest "
                  "DBTrimKV; %lld entries evicted, %lld steps refused by every rank), %lld differences from the "
                  "unsharded Cache (in %lld traces)\n", mpi.size(), traces, static_cast<long long>(wgkv_traces),
                  static_cast<long long>(evictions), static_cast<long long>(refusals), static_cast<long long>(bad[0]),
                  static_cast<long long>(bad[1]));
    status = bad[0] == 0 && evictions > 0 && refusals > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 2;
  }
  MPI_Finalize();
  return status;
}
