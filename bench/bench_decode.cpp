// One CPU decode step — attention plus amortized eviction — under a TRIM-KV budget
// (M = 1024, B = 128) versus a full cache, at contexts 4096, 16384, 65536; one layer, Hkv = 8,
// G = 4, d = 128. Manual timing per step; counters split the step into append, attend and
// evict (trigger + score + select + compact), so evict_fraction reads directly off one run.
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <kvpolicy/trimkv.hpp>

namespace {

using namespace kvpolicy;
using Clock = std::chrono::steady_clock;

constexpr int kLayers = 1, kKvHeads = 8, kGroup = 4, kHeadDim = 128;
constexpr std::int64_t kBudget = 1024, kBuffer = 128;
const CacheShape kShape{kLayers, kKvHeads, kKvHeads * kGroup, kHeadDim};

struct Tokens {  // random K/V/log_beta/queries for T tokens, reused step after step
  std::int64_t T;
  std::vector<float> k, v, lb, q, out;
  Tokens(std::int64_t t, std::mt19937& rng) : T(t) {
    std::normal_distribution<float> normal;
    k.resize(static_cast<std::size_t>(kKvHeads * T * kHeadDim));
    v.resize(k.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    lb.resize(static_cast<std::size_t>(kKvHeads * T));
    for (auto& x : lb) x = -0.001f * std::abs(normal(rng));
    q.resize(static_cast<std::size_t>(kShape.q_heads * T * kHeadDim));
    for (auto& x : q) x = normal(rng);
    out.resize(q.size());
  }
};

void decode_step(benchmark::State& state, bool budgeted) {
  const std::int64_t context = state.range(0);
  const std::int64_t steps = static_cast<std::int64_t>(state.max_iterations);
  const std::int64_t budget = budgeted ? kBudget : context + steps + 1;  // full: the trigger never fires
  const std::int64_t capacity = budgeted ? kBudget + kBuffer + 1024 : context + steps + 16;
  TrimKVCache<> cache(kShape, memory::Paged<16>(pages_for(kShape, capacity, 1, 16)),
                      trimkv_evictor({.budget = budget, .buffer = kBuffer}));
  cache.add_sequence(0);
  std::mt19937 rng(1);
  // chunked prefill to `context` tokens (no attention: only the cache state matters here)
  const std::int64_t chunk = 1024;
  Tokens pre(chunk, rng);
  for (std::int64_t n = 0; n < context; n += chunk)
    cache.step(0, View<const float, 4>(pre.k.data(), {1, kKvHeads, chunk, kHeadDim}),
               View<const float, 4>(pre.v.data(), {1, kKvHeads, chunk, kHeadDim}),
               View<const float, 3>(pre.lb.data(), {1, kKvHeads, chunk}));
  Tokens tok(1, rng);
  double append_s = 0, attend_s = 0, evict_s = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    cache.append(0, 0, View<const float, 3>(tok.k.data(), {kKvHeads, 1, kHeadDim}),
                 View<const float, 3>(tok.v.data(), {kKvHeads, 1, kHeadDim}), View<const float, 2>(tok.lb.data(), {kKvHeads, 1}));
    const auto t1 = Clock::now();
    cache.attend(0, 0, View<const float, 3>(tok.q.data(), {kShape.q_heads, 1, kHeadDim}),
                 View<float, 3>(tok.out.data(), {kShape.q_heads, 1, kHeadDim}));
    const auto t2 = Clock::now();
    cache.commit(0);
    const auto t3 = Clock::now();
    benchmark::DoNotOptimize(tok.out.data());
    append_s += std::chrono::duration<double>(t1 - t0).count();
    attend_s += std::chrono::duration<double>(t2 - t1).count();
    evict_s += std::chrono::duration<double>(t3 - t2).count();
    state.SetIterationTime(std::chrono::duration<double>(t3 - t0).count());
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["entries_per_head"] = static_cast<double>(cache.length(0, 0, 0));
  state.counters["append_us"] = 1e6 * append_s / n;
  state.counters["attend_us"] = 1e6 * attend_s / n;
  state.counters["evict_us"] = 1e6 * evict_s / n;
  state.counters["evict_fraction"] = evict_s / (append_s + attend_s + evict_s);
}

}  // namespace

int main(int argc, char** argv) {
  for (std::int64_t context : {4096, 16384, 65536}) {
    // Budgeted: 1024 steps = 8 eviction rounds at B = 128, so the amortized eviction is measured.
    benchmark::RegisterBenchmark(("decode_step/budget/context:" + std::to_string(context)).c_str(),
                                 [](benchmark::State& s) { decode_step(s, true); })
        ->Arg(context)->Iterations(1024)->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("decode_step/full/context:" + std::to_string(context)).c_str(),
                                 [](benchmark::State& s) { decode_step(s, false); })
        ->Arg(context)->Iterations(context >= 65536 ? 16 : 64)->UseManualTime()->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const auto ran = benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return ran > 0 ? 0 : 1;  // a filter that matches nothing is a failure, not a pass
}
