// The concurrency contract (docs/concurrency.md), driven: 4 threads step 8 sequences of one cache at
// once — one sequence from one thread at a time, the layer API on some and whole steps on the
// others, prefill chunks, decode steps, evictions that free pages while other threads take them —
// then the same script runs on one thread in a fresh cache. Every attention output and every
// survivor must be bit-identical: sequences share only the pool, and the pool's free list is
// locked. Run under ThreadSanitizer by the `tsan` preset (tools/test.sh), where a data race is a
// failure even when the answers come out right. Exit 0 when all agree.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <kvpolicy/trimkv.hpp>

namespace {

using namespace kvpolicy;

constexpr int kLayers = 2, kKvHeads = 2, kGroup = 2, kHeadDim = 16, kSequences = 8, kThreads = 4;
constexpr std::int64_t kBudget = 48, kBuffer = 8, kPrompt = 40, kDecodeSteps = 160;
const CacheShape kShape{kLayers, kKvHeads, kKvHeads * kGroup, kHeadDim};
using TestCache = TrimKVCache<>;

struct Trace {  // what one sequence saw: every attention output, then its survivors' positions
  std::vector<float> outputs;
  std::vector<std::int32_t> survivors;
};

// One sequence's whole script. Inputs depend only on (seq, step), so any schedule gives the same.
void run_sequence(TestCache& cache, std::int64_t seq, Trace& trace) {
  std::mt19937 rng(static_cast<std::uint32_t>(1000 + seq));
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> beta(-0.2f, 0.0f);
  const bool whole_steps = seq % 2 == 1;  // odd sequences: step(); even: append/attend/commit
  for (std::int64_t s = 0; s <= kDecodeSteps; ++s) {
    const std::int64_t T = s == 0 ? kPrompt : 1;
    std::vector<float> k(static_cast<std::size_t>(kLayers * kKvHeads * T * kHeadDim)), v(k.size()),
        lb(static_cast<std::size_t>(kLayers * kKvHeads * T)), q(static_cast<std::size_t>(kLayers * kShape.q_heads * T * kHeadDim)),
        out(q.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (auto& x : lb) x = beta(rng);
    for (auto& x : q) x = normal(rng);
    if (whole_steps) {
      cache.step(seq, View<const float, 4>(k.data(), {kLayers, kKvHeads, T, kHeadDim}),
                 View<const float, 4>(v.data(), {kLayers, kKvHeads, T, kHeadDim}),
                 View<const float, 3>(lb.data(), {kLayers, kKvHeads, T}),
                 View<const float, 4>(q.data(), {kLayers, kShape.q_heads, T, kHeadDim}),
                 View<float, 4>(out.data(), {kLayers, kShape.q_heads, T, kHeadDim}));
    } else {
      const std::int64_t kv = kKvHeads * T * kHeadDim, qs = kShape.q_heads * T * kHeadDim;
      for (int l = 0; l < kLayers; ++l) {
        cache.append(seq, l, View<const float, 3>(k.data() + l * kv, {kKvHeads, T, kHeadDim}),
                     View<const float, 3>(v.data() + l * kv, {kKvHeads, T, kHeadDim}),
                     View<const float, 2>(lb.data() + l * kKvHeads * T, {kKvHeads, T}));
        cache.attend(seq, l, View<const float, 3>(q.data() + l * qs, {kShape.q_heads, T, kHeadDim}),
                     View<float, 3>(out.data() + l * qs, {kShape.q_heads, T, kHeadDim}));
      }
      cache.commit(seq);
    }
    trace.outputs.insert(trace.outputs.end(), out.begin(), out.end());
  }
  for (int l = 0; l < kLayers; ++l)
    for (int h = 0; h < kKvHeads; ++h)
      for (std::int64_t i = 0; i < cache.length(seq, l, h); ++i) trace.survivors.push_back(cache.entry(seq, l, h, i).position);
}

TestCache make_cache() {
  // Room for every sequence at its peak (M + B + one prompt chunk's overshoot) and no more than
  // needed: threads take and return pages all the time.
  const std::int64_t pages = memory::Paged<16>::pages_for(kShape, kPrompt + kBudget + kBuffer, kSequences);
  return TestCache(kShape, memory::Paged<16>(pages), trimkv_evictor({.budget = kBudget, .buffer = kBuffer}));
}

}  // namespace

int main() {
  std::array<Trace, kSequences> parallel, serial;
  std::int64_t free_after_parallel = 0, free_after_serial = 0;
  {
    TestCache cache = make_cache();
    for (int s = 0; s < kSequences; ++s) cache.add_sequence(s);  // registry changes: before the threads
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&cache, &parallel, t] {
        // interleaved: each thread alternates between its two sequences, a step at a time
        for (int s = t; s < kSequences; s += kThreads) run_sequence(cache, s, parallel[static_cast<std::size_t>(s)]);
      });
    for (auto& th : threads) th.join();
    free_after_parallel = cache.allocator().pages_free();
  }
  {
    TestCache cache = make_cache();
    for (int s = 0; s < kSequences; ++s) cache.add_sequence(s);
    for (int s = 0; s < kSequences; ++s) run_sequence(cache, s, serial[static_cast<std::size_t>(s)]);
    free_after_serial = cache.allocator().pages_free();
  }
  int failures = 0;
  for (int s = 0; s < kSequences; ++s) {
    const auto& a = parallel[static_cast<std::size_t>(s)];
    const auto& b = serial[static_cast<std::size_t>(s)];
    const bool same_out = a.outputs.size() == b.outputs.size() &&
                          std::memcmp(a.outputs.data(), b.outputs.data(), a.outputs.size() * sizeof(float)) == 0;
    if (!same_out || a.survivors != b.survivors) {
      std::printf("sequence %d: %s differ between 4 threads and 1\n", s, same_out ? "survivors" : "attention outputs");
      ++failures;
    }
  }
  if (free_after_parallel != free_after_serial) {
    std::printf("pages free: %lld after the threads, %lld after one thread\n", static_cast<long long>(free_after_parallel),
                static_cast<long long>(free_after_serial));
    ++failures;
  }
  std::printf("concurrency: %d sequences on %d threads, %lld steps each: %s\n", kSequences, kThreads,
              static_cast<long long>(kDecodeSteps + 1), failures ? "MISMATCH" : "bit-identical to one thread");
  return failures ? 1 : 0;
}
