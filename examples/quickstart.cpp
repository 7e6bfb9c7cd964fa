// The README's quick start: a TRIM-KV cache in a decode loop.
// Your model supplies, per layer and token, post-RoPE keys/values, queries and log_beta from its
// retention gate (kvpolicy/gate/retention_gate.hpp); here they are random.
#include <kvpolicy/trimkv.hpp>

#include <cstdio>
#include <random>
#include <vector>

int main() {
  using namespace kvpolicy;
  const CacheShape shape{.layers = 2, .kv_heads = 2, .q_heads = 8, .head_dim = 64};
  const TrimKVConfig config{.budget = 256, .buffer = 32};  // keep 256 tokens per (layer, kv head)

  // A paged pool of 16-entry pages with room for one sequence whose steps append up to 64 tokens
  // (a prefill chunk): every head at its peak M + B - 1 + 64. Pool::bytes_for(shape, pages) says
  // what that costs in host memory.
  using Pool = memory::Paged<16>;
  TrimKVCache<> cache(shape, Pool(trimkv_pages<Pool>(shape, config, /*sequences=*/1, /*largest_chunk=*/64)),
                      trimkv_evictor(config));
  cache.add_sequence(0);

  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  const int L = shape.layers, H = shape.kv_heads, Hq = shape.q_heads, d = shape.head_dim;
  std::vector<float> k(L * H * d), v(L * H * d), q(L * Hq * d), out(L * Hq * d), log_beta(L * H);
  for (int step = 0; step < 2000; ++step) {
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (auto& x : q) x = normal(rng);
    for (auto& x : log_beta) x = -0.01f * std::abs(normal(rng));  // log of the retention beta in (0, 1]
    // append K/V/log_beta to every layer, attend over the cache, then evict if a head reached M + B
    cache.step(0, View<const float, 4>(k.data(), {L, H, 1, d}), View<const float, 4>(v.data(), {L, H, 1, d}),
               View<const float, 3>(log_beta.data(), {L, H, 1}), View<const float, 4>(q.data(), {L, Hq, 1, d}),
               View<float, 4>(out.data(), {L, Hq, 1, d}));
  }
  std::printf("decoded %lld tokens; layer 0 head 0 holds %lld entries (budget %lld + buffer %lld)\n",
              static_cast<long long>(cache.tokens(0)), static_cast<long long>(cache.length(0, 0, 0)),
              static_cast<long long>(config.budget), static_cast<long long>(config.buffer));
  return cache.length(0, 0, 0) < config.budget + config.buffer ? 0 : 1;
}
