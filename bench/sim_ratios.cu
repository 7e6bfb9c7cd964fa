// Ratios for a GPU simulator's timing model (GPGPU-Sim, docs/perf.md "Simulated"): each phase runs
// once, between lines "kvpolicy-sim: begin <phase> bytes <B>" and "kvpolicy-sim: end <phase>", so
// that bench/gpusim_ratios.py can sum the cycles the simulator reports for the kernels of each
// phase. Simulated cycles are a model's, never a measurement; only ratios within one run mean
// anything. On a real GPU the program runs too (the phases' kernels are the library's), but its
// markers carry no timing there.
//   copy       a plain device copy kernel over the decode phase's K and V bytes (16-byte loads)
//   decode     decode attention over those bytes: batch 4, Hkv 8, G 4, d 128, fp16, page 16
//   attention  one decode step's attention over every layer of a cache of L 4, Hkv 4, M + B = 288
//   evict      one eviction step (score + select + compact, TRIM-KV per head) over that same cache
//   sim_ratios [kv_MiB]   (default 16: at least 4x the simulated L2)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "kvpolicy/cuda.cuh"
#include "kvpolicy/parts/score/retention.hpp"

namespace kp = kvpolicy;
namespace kc = kvpolicy::gpu;

namespace {

template <class T>
T* upload(const std::vector<T>& h) {
  T* p = nullptr;
  KVPOLICY_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(1, h.size()) * sizeof(T)), "sim_ratios buffer");
  if (!h.empty()) KVPOLICY_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return p;
}

std::vector<__half> random_halves(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<__half> v(n);
  for (auto& x : v) x = __float2half(normal(rng));
  return v;
}

template <int = 0>
__global__ void copy_kernel(const uint4* src, uint4* dst, std::int64_t n) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    dst[i] = src[i];
}

void begin(const char* phase, double bytes) {
  KVPOLICY_CUDA_CHECK(cudaDeviceSynchronize(), "sync");
  std::printf("kvpolicy-sim: begin %s bytes %.0f\n", phase, bytes);
  std::fflush(stdout);
}
void end(const char* phase) {
  KVPOLICY_CUDA_CHECK(cudaDeviceSynchronize(), phase);
  std::printf("kvpolicy-sim: end %s\n", phase);
  std::fflush(stdout);
}

/// A paged fp16 cache of `segments` heads of `length` entries, pages laid out in order.
struct Pool {
  int segments, page = 16, dim = 128;
  std::int64_t length, pages_per_head, pages;
  __half *keys, *values;
  std::int32_t *position, *table, *lengths;
  float* meta;
  Pool(int segs, std::int64_t len, std::uint32_t seed)
      : segments(segs), length(len), pages_per_head((len + 15) / 16 + 1), pages(segs * pages_per_head) {
    const std::size_t slots = std::size_t(pages) * page;
    keys = upload(random_halves(slots * dim, seed));
    values = upload(random_halves(slots * dim, seed + 1));
    std::vector<std::int32_t> pos(slots), tab(static_cast<std::size_t>(pages));
    for (std::size_t i = 0; i < slots; ++i) pos[i] = static_cast<std::int32_t>(i % (pages_per_head * page));
    std::iota(tab.begin(), tab.end(), 0);
    std::mt19937 rng(seed + 2);
    std::uniform_real_distribution<float> u(-0.05f, 0.0f);
    std::vector<float> m(slots);
    for (auto& x : m) x = u(rng);
    position = upload(pos);
    table = upload(tab);
    lengths = upload(std::vector<std::int32_t>(std::size_t(segs), static_cast<std::int32_t>(len)));
    meta = upload(m);
  }
  kc::PagedKV<__half> kv() const {
    return {keys, values, position, meta, static_cast<std::int32_t>(pages), page, dim};
  }
  kc::BlockTableView tables() const {
    return {table, lengths, segments, static_cast<std::int32_t>(pages_per_head)};
  }
  double kv_bytes() const { return 2.0 * segments * double(length) * dim * sizeof(__half); }
};

/// Decode attention of one layer: `batch` sequences of `kv_heads` heads from segment `first`.
void attend(const Pool& p, int batch, int kv_heads, int group, int first_segment, std::int64_t max_length) {
  std::vector<std::int32_t> base(static_cast<std::size_t>(batch));
  for (int b = 0; b < batch; ++b) base[b] = first_segment + b * kv_heads;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> q(std::size_t(batch) * kv_heads * group * p.dim);
  for (auto& x : q) x = normal(rng);
  float* dq = upload(q);
  float* out = upload(std::vector<float>(q.size()));
  std::int32_t* dbase = upload(base);
  const kc::DecodeBatch a{dq, dbase, batch, kv_heads * group, kv_heads, out};
  std::size_t bytes = 0;
  kc::decode_attention(nullptr, bytes, p.kv(), p.tables(), a, max_length, nullptr);
  void* ws = nullptr;
  KVPOLICY_CUDA_CHECK(cudaMalloc(&ws, std::max<std::size_t>(bytes, 1)), "workspace");
  kc::decode_attention(ws, bytes, p.kv(), p.tables(), a, max_length, nullptr);
  KVPOLICY_CUDA_CHECK(cudaDeviceSynchronize(), "decode_attention");
  cudaFree(ws);
  cudaFree(dq);
  cudaFree(out);
  cudaFree(dbase);
}

}  // namespace

int main(int argc, char** argv) {
  if (!kc::device_present()) {
    std::printf("kvpolicy sim_ratios: no CUDA device (or simulator) here: SKIPPED\n");
    return 77;
  }
  const double mib = argc > 1 ? std::atof(argv[1]) : 16.0;
  if (!(mib > 0.0 && mib <= 4096.0)) {
    std::fprintf(stderr, "sim_ratios: kv_MiB = %s must be in (0, 4096]\n", argc > 1 ? argv[1] : "");
    return 2;
  }
  // copy vs decode attention over the same K/V bytes
  constexpr int kBatch = 4, kKv = 8, kGroup = 4;
  const auto length = static_cast<std::int64_t>(mib * (1 << 20) / (2.0 * kBatch * kKv * 128 * sizeof(__half)));
  Pool big(kBatch * kKv, length, 1);
  const std::int64_t vecs = std::int64_t(big.pages) * big.page * big.dim * std::int64_t(sizeof(__half)) / 16;
  uint4* dst = nullptr;
  KVPOLICY_CUDA_CHECK(cudaMalloc(&dst, std::size_t(vecs) * 16 * 2), "copy destination");
  int sms = 0;
  KVPOLICY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  begin("copy", 2.0 * 2.0 * double(vecs) * 16);  // K and V, each read once and written once
  copy_kernel<><<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(big.keys), dst, vecs);
  copy_kernel<><<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(big.values), dst + vecs, vecs);
  end("copy");
  begin("decode", big.kv_bytes());
  attend(big, kBatch, kKv, kGroup, 0, length);
  end("decode");

  // one eviction step vs one decode step's attention over the same cache
  constexpr int kLayers = 4, kHeads = 4;
  constexpr std::int64_t kBudget = 256, kBuffer = 32;
  Pool cache(kLayers * kHeads, kBudget + kBuffer, 11);
  std::printf("kvpolicy-sim: cache L %d, Hkv %d, M %lld, B %lld, %.1f MiB of K/V\n", kLayers, kHeads,
              static_cast<long long>(kBudget), static_cast<long long>(kBuffer), cache.kv_bytes() / (1 << 20));
  begin("attention", cache.kv_bytes());
  for (int layer = 0; layer < kLayers; ++layer) attend(cache, 1, kHeads, kGroup, layer * kHeads, kBudget + kBuffer);
  end("attention");
  std::vector<std::int32_t> free_pages(static_cast<std::size_t>(cache.pages)), free_count{0};
  std::int32_t* dfree = upload(free_pages);
  std::int32_t* dcount = upload(free_count);
  const kc::FreeList fl{dfree, dcount, static_cast<std::int32_t>(cache.pages)};
  kp::StepContext* ctx = upload(std::vector<kp::StepContext>{kp::StepContext{kBudget + kBuffer, 0, false, 0}});
  kp::evict::PerHead<> evictor;  // TRIM-KV's rule, SPEC §1
  evictor.rule = {kBudget, kBuffer};
  const kp::CacheShape shape{kLayers, kHeads, kHeads * kGroup, 128};
  std::size_t bytes = 0;
  kc::evict_step(nullptr, bytes, kp::score::RetentionDecay{}, evictor, shape, cache.kv(), cache.tables(), fl, ctx, nullptr,
                 nullptr, nullptr);
  void* ws = nullptr;
  KVPOLICY_CUDA_CHECK(cudaMalloc(&ws, std::max<std::size_t>(bytes, 1)), "workspace");
  begin("evict", 0);
  kc::evict_step(ws, bytes, kp::score::RetentionDecay{}, evictor, shape, cache.kv(), cache.tables(), fl, ctx, nullptr, nullptr,
                 nullptr);
  end("evict");
  std::vector<std::int32_t> after(static_cast<std::size_t>(cache.segments));
  KVPOLICY_CUDA_CHECK(cudaMemcpy(after.data(), cache.lengths, after.size() * sizeof(std::int32_t),
                                 cudaMemcpyDeviceToHost),
                      "lengths");
  for (std::int32_t n : after)
    if (n != kBudget) {
      std::fprintf(stderr, "sim_ratios: a head holds %d entries after eviction, not M = %lld\n", n,
                   static_cast<long long>(kBudget));
      return 1;
    }
  std::printf("kvpolicy-sim: done (every head evicted to M = %lld)\n", static_cast<long long>(kBudget));
  return 0;
}
