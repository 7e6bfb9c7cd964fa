// CPU attention against the hardware it runs on, in one run (issue: CPU attention at memory
// bandwidth). Measured here, in the same binary and run:
//   hw/read_bw/threads:t     bytes/s of a vectorized sum over 512 MiB (Eigen; 8 independent vector
//                            accumulators, so the sum is never the limit), t OpenMP threads
//   hw/copy_bw/threads:t     bytes/s copied by memcpy of 256 MiB (each byte read once, written once)
//   hw/gemm/rows:R/keys:N    Eigen's GEMM on the prefill's shapes: S = Q·Kᵀ, O = S·V for one kv head
// and the library's attention through a Cache (1 layer, Hkv = 8, G = 4, d = 128, Paged<16>):
//   decode_attention/<dtype>/context:N/threads:t   one query token per query head over N entries;
//       counter fraction_of_read_bw = K/V bytes read per second / hw/read_bw at the same t (at
//       N = 128 the K/V stay in L2: that row's rate is the arithmetic's, not the memory's)
//   prefill_attention/<dtype>/chunk:T/context:N/threads:t   a causal chunk of T tokens whose last
//       sees N entries; counter fraction_of_gemm = the attention's GFLOP/s (4·d per visible
//       (query row, key) pair) / hw/gemm's GFLOP/s on the same rows and keys, threads and all
// The ratios are what to read: absolute numbers move with the machine (docs/perf.md).
#include <benchmark/benchmark.h>

#include <Eigen/Core>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <kvpolicy/trimkv.hpp>

namespace {

using namespace kvpolicy;
using RowMatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

constexpr int kKvHeads = 8, kGroup = 4, kHeadDim = 128;
const CacheShape kShape{1, kKvHeads, kKvHeads * kGroup, kHeadDim};

void set_threads(int t) {
#ifdef _OPENMP
  omp_set_num_threads(t);
#else
  (void)t;
#endif
}

// ---- the hardware ---------------------------------------------------------------------------------
std::map<int, double>& read_bw_measured() {  // threads -> bytes/s, filled by hw/read_bw
  static std::map<int, double> m;
  return m;
}
std::map<std::pair<std::int64_t, std::int64_t>, double>& gemm_measured() {  // (rows, keys) -> flop/s
  static std::map<std::pair<std::int64_t, std::int64_t>, double> m;
  return m;
}

void read_bw(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  set_threads(threads);
  const std::int64_t n = std::int64_t{512} << 20 >> 2;  // 512 MiB of floats: far past every cache
  std::vector<float> buf(static_cast<std::size_t>(n), 1.0f);
  double sum = 0;
  for (auto _ : state) {
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (int part = 0; part < threads; ++part) {
      const std::int64_t begin = n / threads * part, end = part + 1 == threads ? n : n / threads * (part + 1);
      // columns of 64 floats added into one 64-float accumulator: 8 independent vector chains
      Eigen::Array<float, 64, 1> acc = Eigen::Array<float, 64, 1>::Zero();
      for (std::int64_t i = begin; i + 64 <= end; i += 64) acc += Eigen::Map<const Eigen::Array<float, 64, 1>>(buf.data() + i);
      s += acc.sum();
    }
    sum += s;
    benchmark::DoNotOptimize(sum);
  }
  const double bytes = static_cast<double>(n) * sizeof(float) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["GB_per_s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

void copy_bw(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  set_threads(threads);
  const std::int64_t n = std::int64_t{256} << 20;
  std::vector<char> src(static_cast<std::size_t>(n), 1), dst(static_cast<std::size_t>(n), 0);
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int part = 0; part < threads; ++part) {
      const std::int64_t begin = n / threads * part, end = part + 1 == threads ? n : n / threads * (part + 1);
      std::memcpy(dst.data() + begin, src.data() + begin, static_cast<std::size_t>(end - begin));
    }
    benchmark::ClobberMemory();
  }
  const double bytes = static_cast<double>(n) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["GB_per_s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
}

// One kv head's two products on the prefill's shapes, Eigen's GEMM (threads through Eigen's own
// OpenMP), dense: what the attention's GFLOP/s is held to.
void gemm(benchmark::State& state) {
  const std::int64_t rows = state.range(0), keys = state.range(1);
  set_threads(static_cast<int>(state.range(2)));
  const RowMatrixF q = RowMatrixF::Random(rows, kHeadDim), k = RowMatrixF::Random(keys, kHeadDim),
                   v = RowMatrixF::Random(keys, kHeadDim);
  RowMatrixF s(rows, keys), o(rows, kHeadDim);
  for (auto _ : state) {
    s.noalias() = q * k.transpose();
    o.noalias() = s * v;
    benchmark::DoNotOptimize(o.data());
  }
  const double flops = 4.0 * static_cast<double>(rows * keys * kHeadDim) * static_cast<double>(state.iterations());
  state.counters["GFLOP_per_s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
}

// ---- the library -----------------------------------------------------------------------------------
struct Inputs {  // random K/V/log_beta/queries for T tokens
  std::vector<float> k, v, lb, q, out;
  explicit Inputs(std::int64_t T) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    k.resize(static_cast<std::size_t>(kKvHeads * T * kHeadDim));
    v.resize(k.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    lb.assign(static_cast<std::size_t>(kKvHeads * T), 0.0f);
    q.resize(static_cast<std::size_t>(kShape.q_heads * T * kHeadDim));
    for (auto& x : q) x = normal(rng);
    out.resize(q.size());
  }
};

template <class Storage>
using FullCache = TrimKVCache<cpu_backend, Storage, 16>;

// A cache holding `context` entries per head, then an open step of T tokens appended (not attended).
template <class Storage>
std::unique_ptr<FullCache<Storage>> cache_with(std::int64_t context, std::int64_t T, const Inputs& step) {
  const std::int64_t capacity = context + T;
  auto cache = std::make_unique<FullCache<Storage>>(
      kShape, memory::Paged<16, Storage>(memory::Paged<16, Storage>::pages_for(kShape, capacity)),
      trimkv_evictor({.budget = capacity + 1, .buffer = 1}));  // the trigger never fires
  cache->add_sequence(0);
  constexpr std::int64_t chunk = 1024;
  Inputs pre(chunk);
  for (std::int64_t n = 0; n < context; n += chunk) {
    const std::int64_t c = std::min(chunk, context - n);
    cache->step(0, View<const float, 4>(pre.k.data(), {1, kKvHeads, c, kHeadDim}),
                View<const float, 4>(pre.v.data(), {1, kKvHeads, c, kHeadDim}),
                View<const float, 3>(pre.lb.data(), {1, kKvHeads, c}));
  }
  cache->append(0, 0, View<const float, 3>(step.k.data(), {kKvHeads, T, kHeadDim}),
                View<const float, 3>(step.v.data(), {kKvHeads, T, kHeadDim}),
                View<const float, 2>(step.lb.data(), {kKvHeads, T}));
  return cache;
}

template <class Storage>
void decode_attention(benchmark::State& state) {
  const std::int64_t context = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  Inputs step(1);
  auto cache = cache_with<Storage>(context - 1, 1, step);
  set_threads(threads);
  for (auto _ : state) {
    cache->attend(0, 0, View<const float, 3>(step.q.data(), {kShape.q_heads, 1, kHeadDim}),
                  View<float, 3>(step.out.data(), {kShape.q_heads, 1, kHeadDim}));
    benchmark::DoNotOptimize(step.out.data());
  }
  const double bytes = 2.0 * static_cast<double>(context * kKvHeads * kHeadDim) * sizeof(Storage) *
                       static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  state.counters["GB_per_s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  const auto bw = read_bw_measured().find(threads);
  if (bw != read_bw_measured().end() && bw->second > 0)
    state.counters["fraction_of_read_bw"] = benchmark::Counter(bytes / bw->second, benchmark::Counter::kIsRate);
}

template <class Storage>
void prefill_attention(benchmark::State& state) {
  const std::int64_t T = state.range(0), context = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  Inputs step(T);
  auto cache = cache_with<Storage>(context - T, T, step);
  set_threads(threads);
  for (auto _ : state) {
    cache->attend(0, 0, View<const float, 3>(step.q.data(), {kShape.q_heads, T, kHeadDim}),
                  View<float, 3>(step.out.data(), {kShape.q_heads, T, kHeadDim}));
    benchmark::DoNotOptimize(step.out.data());
  }
  // visible (row, key) pairs: row t of the chunk sees context - T + t + 1 keys, for G query heads
  const double pairs = static_cast<double>(kGroup) * (static_cast<double>(T) * static_cast<double>(context - T) +
                                                      static_cast<double>(T) * static_cast<double>(T + 1) / 2.0);
  const double flops = 4.0 * kHeadDim * pairs * kKvHeads * static_cast<double>(state.iterations());
  state.counters["GFLOP_per_s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  const auto g = gemm_measured().find({kGroup * T, context * 100 + threads});
  if (g != gemm_measured().end() && g->second > 0)
    state.counters["fraction_of_gemm"] = benchmark::Counter(flops / g->second, benchmark::Counter::kIsRate);
}

// Google Benchmark hands each run's rates to the reporter only: this one keeps the hardware rows'
// rates for the library rows that follow them in the same run (registered first, so run first).
template <class Base>
class RememberRates : public Base {
  using Run = typename Base::Run;

 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const std::string name = r.benchmark_name();
      const auto rate = [&](const char* counter) {
        const auto it = r.counters.find(counter);
        return it == r.counters.end() ? 0.0 : it->second.value * 1e9;  // counters are in G/s
      };
      if (name.rfind("hw/read_bw/threads:", 0) == 0) read_bw_measured()[std::stoi(name.substr(19))] = rate("GB_per_s");
      if (name.rfind("hw/gemm/", 0) == 0) {  // hw/gemm/rows:R/keys:N/threads:t
        std::int64_t rows = 0, keys = 0, threads = 0;
        std::sscanf(name.c_str(), "hw/gemm/rows:%ld/keys:%ld/threads:%ld", &rows, &keys, &threads);
        gemm_measured()[{rows, keys * 100 + threads}] = rate("GFLOP_per_s");
      }
    }
    Base::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const auto time_unit = benchmark::kMicrosecond;
  for (int t : {1, 2}) {
    benchmark::RegisterBenchmark(("hw/read_bw/threads:" + std::to_string(t)).c_str(), read_bw)->Arg(t)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("hw/copy_bw/threads:" + std::to_string(t)).c_str(), copy_bw)->Arg(t)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  constexpr std::int64_t kChunk = 512;
  for (std::int64_t context : {512, 2048, 8192})
    for (int t : {1, 2})
      benchmark::RegisterBenchmark(("hw/gemm/rows:" + std::to_string(kGroup * kChunk) + "/keys:" + std::to_string(context) +
                                    "/threads:" + std::to_string(t)).c_str(), gemm)
          ->Args({kGroup * kChunk, context, t})->Unit(time_unit)->UseRealTime();
  const auto dtypes = [&](const char* what, auto fp32, auto fp16, auto bf16, std::vector<std::int64_t> args, std::string tail) {
    benchmark::RegisterBenchmark((std::string(what) + "/fp32" + tail).c_str(), fp32)->Args(args)->Unit(time_unit)->UseRealTime();
    benchmark::RegisterBenchmark((std::string(what) + "/fp16" + tail).c_str(), fp16)->Args(args)->Unit(time_unit)->UseRealTime();
    benchmark::RegisterBenchmark((std::string(what) + "/bf16" + tail).c_str(), bf16)->Args(args)->Unit(time_unit)->UseRealTime();
  };
  // context 128: the K/V (0.5 MiB fp16, 1 MiB fp32) stay in L2 across iterations, so that row is
  // the kernel's arithmetic alone, the bound a stream from memory cannot pass on its core
  for (std::int64_t context : {128, 4096, 16384, 65536})
    for (int t : {1, 2})
      dtypes("decode_attention", decode_attention<float>, decode_attention<half>, decode_attention<bfloat16>, {context, t},
             "/context:" + std::to_string(context) + "/threads:" + std::to_string(t));
  for (std::int64_t context : {512, 2048, 8192})
    for (int t : {1, 2})
      dtypes("prefill_attention", prefill_attention<float>, prefill_attention<half>, prefill_attention<bfloat16>,
             {kChunk, context, t}, "/chunk:" + std::to_string(kChunk) + "/context:" + std::to_string(context) +
                                       "/threads:" + std::to_string(t));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bool json = false;  // --benchmark_format=json: the same rows as JSON on stdout
  for (int i = 1; i < argc; ++i) json |= std::string(argv[i]) == "--benchmark_format=json";
  RememberRates<benchmark::ConsoleReporter> console;
  RememberRates<benchmark::JSONReporter> json_out;
  const auto ran = json ? benchmark::RunSpecifiedBenchmarks(&json_out) : benchmark::RunSpecifiedBenchmarks(&console);
  benchmark::Shutdown();
  return ran > 0 ? 0 : 1;  // a filter that matches nothing is a failure, not a pass
}
