// Built against the installed tree: the presets, a gate and the safetensors reader must all work.
#include <kvpolicy/dbtrimkv.hpp>
#include <kvpolicy/gate/retention_gate.hpp>
#include <kvpolicy/trimkv.hpp>

#include <cstdio>
#include <vector>

int main() {
  using namespace kvpolicy;
  const CacheShape shape{1, 1, 2, 4};
  TrimKVCache<> cache(shape, memory::Paged<16>(8), trimkv_evictor({.budget = 4, .buffer = 2}));
  cache.add_sequence(0);
  std::vector<float> kv(4, 0.5f), lb{-0.1f}, q(8, 1.0f), out(8);
  for (int step = 0; step < 20; ++step)
    cache.step(0, View<const float, 4>(kv.data(), {1, 1, 1, 4}), View<const float, 4>(kv.data(), {1, 1, 1, 4}),
               View<const float, 3>(lb.data(), {1, 1, 1}), View<const float, 4>(q.data(), {1, 2, 1, 4}),
               View<float, 4>(out.data(), {1, 2, 1, 4}));
  safetensors::Writer w;
  w.add_f32("x", {1}, std::vector<float>{1.0f});
  const auto f = safetensors::File::parse(w.bytes());
  std::printf("consumer: %lld entries, out[0] = %g, x = %g\n", static_cast<long long>(cache.length(0, 0, 0)), out[0],
              f.floats("x")[0]);
  return cache.length(0, 0, 0) <= 5 && out[0] == 0.5f ? 0 : 1;
}
