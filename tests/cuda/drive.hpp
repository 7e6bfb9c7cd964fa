// drive(): one random stream of steps through a CPU Cache and its device twin, checked after every
// step (the same entries in every head bit for bit, the same trigger, evicted list and free pages,
// attention within a tolerance). Shared by the device Cache's tests.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/cache/step_state.hpp"
#include "test_scale.hpp"

namespace cudatest {

namespace kp = kvpolicy;

template <class C>
std::vector<kp::EntryMeta> heads_of(const C& c, std::int64_t seq, int l, int h) {
  std::vector<kp::EntryMeta> out;
  for (std::int64_t i = 0; i < c.length(seq, l, h); ++i) out.push_back(c.entry(seq, l, h, i));
  std::sort(out.begin(), out.end(), [](const kp::EntryMeta& a, const kp::EntryMeta& b) { return a.position < b.position; });
  return out;
}

inline std::vector<kp::EvictedEntry> sorted(std::vector<kp::EvictedEntry> v) {
  std::sort(v.begin(), v.end(), [](const kp::EvictedEntry& a, const kp::EvictedEntry& b) {
    return std::tie(a.layer, a.head, a.position) < std::tie(b.layer, b.head, b.position);
  });
  return v;
}

/// A log_beta drawn to tie often (TRIM-KV, DBTrimKV).
inline float tie_prone_log_beta(std::mt19937_64& rng) {
  static const float ties[] = {0.0f, -0.25f, -0.5f, -1.0f, -std::numeric_limits<float>::infinity()};
  return std::uniform_int_distribution<int>(0, 2)(rng) == 0 ? ties[std::uniform_int_distribution<int>(0, 4)(rng)]
                                                            : -std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
}

/// How drive() steps: whether a prefill attends too (a policy that ranks by the attention it
/// observes: every step attends), and whether each sequence declares its prompt (the prefill) when
/// it is added (a policy that compresses the declared prompt).
struct DriveOptions {
  bool attend_prefill = false;
  bool declare_prompt = false;
  /// Steps of the stream; 0: 120 on a GPU, 60 under a simulator, long enough to outgrow the
  /// device's 4 sequence slots and finish a request (checked then).
  int steps = 0;
};

/// Returns the entries the steps evicted, so that a test can see its streams reach an eviction.
template <class Cpu, class Gpu, class Meta = float (*)(std::mt19937_64&)>
std::int64_t drive(Cpu& cpu, Gpu& gpu, const kp::CacheShape& s, std::uint64_t seed, double tolerance,
                   Meta meta = tie_prone_log_beta, DriveOptions options = {}) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const auto log_beta = [&] { return meta(rng); };
  std::vector<std::int64_t> live;
  std::vector<std::int64_t> declared;  // the prompt each sequence declared (options.declare_prompt)
  std::int64_t next_id = 0, evicted = 0;
  std::size_t peak_live = 0;
  int finished = 0;
  // 120 steps on a GPU; 60 under a simulator (test_scale.hpp), whose streams are the first half of
  // the GPU's and are checked below to still outgrow the device's slots and finish a request
  const int steps = options.steps > 0 ? options.steps : cudatest::steps(120, 60);
  for (int step = 0; step < steps; ++step) {
    // up to 6 live sequences: more than the 4 slots the device cache starts with
    if ((live.size() < 6 && std::uniform_int_distribution<int>(0, 5)(rng) == 0) || live.empty()) {
      const std::int64_t prompt =
          options.declare_prompt ? std::uniform_int_distribution<std::int64_t>(1, 40)(rng) : std::int64_t{-1};
      declared.push_back(prompt);
      cpu.add_sequence(next_id, prompt);
      gpu.add_sequence(next_id, prompt);
      live.push_back(next_id++);
      peak_live = std::max(peak_live, live.size());
    }
    const std::int64_t seq = live[std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng)];
    const bool prefill = cpu.tokens(seq) == 0;
    const std::int64_t T = !prefill ? 1
                           : options.declare_prompt ? declared[static_cast<std::size_t>(seq)]
                                                    : std::uniform_int_distribution<std::int64_t>(1, 40)(rng);
    std::vector<float> k(std::size_t(s.layers) * s.kv_heads * T * s.head_dim), v(k.size()), lb;
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (std::int64_t i = 0; i < s.layers * s.kv_heads * T; ++i) lb.push_back(log_beta());
    std::vector<float> q(std::size_t(s.layers) * s.q_heads * T * s.head_dim), out_cpu(q.size()), out_gpu(q.size());
    for (auto& x : q) x = normal(rng);
    const kp::View<const float, 4> K(k.data(), {s.layers, s.kv_heads, T, s.head_dim}), V(v.data(), {s.layers, s.kv_heads, T, s.head_dim});
    const kp::View<const float, 3> LB(lb.data(), {s.layers, s.kv_heads, T});
    std::vector<kp::EvictedEntry> gone_cpu, gone_gpu;
    kp::EvictionReport rc, rg;
    if (T == 1 || options.attend_prefill) {
      const kp::View<const float, 4> Q(q.data(), {s.layers, s.q_heads, T, s.head_dim});
      rc = cpu.step(seq, K, V, LB, Q, kp::View<float, 4>(out_cpu.data(), {s.layers, s.q_heads, T, s.head_dim}), &gone_cpu);
      rg = gpu.step(seq, K, V, LB, Q, kp::View<float, 4>(out_gpu.data(), {s.layers, s.q_heads, T, s.head_dim}), &gone_gpu);
      double num = 0.0, den = 0.0;
      for (std::size_t i = 0; i < out_cpu.size(); ++i) {
        num += (double(out_gpu[i]) - out_cpu[i]) * (double(out_gpu[i]) - out_cpu[i]);
        den += double(out_cpu[i]) * out_cpu[i];
      }
      INFO("seed ", seed, " step ", step);
      CHECK(std::sqrt(num / std::max(den, 1e-30)) <= tolerance);
    } else {
      rc = cpu.step(seq, K, V, LB, {}, {}, &gone_cpu);
      rg = gpu.step(seq, K, V, LB, {}, {}, &gone_gpu);
    }
    REQUIRE_MESSAGE(rc.triggered == rg.triggered, "seed ", seed, " step ", step);
    REQUIRE(rc.evicted == rg.evicted);
    evicted += rc.evicted;
    const auto a = sorted(gone_cpu), b = sorted(gone_gpu);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      REQUIRE((a[i].layer == b[i].layer && a[i].head == b[i].head && a[i].position == b[i].position));
    for (const std::int64_t id : live)
      for (int l = 0; l < s.layers; ++l)
        for (int h = 0; h < s.kv_heads; ++h) {
          const auto x = heads_of(cpu, id, l, h), y = heads_of(gpu, id, l, h);
          REQUIRE_MESSAGE(x.size() == y.size(), "seed ", seed, " step ", step, " sequence ", id, " layer ", l, " head ", h);
          for (std::size_t i = 0; i < x.size(); ++i) {
            REQUIRE(x[i].position == y[i].position);
            REQUIRE(std::memcmp(&x[i].write_score, &y[i].write_score, sizeof(float)) == 0);
            REQUIRE(std::memcmp(&x[i].key_norm, &y[i].key_norm, sizeof(float)) == 0);  // 0 unless the scorer reads it
          }
        }
    REQUIRE(cpu.allocator().pages_free() == gpu.pages_free());
    // a request finishes (one at the last step if none did: every stream frees a sequence's pages)
    const bool finishes = std::uniform_int_distribution<int>(0, 29)(rng) == 0 || (step == steps - 1 && finished == 0);
    if (finishes && live.size() > 1) {
      const auto it = live.begin() + std::uniform_int_distribution<std::ptrdiff_t>(0, live.size() - 1)(rng);
      cpu.remove_sequence(*it);
      gpu.remove_sequence(*it);
      live.erase(it);
      ++finished;
      REQUIRE(cpu.allocator().pages_free() == gpu.pages_free());
    }
  }
  if (cudatest::test_scale() > 1 && options.steps == 0) {
    INFO("seed ", seed, ": ", steps, " steps, at most ", peak_live, " live sequences, ", finished, " finished");
    CHECK(peak_live > 4);  // more sequences than the 4 slots the device cache starts with
    CHECK(finished > 0);
  }
  return evicted;
}

}  // namespace cudatest
