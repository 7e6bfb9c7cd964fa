// Built against the installed tree: the presets, a gate and the safetensors reader must all work.
#include <kvpolicy/dbtrimkv.hpp>
#include <kvpolicy/gate/retention_gate.hpp>
#include <kvpolicy/registry.hpp>
#include <kvpolicy/trimkv.hpp>

#include <cmath>
#include <cstdio>
#include <string>
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
  // a retention gate from safetensors: W1 = 0, b1 = 0 -> u = silu(0) = 0; z = b = 0 -> log(1/2)
  safetensors::Writer w;
  const std::string p = gate::RetentionGate::prefix(0);
  w.add_f32(p + "linear1.weight", {2, 3}, std::vector<float>(6, 0.0f));
  w.add_f32(p + "linear1.bias", {2}, std::vector<float>(2, 0.0f));
  w.add_f32(p + "linear2.weight", {1, 2}, std::vector<float>(2, 1.0f));
  w.add_f32(p + "bias", {1}, std::vector<float>{0.0f});
  const auto g = gate::RetentionGate::load(safetensors::File::parse(w.bytes()), {1, 3, 1, 2});
  std::vector<float> x(3, 1.0f);
  float log_beta = 0.0f;
  g.forward(0, View<const float, 2>(x.data(), {1, 3}), View<float, 2>(&log_beta, {1, 1}));
  // a policy by name from the installed registry (its list is written at install)
  const auto held = registry::visit("streamingllm", [&]<registry::Policy P>() {
    return P::template make<cpu_backend>(registry::values<P>({{"budget", "3"}, {"buffer", "1"}, {"sinks", "1"}}), shape,
                                         memory::Paged<16>(8), [&](auto& c) {
                                           c.add_sequence(0);
                                           for (int step = 0; step < 6; ++step)
                                             c.step(0, View<const float, 4>(kv.data(), {1, 1, 1, 4}),
                                                    View<const float, 4>(kv.data(), {1, 1, 1, 4}),
                                                    View<const float, 3>(lb.data(), {1, 1, 1}));
                                           return c.length(0, 0, 0);
                                         });
  });
  std::printf("consumer: %lld entries, out[0] = %g, log_beta = %g, %zu policies, streamingllm held %lld\n",
              static_cast<long long>(cache.length(0, 0, 0)), out[0], log_beta, registry::names().size(),
              static_cast<long long>(held));
  return cache.length(0, 0, 0) <= 5 && out[0] == 0.5f && std::fabs(log_beta + 0.6931472f) < 1e-6f && held == 3 ? 0 : 1;
}
