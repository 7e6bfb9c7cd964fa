// Conan test_package: a TRIM-KV cache through the packaged headers; with the cpu component, a
// retention gate loaded from an in-memory safetensors image computes the log_beta it appends.
#include <cstdio>
#include <vector>

#include <kvpolicy/trimkv.hpp>
#ifdef KVPOLICY_WITH_CPU
#include <kvpolicy/gate/retention_gate.hpp>
#endif

int main() {
  using namespace kvpolicy;
  const CacheShape shape{1, 1, 2, 4};
  TrimKVCache<> cache(shape, memory::Paged<16>(4), trimkv_evictor({.budget = 4, .buffer = 2}));
  cache.add_sequence(0);
  std::vector<float> k(4, 0.5f), v(4, 1.0f), q(8, 0.25f), out(8), lb{-0.1f};
#ifdef KVPOLICY_WITH_CPU
  safetensors::Writer w;
  const std::string p = gate::RetentionGate::prefix(0);
  w.add_f32(p + "linear1.weight", {2, 3}, std::vector<float>{0.1f, 0.2f, 0.3f, -0.1f, -0.2f, -0.3f});
  w.add_f32(p + "linear1.bias", {2}, std::vector<float>{0.0f, 0.1f});
  w.add_f32(p + "linear2.weight", {1, 2}, std::vector<float>{0.5f, -0.5f});
  w.add_f32(p + "bias", {1}, std::vector<float>{2.0f});
  const auto g = gate::RetentionGate::load(safetensors::File::parse(w.bytes()), {1, 3, 1, 2});
  const std::vector<float> x{1.0f, 2.0f, 3.0f};
  g.forward(0, View<const float, 2>(x.data(), {1, 3}), View<float, 2>(lb.data(), {1, 1}));
#endif
  for (int step = 0; step < 10; ++step)
    cache.step(0, View<const float, 4>(k.data(), {1, 1, 1, 4}), View<const float, 4>(v.data(), {1, 1, 1, 4}),
               View<const float, 3>(lb.data(), {1, 1, 1}), View<const float, 4>(q.data(), {1, 2, 1, 4}),
               View<float, 4>(out.data(), {1, 2, 1, 4}));
  std::printf("kvpolicy test_package: %lld entries kept of 10, log_beta %.4f, out[0] %.3f\n",
              static_cast<long long>(cache.length(0, 0, 0)), lb[0], out[0]);
  return cache.length(0, 0, 0) <= 5 && out[0] > 0.999f && out[0] < 1.001f ? 0 : 1;
}
