// A llama.cpp-style CPU engine on kvpolicy (docs/integration.md, part b): one sequence, a
// contiguous KV buffer per (layer, kv head), and a forward pass that walks the layers in order. At
// each layer the engine has the hidden state x [T, D] and the post-RoPE K/V and queries; the
// retention gate turns x into log_beta; then append -> attend for that layer; after the last layer,
// commit() runs the trigger and the eviction (never between layers). The gate's weights come from a
// safetensors file under the SPEC tensor names (here written first, standing in for a converted
// checkpoint, kvpolicy-convert-checkpoint). Exit status 0 when every check holds.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <kvpolicy/gate/retention_gate.hpp>
#include <kvpolicy/trimkv.hpp>

using namespace kvpolicy;

namespace {

const CacheShape kShape{2, 2, 4, 16};
constexpr int kHidden = 32, kInner = 16;
constexpr std::int64_t kBudget = 48, kBuffer = 8;

// The toy "model": fixed random projections from x to K, V and queries per layer.
struct Layer {
  std::vector<float> wk, wv, wq;  // [Hkv*d, D], [Hkv*d, D], [Hq*d, D]
};

void project(const std::vector<float>& w, const std::vector<float>& x, std::int64_t T, int heads,
             std::vector<float>& out) {  // out [heads, T, d]
  const int d = kShape.head_dim;
  out.assign(static_cast<std::size_t>(heads * T * d), 0.0f);
  for (int h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < T; ++t)
      for (int c = 0; c < d; ++c) {
        float acc = 0;
        for (int i = 0; i < kHidden; ++i) acc += w[static_cast<std::size_t>((h * d + c) * kHidden + i)] * x[static_cast<std::size_t>(t * kHidden + i)];
        out[static_cast<std::size_t>((h * T + t) * d + c)] = acc;
      }
}

}  // namespace

int main() {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  auto random = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& e : v) e = normal(rng);
    return v;
  };

  // The gate checkpoint, as kvpolicy-convert-checkpoint writes it (an engine reads it with
  // safetensors::File::read(path); here the bytes stay in memory).
  safetensors::Writer w;
  for (int l = 0; l < kShape.layers; ++l) {
    const auto p = gate::RetentionGate::prefix(l);
    w.add_f32(p + "linear1.weight", {kInner, kHidden}, random(kInner * kHidden));
    w.add_f32(p + "linear1.bias", {kInner}, random(kInner));
    w.add_f32(p + "linear2.weight", {kShape.kv_heads, kInner}, random(kShape.kv_heads * kInner));
    w.add_f32(p + "bias", {kShape.kv_heads}, std::vector<float>(static_cast<std::size_t>(kShape.kv_heads), 3.0f));
  }
  const auto gate = gate::RetentionGate::load(safetensors::File::parse(w.bytes(), "gate.safetensors"),
                                              {kShape.layers, kHidden, kShape.kv_heads, kInner, gate::Activation::silu});

  std::vector<Layer> model;
  for (int l = 0; l < kShape.layers; ++l)
    model.push_back({random(kShape.kv_heads * kShape.head_dim * kHidden), random(kShape.kv_heads * kShape.head_dim * kHidden),
                     random(kShape.q_heads * kShape.head_dim * kHidden)});

  // llama.cpp keeps one contiguous KV buffer per sequence: capacity M + B - 1 plus the prompt chunk.
  const std::int64_t prompt = 100;
  Cache<score::RetentionDecay, admit::All, evict::PerHead<trigger::Buffered>, memory::Contiguous<float>, cpu_backend>
      cache(kShape, memory::Contiguous<float>(kBudget + kBuffer - 1 + prompt, 1), trimkv_evictor({.budget = kBudget, .buffer = kBuffer}));
  cache.add_sequence(0);

  std::vector<float> k, v, q, out, log_beta;
  std::int64_t evictions = 0;
  for (std::int64_t pos = 0; pos < 400;) {
    const std::int64_t T = pos == 0 ? prompt : 1;  // the prompt as one chunk, then one token per step
    std::vector<float> x = random(static_cast<std::size_t>(T * kHidden));
    for (int l = 0; l < kShape.layers; ++l) {  // the forward pass, layer by layer
      project(model[static_cast<std::size_t>(l)].wk, x, T, kShape.kv_heads, k);
      project(model[static_cast<std::size_t>(l)].wv, x, T, kShape.kv_heads, v);
      project(model[static_cast<std::size_t>(l)].wq, x, T, kShape.q_heads, q);
      log_beta.assign(static_cast<std::size_t>(kShape.kv_heads * T), 0.0f);
      gate.forward(l, View<const float, 2>(x.data(), {T, kHidden}), View<float, 2>(log_beta.data(), {kShape.kv_heads, T}));
      cache.append(0, l, View<const float, 3>(k.data(), {kShape.kv_heads, T, kShape.head_dim}),
                   View<const float, 3>(v.data(), {kShape.kv_heads, T, kShape.head_dim}),
                   View<const float, 2>(log_beta.data(), {kShape.kv_heads, T}));
      out.assign(q.size(), std::nanf(""));
      cache.attend(0, l, View<const float, 3>(q.data(), {kShape.q_heads, T, kShape.head_dim}),
                   View<float, 3>(out.data(), {kShape.q_heads, T, kShape.head_dim}));
      for (float e : out)
        if (!std::isfinite(e)) {
          std::fprintf(stderr, "engine_layered: attention output not written at layer %d\n", l);
          return 1;
        }
      // the next layer's input: a residual update from this layer's output (toy)
      for (std::int64_t t = 0; t < T; ++t)
        for (int i = 0; i < kHidden; ++i)
          x[static_cast<std::size_t>(t * kHidden + i)] += 0.1f * out[static_cast<std::size_t>(t * kShape.head_dim + i % kShape.head_dim)];
    }
    evictions += cache.commit(0).triggered;  // after the last layer: trigger and evict
    pos += T;
    for (int l = 0; l < kShape.layers; ++l)
      for (int h = 0; h < kShape.kv_heads; ++h)
        if (cache.length(0, l, h) > kBudget + kBuffer - 1) {  // SPEC §1, after every step (the prompt too)
          std::fprintf(stderr, "engine_layered: head (%d, %d) holds %lld entries\n", l, h,
                       static_cast<long long>(cache.length(0, l, h)));
          return 1;
        }
  }
  std::printf("engine_layered: %lld tokens, %lld evictions, %lld of %lld entries kept\n",
              static_cast<long long>(cache.tokens(0)), static_cast<long long>(evictions),
              static_cast<long long>(cache.total_length(0)), static_cast<long long>(cache.tokens(0) * kShape.heads_total()));
  return cache.tokens(0) == 400 && evictions > 0 ? 0 : 1;
}
