// One random trace through the unsharded Cache and through this rank's sharded Cache (dist::Sharded,
// dist::ShardedWriteGatedBudget, by kv head), checked after every step: this rank's heads hold
// exactly the entries the unsharded cache holds there, its query heads' attention outputs match
// (bit for bit, or within a relative tolerance where the two run on different backends), the
// evictions over the ranks add up, and a step one rank refuses is refused by every rank with the
// same error and changes nothing. Every rank draws the same trace from the seed. The MPI test of
// the CPU Cache (sharded_cache_mpi.cpp) and of the device Cache (sharded_cache_cuda.cu) run it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/dist/agree.hpp"
#include "kvpolicy/dist/communicator.hpp"

namespace disttest {

using namespace kvpolicy;

/// A trace's caches, drawn from its seed: the unsharded shape (L 1–3, Hkv one or two per rank, GQA
/// 1–2, head width d), DBTrimKV's settings (budget, buffer, horizon, floor, window, sinks, now and
/// then the threshold variant and its floor min_tokens), which of three policies the trace runs
/// (`kind`, 0–2, the test's to name), and the unsharded pool's pages.
struct TraceCaches {
  std::mt19937_64 rng;  // what the test draws next (its policy's own settings)
  CacheShape shape;
  DBTrimKVConfig c;
  int kind = 0;
  std::int64_t pages = 0;

  TraceCaches(std::uint64_t seed, int ranks, int head_dim) : rng(seed * 7919) {
    const int G = pick(1, 2);
    const CacheShape s{pick(1, 3), ranks * pick(1, 2), 0, head_dim};
    shape = CacheShape{s.layers, s.kv_heads, s.kv_heads * G, head_dim};
    c.budget = pick(2, 8);
    c.buffer = pick(1, 4);
    c.horizon = pick(1, 3);
    c.floor_ratio = pick(0, 2) == 0 ? 0.25 : 0.0;
    c.window = pick(0, 3) == 0 ? 1 : 0;
    c.sinks = pick(0, 3) == 0 ? 1 : 0;
    kind = pick(0, 2);
    pages = 4 * shape.heads_total() * 16;
    // the threshold budget (SPEC §1, §2): every step, with a floor per head; exclusive with f > 0
    c.threshold = c.floor_ratio == 0.0 && pick(0, 3) == 0 ? 0.5 : 0.0;
    c.min_tokens = c.threshold > 0.0 && pick(0, 1) == 0 ? pick(1, 3) : 0;
  }
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
};

/// What the traces of one process met: they must evict, and must refuse some steps.
struct TraceTally {
  std::int64_t evictions = 0;  // entries the unsharded caches evicted
  std::int64_t refusals = 0;   // steps every rank refused together
};

/// One trace of 60 steps through `whole` (the unsharded Cache) and `mine` (this rank's share);
/// returns the differences found. write_gate: the scores are WG-KV's g in [0, 1] (some exactly
/// tau), else DBTrimKV's log beta; WG-KV's sharded trigger fires at every commit, so then the
/// triggers are not compared. tolerance: 0 compares the attention outputs bit for bit, else the
/// relative L2 distance of each step's outputs (a device Cache against the CPU's).
template <dist::Communicator C, class Whole, class Mine>
std::int64_t run_trace(C& comm, std::uint64_t seed, Whole& whole, Mine& mine, bool write_gate, TraceTally& tally,
                       double tolerance = 0.0) {
  const CacheShape full = whole.shape(), local = mine.shape();
  const bool triggers = !write_gate;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const int per = local.kv_heads, G = full.group(), r = comm.rank();
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
      const int refusing = std::uniform_int_distribution<int>(0, comm.size() - 1)(rng);
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
        dist::step(comm, mine, mine_step(k_bad), static_cast<std::vector<EvictedEntry>*>(nullptr));
      } catch (const Error& e) {
        message = e.what();
      }
      bad += message.rfind("kvpolicy: rank " + std::to_string(refusing) + " refused: Cache::", 0) != 0;
      bad += state() != before;
      const auto h = static_cast<std::int64_t>(std::hash<std::string>{}(message) & 0xfffff);
      std::vector<std::int64_t> same{h, h * h};  // every rank's message the same: zero variance
      comm.all_reduce_sum(same);
      bad += same[1] * comm.size() != same[0] * same[0];
      tally.refusals += 1;
    }
    const EvictionReport rm = dist::step(comm, mine, mine_step(k_mine), static_cast<std::vector<EvictedEntry>*>(nullptr));
    std::array<std::int64_t, 1> evicted{rm.evicted};
    comm.all_reduce_sum(evicted);
    bad += evicted[0] != rw.evicted;
    tally.evictions += rw.evicted;
    if (triggers) bad += rm.triggered != rw.triggered;
    double num = 0.0, den = 0.0;
    for (std::size_t l = 0; l < L; ++l)
      for (std::size_t i = 0; i < qper * t * d; ++i) {
        const double a = out_mine[l * qper * t * d + i], b = out[((l * Hq) + static_cast<std::size_t>(r) * qper) * t * d + i];
        if (tolerance == 0.0) bad += a != b;
        num += (a - b) * (a - b);
        den += b * b;
      }
    if (tolerance > 0.0) bad += !(std::sqrt(num / std::max(den, 1e-30)) <= tolerance);
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

}  // namespace disttest
