// An engine's decode loop on kvpolicy's CUDA path (docs/architecture.md, "Device path"): the
// engine owns the device memory (K/V pool with metadata, block tables, free list, status word) and,
// each step, for every layer appends the batch's new tokens and runs the paged decode attention,
// then runs one eviction step (TRIM-KV per head, M = 64, B = 16) over every sequence. One stream;
// the scratch of every call is sized once, before the loop; nothing in the loop allocates.
// The same tokens go through the CPU reference (TrimKVCache) beside it, and the run checks that
// both keep the same entries in every head, hold the same number of free pages, and attend to
// within 1e-5 (fp32). Exit 0 when every check holds; 77 (SKIPPED) without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <kvpolicy/cuda.cuh>
#include <kvpolicy/trimkv.hpp>

namespace kp = kvpolicy;
namespace kc = kvpolicy::gpu;

namespace {

constexpr int kLayers = 2, kKv = 2, kGroup = 2, kDim = 64, kPage = 16, kSeqs = 3;
constexpr int kQ = kKv * kGroup, kSegments = kSeqs * kLayers * kKv;
constexpr std::int64_t kBudget = 64, kBuffer = 16, kPrompt = 40, kSteps = 150;
constexpr std::int32_t kMaxPages = (kBudget + kBuffer + kPrompt) / kPage + 2;
constexpr std::int32_t kPages = kSegments * kMaxPages;

template <class T>
T* device(std::size_t n) {
  T* p = nullptr;
  KVPOLICY_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)), "engine_cuda: ", n, " elements");
  return p;
}
template <class T>
void upload(T* dst, const std::vector<T>& src, cudaStream_t s) {
  KVPOLICY_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, s), "upload");
}
template <class T>
std::vector<T> download(const T* src, std::size_t n, cudaStream_t s) {
  std::vector<T> out(n);
  KVPOLICY_CUDA_CHECK(cudaMemcpyAsync(out.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost, s), "download");
  KVPOLICY_CUDA_CHECK(cudaStreamSynchronize(s), "synchronise");
  return out;
}

}  // namespace

int main() {
  if (!kc::device_present()) {
    std::printf("engine_cuda: no CUDA device here: SKIPPED\n");
    return 77;
  }
  cudaStream_t stream;
  KVPOLICY_CUDA_CHECK(cudaStreamCreate(&stream), "stream");

  // ---- the engine's device memory, and the views over it ----
  kc::PagedKV<float> kv{device<float>(std::size_t(kPages) * kPage * kDim), device<float>(std::size_t(kPages) * kPage * kDim),
                        device<std::int32_t>(std::size_t(kPages) * kPage), device<float>(std::size_t(kPages) * kPage),
                        kPages, kPage, kDim};
  kc::BlockTableView tables{device<std::int32_t>(std::size_t(kSegments) * kMaxPages), device<std::int32_t>(kSegments),
                         kSegments, kMaxPages};
  kc::FreeList free{device<std::int32_t>(kPages), device<std::int32_t>(1), kPages};
  auto* status = device<kc::Status>(1);
  std::vector<std::int32_t> free_pages(kPages);
  for (int i = 0; i < kPages; ++i) free_pages[i] = kPages - 1 - i;
  upload(free.pages, free_pages, stream);
  upload(free.count, std::vector<std::int32_t>{kPages}, stream);
  upload(tables.length, std::vector<std::int32_t>(kSegments, 0), stream);
  upload(status, std::vector<kc::Status>{kc::Status{}}, stream);

  // per layer: the append rows (sequence-major, kv head minor) and each sequence's segment base
  std::vector<std::int32_t> rows(std::size_t(kLayers) * kSeqs * kKv), bases(std::size_t(kLayers) * kSeqs);
  for (int l = 0; l < kLayers; ++l)
    for (int s = 0; s < kSeqs; ++s) {
      bases[std::size_t(l) * kSeqs + s] = (s * kLayers + l) * kKv;
      for (int h = 0; h < kKv; ++h) rows[(std::size_t(l) * kSeqs + s) * kKv + h] = (s * kLayers + l) * kKv + h;
    }
  auto* d_rows = device<std::int32_t>(rows.size());
  auto* d_bases = device<std::int32_t>(bases.size());
  upload(d_rows, rows, stream);
  upload(d_bases, bases, stream);

  // per step inputs: K/V [L, S, Hkv, T, d], log_beta and positions [L, S, Hkv, T], queries/out [S, Hq, d]
  const std::size_t most = std::size_t(kLayers) * kSeqs * kKv * kPrompt;
  auto* d_keys = device<float>(most * kDim);
  auto* d_values = device<float>(most * kDim);
  auto* d_log_beta = device<float>(most);
  auto* d_position = device<std::int32_t>(most);
  auto* d_queries = device<float>(std::size_t(kSeqs) * kQ * kDim);
  auto* d_out = device<float>(std::size_t(kSeqs) * kQ * kDim);
  auto* d_context = device<kp::StepContext>(kSeqs);

  const kp::CacheShape shape{kLayers, kKv, kQ, kDim};
  const auto evictor = kp::trimkv_evictor({.budget = kBudget, .buffer = kBuffer});  // TRIM-KV's rule (SPEC §1), as the CPU cache below
  const kc::DecodeBatch batch0{d_queries, d_bases, kSeqs, kQ, kKv, d_out};

  // ---- every workspace sized once, before the loop ----
  std::size_t append_bytes = 0, attention_bytes = 0, evict_bytes = 0;
  kc::AppendRows<float> largest{d_rows, kSeqs * kKv, static_cast<std::int32_t>(kPrompt)};
  kc::append(nullptr, append_bytes, kv, tables, free, largest, status, stream);
  kc::decode_attention(nullptr, attention_bytes, kv, tables, batch0, kBudget + kBuffer + kPrompt, stream);
  kc::evict_step(nullptr, evict_bytes, kp::score::RetentionDecay{}, evictor, shape, kv, tables, free, d_context, nullptr, status,
                 stream);
  void* ws_append = device<char>(append_bytes);
  void* ws_attention = device<char>(attention_bytes);
  void* ws_evict = device<char>(evict_bytes);

  // ---- the CPU reference ----
  kp::TrimKVCache<> cpu(shape, kp::memory::Paged<kPage>(kPages), evictor);
  for (int s = 0; s < kSeqs; ++s) cpu.add_sequence(s);

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> retention(-0.05f, 0.0f);
  double worst = 0.0;
  std::int64_t n = 0;
  for (std::int64_t step = 0; step <= kSteps; ++step) {
    const std::int64_t T = step == 0 ? kPrompt : 1;  // a prefill chunk, then decode
    const std::size_t per_layer = std::size_t(kSeqs) * kKv * T;
    std::vector<float> k(kLayers * per_layer * kDim), v(k.size()), lb(kLayers * per_layer);
    std::vector<std::int32_t> pos(lb.size());
    std::vector<float> q(std::size_t(kLayers) * kSeqs * kQ * kDim), device_out(q.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (auto& x : q) x = normal(rng);
    for (std::size_t i = 0; i < lb.size(); ++i) {
      lb[i] = retention(rng);
      pos[i] = static_cast<std::int32_t>(n + static_cast<std::int64_t>(i % T));
    }
    upload(d_keys, k, stream);
    upload(d_values, v, stream);
    upload(d_log_beta, lb, stream);
    upload(d_position, pos, stream);
    for (int l = 0; l < kLayers; ++l) {
      const std::size_t at = l * per_layer;
      kc::AppendRows<float> a{d_rows + std::size_t(l) * kSeqs * kKv, kSeqs * kKv, static_cast<std::int32_t>(T),
                              d_keys + at * kDim, d_values + at * kDim, d_position + at, d_log_beta + at};
      kc::append(ws_append, append_bytes, kv, tables, free, a, status, stream);
      if (T == 1) {  // decode attention of this layer over every sequence
        upload(d_queries, std::vector<float>(q.begin() + std::size_t(l) * kSeqs * kQ * kDim,
                                             q.begin() + std::size_t(l + 1) * kSeqs * kQ * kDim), stream);
        kc::DecodeBatch b = batch0;
        b.segment_base = d_bases + std::size_t(l) * kSeqs;
        kc::decode_attention(ws_attention, attention_bytes, kv, tables, b, kBudget + kBuffer + kPrompt, stream);
        const auto out = download(d_out, std::size_t(kSeqs) * kQ * kDim, stream);  // a check, not a real engine's step
        std::copy(out.begin(), out.end(), device_out.begin() + std::ptrdiff_t(l) * kSeqs * kQ * kDim);
      }
    }
    n += T;
    upload(d_context, std::vector<kp::StepContext>(kSeqs, kp::StepContext{n, 0, false, 0}), stream);
    kc::evict_step(ws_evict, evict_bytes, kp::score::RetentionDecay{}, evictor, shape, kv, tables, free, d_context, nullptr,
                   status, stream);

    // the CPU reference takes the same step; its decode attention is compared with the device's
    for (int s = 0; s < kSeqs; ++s) {
      std::vector<float> ks(std::size_t(kLayers) * kKv * T * kDim), vs(ks.size()), lbs(std::size_t(kLayers) * kKv * T);
      std::vector<float> qs(std::size_t(kLayers) * kQ * kDim), outs(qs.size());
      for (int l = 0; l < kLayers; ++l) {
        const std::size_t src = l * per_layer + std::size_t(s) * kKv * T;
        std::copy_n(&k[src * kDim], kKv * T * kDim, &ks[std::size_t(l) * kKv * T * kDim]);
        std::copy_n(&v[src * kDim], kKv * T * kDim, &vs[std::size_t(l) * kKv * T * kDim]);
        std::copy_n(&lb[src], kKv * T, &lbs[std::size_t(l) * kKv * T]);
        std::copy_n(&q[(std::size_t(l) * kSeqs + s) * kQ * kDim], kQ * kDim, &qs[std::size_t(l) * kQ * kDim]);
      }
      const kp::View<const float, 4> keys(ks.data(), {kLayers, kKv, T, kDim}), values(vs.data(), {kLayers, kKv, T, kDim});
      const kp::View<const float, 3> log_beta(lbs.data(), {kLayers, kKv, T});
      if (T > 1) {
        cpu.step(s, keys, values, log_beta);
        continue;
      }
      cpu.step(s, keys, values, log_beta, kp::View<const float, 4>(qs.data(), {kLayers, kQ, 1, kDim}),
               kp::View<float, 4>(outs.data(), {kLayers, kQ, 1, kDim}));
      for (int l = 0; l < kLayers; ++l) {
        double num = 0.0, den = 0.0;
        for (int i = 0; i < kQ * kDim; ++i) {
          const double d = device_out[(std::size_t(l) * kSeqs + s) * kQ * kDim + i] - outs[std::size_t(l) * kQ * kDim + i];
          num += d * d;
          den += double(outs[std::size_t(l) * kQ * kDim + i]) * outs[std::size_t(l) * kQ * kDim + i];
        }
        worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
      }
    }
  }

  // ---- checks: status, survivors, pages ----
  const kc::Status st = download(status, 1, stream)[0];
  if (st.code != kc::Status::ok) {
    std::printf("engine_cuda: device status %d (segment %d, needed %lld, available %lld)\n", st.code, st.segment,
                static_cast<long long>(st.needed), static_cast<long long>(st.available));
    return 1;
  }
  const auto length = download(tables.length, kSegments, stream);
  const auto table = download(tables.table, std::size_t(kSegments) * kMaxPages, stream);
  const auto position = download(kv.position, std::size_t(kPages) * kPage, stream);
  const auto free_count = download(free.count, 1, stream)[0];
  bool ok = free_count == cpu.allocator().pages_free() && worst <= 1e-5;
  std::printf("engine_cuda: decode attention, worst |out - cpu| / |cpu| = %.3g (limit 1e-5)\n", worst);
  if (!ok) std::printf("engine_cuda: %d free pages on the device, %lld on the CPU\n", free_count,
                       static_cast<long long>(cpu.allocator().pages_free()));
  for (int s = 0; s < kSeqs; ++s)
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKv; ++h) {
        const int seg = (s * kLayers + l) * kKv + h;
        std::vector<std::int32_t> got, want;
        for (std::int64_t i = 0; i < length[seg]; ++i)
          got.push_back(position[std::int64_t{table[std::size_t(seg) * kMaxPages + i / kPage]} * kPage + i % kPage]);
        for (std::int64_t i = 0; i < cpu.length(s, l, h); ++i) want.push_back(cpu.entry(s, l, h, i).position);
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        if (got != want || length[seg] > kBudget + kBuffer - 1) {
          std::printf("engine_cuda: sequence %d layer %d head %d: device keeps %zu entries, the CPU %zu\n", s, l, h,
                      got.size(), want.size());
          ok = false;
        }
      }
  std::printf("engine_cuda: %lld steps, %d sequences: %s; %d pages free\n", static_cast<long long>(kSteps), kSeqs,
              ok ? "device and CPU keep the same entries" : "MISMATCH", free_count);
  return ok ? 0 : 1;
}
