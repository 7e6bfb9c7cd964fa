// The CUDA path's benchmarks (Google Benchmark, manual timing by CUDA events; run with
// --benchmark_repetitions to get medians). Inputs are rotated over copies that together exceed
// twice the L2 cache, so no timing reads a warm L2. Every figure the issue asks for is a ratio
// taken in one run:
//   copy/<MiB>                  device-to-device copy bandwidth (read + write bytes / time)
//   decode_attention/<N>        paged decode attention, batch 8, Hkv 8, G 4, d 128, fp16, page 16,
//                               pages in random order, random K/V and queries: K+V bytes read /
//                               time; compare with copy/ of the same run
//   decode_attention_graph/<N>  the same call captured in a CUDA graph (one per copy) and replayed:
//                               what an engine that replays its decode step pays, launch gaps out
//   decode_split/<N>/<S>        graph replay with the split named (DecodeBatch::splits): the sweep
//                               the plan's rule is read from
//   evict_parts/<batch>         evict_step's parts timed apart: trigger, score, select, compact
//   segmented_topk              L·Hkv·batch = 36·8·8 segments of 1152 entries, keep 1024 each
//   global_topk/<batch>         the pooled top-K over L·Hkv·(M+B) = 36·8·1152 entries per sequence
//   evict_step/<batch>          score + select + compact, per head, L 36, Hkv 8, M 1024, B 128
//   decode_attention_36_layers  the decode attention of all 36 layers over that same cache
// Without a CUDA device the binary prints why and exits 77 (ctest: SKIPPED).
// `kvpolicy_bench_cuda --once=N[,N...] [--once-splits=S]` runs no benchmark: for each N it makes
// one decode_attention call over the same shapes between two launches of ncu_marker_kernel, so a
// profiler's kernel list (bench/ncu_kernel_time.py) sums the kernels of exactly one call.
#include <benchmark/benchmark.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvpolicy/cuda.cuh"
#include "kvpolicy/parts/score/retention.hpp"

namespace kp = kvpolicy;
namespace kc = kvpolicy::gpu;

namespace {

template <class T>
struct Buffer {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Buffer(std::size_t count) : n(count) {
    if (n) KVPOLICY_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)), "benchmark buffer");
  }
  Buffer(const std::vector<T>& h) : Buffer(h.size()) {
    if (n) KVPOLICY_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  ~Buffer() {
    if (p) cudaFree(p);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

struct Timer {
  cudaEvent_t start{}, stop{};
  Timer() {
    KVPOLICY_CUDA_CHECK(cudaEventCreate(&start), "event");
    KVPOLICY_CUDA_CHECK(cudaEventCreate(&stop), "event");
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  void begin(cudaStream_t s) { KVPOLICY_CUDA_CHECK(cudaEventRecord(start, s), "event record"); }
  double end_seconds(cudaStream_t s) {
    KVPOLICY_CUDA_CHECK(cudaEventRecord(stop, s), "event record");
    KVPOLICY_CUDA_CHECK(cudaEventSynchronize(stop), "event synchronize");
    float ms = 0.0f;
    KVPOLICY_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop), "elapsed time");
    return ms / 1e3;
  }
};

std::size_t l2_bytes() {
  int device = 0, l2 = 0;
  KVPOLICY_CUDA_CHECK(cudaGetDevice(&device), "device");
  KVPOLICY_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "L2 size");
  return static_cast<std::size_t>(l2);
}

/// Fills p[0, n) with uniform values of mean 0 and standard deviation `sigma` (a hash of the index
/// and seed): timings on constants or zeros can flatter a kernel.
template <class T>
__global__ void fill_random_kernel(T* p, std::size_t n, std::uint64_t seed, float sigma) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;  // splitmix64's finaliser
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    const float u = static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
    p[i] = static_cast<T>(u * 3.4641016f * sigma);                                 // sqrt(12): unit variance
  }
}
template <class T>
void fill_random(T* p, std::size_t n, std::uint64_t seed, float sigma = 1.0f) {
  if (n == 0) return;
  fill_random_kernel<<<1024, 256>>>(p, n, seed, sigma);
  KVPOLICY_CUDA_CHECK(cudaGetLastError(), "fill_random_kernel");
}

/// Launched before and after the call a profiler's kernel list should isolate (--once).
__global__ void ncu_marker_kernel(std::int64_t tag) {
  if (tag < 0) __trap();  // never: the launch is the mark
}

/// Copies of the data a benchmark reads, enough of them to exceed 2 x L2 together.
int rotation(std::size_t bytes_per_copy) {
  return static_cast<int>(std::max<std::size_t>(1, (2 * l2_bytes() + bytes_per_copy - 1) / bytes_per_copy));
}

void BM_copy(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  Buffer<char> src(bytes), dst(bytes);
  Timer timer;
  for (auto _ : state) {
    timer.begin(nullptr);
    KVPOLICY_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, nullptr), "copy");
    state.SetIterationTime(timer.end_seconds(nullptr));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * 2 * static_cast<std::int64_t>(bytes));
}
BENCHMARK(BM_copy)->Arg(1024)->UseManualTime()->Unit(benchmark::kMicrosecond);

/// A paged fp16 cache of `batch` sequences x Hkv heads x `length` entries in `copies` replicas.
struct DecodeSetup {
  static constexpr int kKv = 8, kGroup = 4, kDim = 128, kPage = 16;
  int batch, copies;
  std::int64_t length, pages_per_copy;
  Buffer<__half> keys, values;
  Buffer<std::int32_t> position, table, lengths, base;
  Buffer<float> meta, queries, out;
  DecodeSetup(int b, std::int64_t n, int c)
      : batch(b), copies(c), length(n), pages_per_copy(std::int64_t{b} * kKv * ((n + kPage - 1) / kPage)),
        keys(std::size_t(pages_per_copy) * c * kPage * kDim), values(keys.n),
        position(std::size_t(pages_per_copy) * c * kPage), table(tables()), lengths(std::vector<std::int32_t>(
                                                                                std::size_t(b) * kKv * c, std::int32_t(n))),
        base(bases()), meta(position.n), queries(std::size_t(b) * kKv * kGroup * kDim), out(queries.n) {
    fill_random(keys.p, keys.n, 1);
    fill_random(values.p, values.n, 2);
    fill_random(queries.p, queries.n, 3);
    KVPOLICY_CUDA_CHECK(cudaDeviceSynchronize(), "fill");
  }
  std::int64_t max_pages() const { return (length + kPage - 1) / kPage; }
  std::vector<std::int32_t> tables() const {  // the pages in random order, as a paged engine's are
    std::vector<std::int32_t> t(std::size_t(batch) * kKv * copies * max_pages());
    std::iota(t.begin(), t.end(), 0);
    std::shuffle(t.begin(), t.end(), std::mt19937(4));
    return t;
  }
  std::vector<std::int32_t> bases() const {  // [copies][batch]: segment of (sequence, kv head 0)
    std::vector<std::int32_t> b(std::size_t(batch) * copies);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::int32_t>(i * kKv);
    return b;
  }
  double kv_bytes() const { return 2.0 * batch * kKv * double(length) * kDim * sizeof(__half); }
  kc::PagedKV<__half> kv() const {
    return {keys.p, values.p, position.p, meta.p, static_cast<std::int32_t>(pages_per_copy * copies), kPage, kDim};
  }
  kc::BlockTableView tables_view() const {
    return {table.p, lengths.p, batch * kKv * copies, static_cast<std::int32_t>(max_pages())};
  }
  kc::DecodeBatch batch_of(int copy) const {
    return {queries.p, base.p + std::size_t(copy) * batch, batch, kKv * kGroup, kKv, out.p};
  }
};

/// Decode attention over batch 8 x Hkv 8 heads of n entries (G 4, d 128, fp16), on `kernel`.
void decode_attention_on(benchmark::State& state, kc::DecodeKernel kernel) {
  const std::int64_t n = state.range(0);
  const int batch = 8;
  const double per_copy = 2.0 * batch * DecodeSetup::kKv * double(n) * DecodeSetup::kDim * sizeof(__half);
  DecodeSetup s(batch, n, rotation(static_cast<std::size_t>(per_copy)));
  std::size_t bytes = 0;
  const auto batch_of = [&](int copy) {
    kc::DecodeBatch a = s.batch_of(copy);
    a.kernel = kernel;
    return a;
  };
  kc::decode_attention(nullptr, bytes, s.kv(), s.tables_view(), batch_of(0), n, nullptr);
  Buffer<char> ws(bytes);
  Timer timer;
  int copy = 0;
  for (auto _ : state) {
    timer.begin(nullptr);
    kc::decode_attention(ws.p, bytes, s.kv(), s.tables_view(), batch_of(copy), n, nullptr);
    state.SetIterationTime(timer.end_seconds(nullptr));
    copy = (copy + 1) % s.copies;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * s.kv_bytes()));
  state.counters["kv_MiB"] = s.kv_bytes() / (1 << 20);
}
/// The kernel an engine gets (tensor cores on sm_80+).
void BM_decode_attention(benchmark::State& state) { decode_attention_on(state, kc::DecodeKernel::automatic); }
/// The CUDA-core kernel on the same shapes, for the ratio between the two in one run.
void BM_decode_attention_cuda_cores(benchmark::State& state) {
  decode_attention_on(state, kc::DecodeKernel::cuda_cores);
}
BENCHMARK(BM_decode_attention)
    ->RangeMultiplier(2)
    ->Range(256, 65536)  // 8 MiB .. 2 GiB of K+V
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_attention_cuda_cores)
    ->RangeMultiplier(2)
    ->Range(256, 65536)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

/// Decode attention (the kernel an engine gets) captured once per copy into a CUDA graph and
/// replayed, with `splits` chunks a head (0: the plan's).
void decode_graph_replay(benchmark::State& state, std::int64_t n, std::int32_t splits) {
  const int batch = 8;
  const double per_copy = 2.0 * batch * DecodeSetup::kKv * double(n) * DecodeSetup::kDim * sizeof(__half);
  DecodeSetup s(batch, n, rotation(static_cast<std::size_t>(per_copy)));
  const auto batch_of = [&](int copy) {
    kc::DecodeBatch a = s.batch_of(copy);
    a.splits = splits;
    return a;
  };
  std::size_t bytes = 0;
  kc::decode_attention(nullptr, bytes, s.kv(), s.tables_view(), batch_of(0), n, nullptr);
  Buffer<char> ws(bytes);
  cudaStream_t stream{};
  KVPOLICY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::vector<cudaGraphExec_t> graphs(static_cast<std::size_t>(s.copies));
  for (int copy = 0; copy < s.copies; ++copy) {
    cudaGraph_t g{};
    KVPOLICY_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    kc::decode_attention(ws.p, bytes, s.kv(), s.tables_view(), batch_of(copy), n, stream);
    KVPOLICY_CUDA_CHECK(cudaStreamEndCapture(stream, &g), "end capture");
    KVPOLICY_CUDA_CHECK(cudaGraphInstantiate(&graphs[std::size_t(copy)], g, 0), "instantiate");
    KVPOLICY_CUDA_CHECK(cudaGraphDestroy(g), "graph destroy");
  }
  for (int copy = 0; copy < s.copies; ++copy)  // warm: the first replay uploads the graph
    KVPOLICY_CUDA_CHECK(cudaGraphLaunch(graphs[std::size_t(copy)], stream), "replay");
  Timer timer;
  int copy = 0;
  for (auto _ : state) {
    timer.begin(stream);
    KVPOLICY_CUDA_CHECK(cudaGraphLaunch(graphs[std::size_t(copy)], stream), "replay");
    state.SetIterationTime(timer.end_seconds(stream));
    copy = (copy + 1) % s.copies;
  }
  for (auto g : graphs) cudaGraphExecDestroy(g);
  cudaStreamDestroy(stream);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * s.kv_bytes()));
  state.counters["kv_MiB"] = s.kv_bytes() / (1 << 20);
  state.counters["copies"] = s.copies;
  state.counters["splits"] =  // the tensor-core kernel's plan (what runs here on sm_80+)
      kc::detail::plan_decode(batch_of(0), n, DecodeSetup::kPage, kc::detail::sm_count_of_current_device(), true).splits;
}
void BM_decode_attention_graph(benchmark::State& state) { decode_graph_replay(state, state.range(0), 0); }
BENCHMARK(BM_decode_attention_graph)
    ->RangeMultiplier(2)
    ->Range(256, 65536)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
void BM_decode_split(benchmark::State& state) {
  decode_graph_replay(state, state.range(0), static_cast<std::int32_t>(state.range(1)));
}
BENCHMARK(BM_decode_split)
    ->ArgsProduct({benchmark::CreateRange(256, 65536, 4), {1, 2, 3, 4, 6, 8, 12, 16, 32}})
    ->MinTime(0.05)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

/// --once: one decode_attention call per length between marker launches, for a profiler.
int decode_once(const std::vector<std::int64_t>& lengths, std::int32_t splits) {
  for (const std::int64_t n : lengths) {
    DecodeSetup s(8, n, 1);
    kc::DecodeBatch a = s.batch_of(0);
    a.splits = splits;
    std::size_t bytes = 0;
    kc::decode_attention(nullptr, bytes, s.kv(), s.tables_view(), a, n, nullptr);
    Buffer<char> ws(bytes);
    kc::decode_attention(ws.p, bytes, s.kv(), s.tables_view(), a, n, nullptr);  // warm: module load
    KVPOLICY_CUDA_CHECK(cudaDeviceSynchronize(), "warm call");
    ncu_marker_kernel<<<1, 1>>>(n);
    kc::decode_attention(ws.p, bytes, s.kv(), s.tables_view(), a, n, nullptr);
    ncu_marker_kernel<<<1, 1>>>(n);
    KVPOLICY_CUDA_CHECK(cudaDeviceSynchronize(), "profiled call");
    std::printf("once: length %lld, K+V %.0f MiB\n", static_cast<long long>(n), s.kv_bytes() / (1 << 20));
  }
  return 0;
}

// The same decode attention with H2O's mass (DecodeBatch::accumulate_mass): a third pass re-reads
// the keys (not the values) and adds each entry's probability to its mass.
void BM_decode_attention_h2o(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  const int batch = 8;
  const double per_copy = 2.0 * batch * DecodeSetup::kKv * double(n) * DecodeSetup::kDim * sizeof(__half);
  DecodeSetup s(batch, n, rotation(static_cast<std::size_t>(per_copy)));
  Buffer<float> mass(s.position.n);
  KVPOLICY_CUDA_CHECK(cudaMemset(mass.p, 0, mass.n * sizeof(float)), "fill");
  kc::PagedKV<__half> kv = s.kv();
  kv.fields[kp::Field::attention_mass] = mass.p;
  auto batch_of = [&](int copy) {
    kc::DecodeBatch a = s.batch_of(copy);
    a.accumulate_mass = true;
    return a;
  };
  std::size_t bytes = 0;
  kc::decode_attention(nullptr, bytes, kv, s.tables_view(), batch_of(0), n, nullptr);
  Buffer<char> ws(bytes);
  Timer timer;
  int copy = 0;
  for (auto _ : state) {
    timer.begin(nullptr);
    kc::decode_attention(ws.p, bytes, kv, s.tables_view(), batch_of(copy), n, nullptr);
    state.SetIterationTime(timer.end_seconds(nullptr));
    copy = (copy + 1) % s.copies;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * s.kv_bytes()));
  state.counters["kv_MiB"] = s.kv_bytes() / (1 << 20);
}
BENCHMARK(BM_decode_attention_h2o)->Arg(4096)->Arg(16384)->UseManualTime()->Unit(benchmark::kMicrosecond);

/// L 36 x Hkv 8 x batch heads of M + B = 1152 entries with random retention metadata, paged fp16,
/// restored to the same state before every timed eviction.
struct EvictSetup {
  static constexpr int kLayers = 36, kKv = 8, kDim = 128, kPage = 16;
  static constexpr std::int64_t kBudget = 1024, kBuffer = 128, kLength = kBudget + kBuffer;
  int batch, segments;
  std::int64_t pages;
  Buffer<__half> keys, values;
  Buffer<std::int32_t> position, position0, table, table0, lengths, lengths0, free_pages, free_count, free_count0;
  Buffer<float> meta, meta0;
  Buffer<kp::StepContext> context;
  explicit EvictSetup(int b)
      : batch(b), segments(b * kLayers * kKv), pages(std::int64_t{segments} * (kLength / kPage + 1)),
        keys(std::size_t(pages) * kPage * kDim), values(keys.n), position(positions()), position0(positions()),
        table(tables()), table0(tables()), lengths(std::vector<std::int32_t>(segments, kLength)),
        lengths0(std::vector<std::int32_t>(segments, kLength)), free_pages(std::size_t(pages)),
        free_count(std::vector<std::int32_t>{0}), free_count0(std::vector<std::int32_t>{0}), meta(metas()),
        meta0(metas()), context(std::vector<kp::StepContext>(b, kp::StepContext{kLength, 0, false, 0})) {}
  std::vector<std::int32_t> positions() const {
    std::vector<std::int32_t> p(std::size_t(pages) * kPage);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::int32_t>(i % (kLength / kPage * kPage + kPage));
    return p;
  }
  std::vector<float> metas() const {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.01f, 0.0f);
    std::vector<float> m(std::size_t(pages) * kPage);
    for (auto& x : m) x = u(rng);
    return m;
  }
  std::vector<std::int32_t> tables() const {
    std::vector<std::int32_t> t(static_cast<std::size_t>(pages));
    std::iota(t.begin(), t.end(), 0);
    return t;
  }
  void restore(cudaStream_t s) const {
    const auto copy = [&](auto* dst, const auto* src, std::size_t n) {
      KVPOLICY_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(*dst), cudaMemcpyDeviceToDevice, s), "restore");
    };
    copy(position.p, position0.p, position.n);
    copy(meta.p, meta0.p, meta.n);
    copy(table.p, table0.p, table.n);
    copy(lengths.p, lengths0.p, lengths.n);
    copy(free_count.p, free_count0.p, 1);
  }
  kc::PagedKV<__half> kv() const {
    return {keys.p, values.p, position.p, meta.p, static_cast<std::int32_t>(pages), kPage, kDim};
  }
  kc::BlockTableView tables_view() const {
    return {table.p, lengths.p, segments, static_cast<std::int32_t>(kLength / kPage + 1)};
  }
  kc::FreeList free() const { return {free_pages.p, free_count.p, static_cast<std::int32_t>(pages)}; }
  static kp::evict::PerHead<> evictor() {
    kp::evict::PerHead<> e;
    e.rule = {kBudget, kBuffer};
    return e;
  }
  static kp::CacheShape shape() { return {kLayers, kKv, kKv, kDim}; }
};

void BM_evict_step(benchmark::State& state) {
  EvictSetup s(static_cast<int>(state.range(0)));
  std::size_t bytes = 0;
  kc::evict_step(nullptr, bytes, kp::score::RetentionDecay{}, s.evictor(), s.shape(), s.kv(), s.tables_view(),
                 s.free(), s.context.p, nullptr, nullptr, nullptr);
  Buffer<char> ws(bytes);
  Timer timer;
  for (auto _ : state) {
    s.restore(nullptr);
    timer.begin(nullptr);
    kc::evict_step(ws.p, bytes, kp::score::RetentionDecay{}, s.evictor(), s.shape(), s.kv(), s.tables_view(), s.free(),
                   s.context.p, nullptr, nullptr, nullptr);
    state.SetIterationTime(timer.end_seconds(nullptr));
  }
  state.counters["entries"] = double(s.segments) * EvictSetup::kLength;
}
BENCHMARK(BM_evict_step)->Arg(1)->Arg(8)->UseManualTime()->Unit(benchmark::kMicrosecond);

/// evict_step's parts, each between its own events (the same calls evict_step makes, in order):
/// the trigger, the scoring (offsets, scores, positions), the selection and the compaction.
void BM_evict_parts(benchmark::State& state) {
  EvictSetup s(static_cast<int>(state.range(0)));
  const auto evictor = EvictSetup::evictor();
  const auto shape = EvictSetup::shape();
  const auto per_group = static_cast<std::int32_t>(evictor.group_heads(shape));
  kc::WorkspaceLayout layout;
  kc::detail::carve_evict(layout, nullptr, per_group, s.kv(), s.tables_view());
  Buffer<char> ws(layout.bytes());
  kc::WorkspaceLayout carve;
  const kc::detail::EvictWork w = kc::detail::carve_evict(carve, ws.p, per_group, s.kv(), s.tables_view());
  Timer t0, t1, t2, t3;
  double trigger = 0, score = 0, select = 0, compact = 0;
  for (auto _ : state) {
    s.restore(nullptr);
    t0.begin(nullptr);
    kc::detail::trigger_heads(w, evictor, shape, s.tables_view(), s.context.p, per_group, nullptr);
    const double a = t0.end_seconds(nullptr);
    t1.begin(nullptr);
    kc::detail::score_active(w, kp::score::RetentionDecay{}, evictor, shape, s.kv(), s.tables_view(), s.context.p,
                             nullptr, nullptr);
    const double b = t1.end_seconds(nullptr);
    t2.begin(nullptr);
    kc::detail::select_kept(w, evictor, shape, s.tables_view(), s.context.p, per_group, nullptr);
    const double c = t2.end_seconds(nullptr);
    t3.begin(nullptr);
    kc::detail::apply_eviction(w, s.kv(), s.tables_view(), s.free(), nullptr, nullptr);
    const double d = t3.end_seconds(nullptr);
    trigger += a, score += b, select += c, compact += d;
    state.SetIterationTime(a + b + c + d);
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["trigger_us"] = trigger / iters * 1e6;
  state.counters["score_us"] = score / iters * 1e6;
  state.counters["select_us"] = select / iters * 1e6;
  state.counters["compact_us"] = compact / iters * 1e6;
}
BENCHMARK(BM_evict_parts)->Arg(1)->Arg(8)->UseManualTime()->Unit(benchmark::kMicrosecond);

/// The same cache as BM_evict_step/8, all 36 layers of one decode step's attention (G 4).
void BM_decode_attention_36_layers(benchmark::State& state) {
  EvictSetup s(8);
  constexpr int kGroup = 4;
  Buffer<float> q(std::size_t(8) * EvictSetup::kKv * kGroup * EvictSetup::kDim), out(q.n);
  KVPOLICY_CUDA_CHECK(cudaMemset(q.p, 0, q.n * sizeof(float)), "fill");
  std::vector<std::int32_t> bases(std::size_t(8) * EvictSetup::kLayers);
  for (int layer = 0; layer < EvictSetup::kLayers; ++layer)
    for (int b = 0; b < 8; ++b)
      bases[std::size_t(layer) * 8 + b] = (b * EvictSetup::kLayers + layer) * EvictSetup::kKv;
  Buffer<std::int32_t> base(bases);
  const auto batch_of = [&](int layer) {
    return kc::DecodeBatch{q.p, base.p + std::size_t(layer) * 8, 8, EvictSetup::kKv * kGroup, EvictSetup::kKv, out.p};
  };
  std::size_t bytes = 0;
  kc::decode_attention(nullptr, bytes, s.kv(), s.tables_view(), batch_of(0), EvictSetup::kLength, nullptr);
  Buffer<char> ws(bytes);
  Timer timer;
  for (auto _ : state) {
    timer.begin(nullptr);
    for (int layer = 0; layer < EvictSetup::kLayers; ++layer)
      kc::decode_attention(ws.p, bytes, s.kv(), s.tables_view(), batch_of(layer), EvictSetup::kLength, nullptr);
    state.SetIterationTime(timer.end_seconds(nullptr));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2.0 * s.segments * EvictSetup::kLength *
                                                    EvictSetup::kDim * sizeof(__half)));
}
BENCHMARK(BM_decode_attention_36_layers)->UseManualTime()->Unit(benchmark::kMicrosecond);

/// Scores laid flat: `segments` segments of `length` entries, random retention scores.
struct SelectSetup {
  Buffer<float> score;
  Buffer<std::int32_t> position;
  Buffer<std::int64_t> offsets;
  Buffer<std::uint8_t> keep;
  std::int32_t segments;
  SelectSetup(std::int32_t segs, std::int64_t length)
      : score(scores(segs * length)), position(positions(segs, length)), offsets(offsets_of(segs, length)),
        keep(std::size_t(segs * length)), segments(segs) {}
  static std::vector<float> scores(std::int64_t n) {
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> u(-50.0f, 0.0f);
    std::vector<float> s(static_cast<std::size_t>(n));
    for (auto& x : s) x = u(rng);
    return s;
  }
  static std::vector<std::int32_t> positions(std::int32_t segs, std::int64_t length) {
    std::vector<std::int32_t> p(std::size_t(segs) * length);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::int32_t>(i % length);
    return p;
  }
  static std::vector<std::int64_t> offsets_of(std::int32_t segs, std::int64_t length) {
    std::vector<std::int64_t> o(std::size_t(segs) + 1);
    for (std::size_t i = 0; i < o.size(); ++i) o[i] = std::int64_t(i) * length;
    return o;
  }
  kc::DeviceSegments view() const { return {score.p, position.p, offsets.p, segments}; }
};

void BM_segmented_topk(benchmark::State& state) {
  SelectSetup s(36 * 8 * 8, 1152);
  kc::SegmentRule rule;
  rule.sel.keep = 1024;
  Timer timer;
  for (auto _ : state) {
    timer.begin(nullptr);
    kc::segmented_select(s.view(), rule, s.keep.p, nullptr);
    state.SetIterationTime(timer.end_seconds(nullptr));
  }
  state.counters["entries"] = 36.0 * 8 * 8 * 1152;
}
BENCHMARK(BM_segmented_topk)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_global_topk(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  SelectSetup s(36 * 8 * batch, 1152);
  kc::PooledRule rule;
  rule.segments_per_group = 36 * 8;
  rule.sel.budget = 1024;
  std::size_t bytes = 0;
  kc::pooled_select(nullptr, bytes, s.view(), rule, s.keep.p, 1152, nullptr);
  Buffer<char> ws(bytes);
  Timer timer;
  for (auto _ : state) {
    timer.begin(nullptr);
    kc::pooled_select(ws.p, bytes, s.view(), rule, s.keep.p, 1152, nullptr);
    state.SetIterationTime(timer.end_seconds(nullptr));
  }
  state.counters["entries"] = 36.0 * 8 * batch * 1152;
}
BENCHMARK(BM_global_topk)->Arg(1)->Arg(8)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  if (!kc::device_present()) {
    std::printf("kvpolicy CUDA benchmarks: no CUDA device here: SKIPPED\n");
    return 77;
  }
  std::vector<std::int64_t> once;
  std::int32_t once_splits = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--once=", 0) == 0) {
      for (std::size_t at = 7; at < arg.size();) {
        const std::size_t comma = std::min(arg.find(',', at), arg.size());
        once.push_back(std::stoll(arg.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (arg.rfind("--once-splits=", 0) == 0) {
      once_splits = std::stoi(arg.substr(14));
    }
  }
  if (!once.empty()) return decode_once(once, once_splits);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
