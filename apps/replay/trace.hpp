// A recorded (or synthetic) decode trace for kvpolicy-replay — the file format is docs/replay.md:
//   log_beta [L, Hkv, T] (required), keys/values [L, Hkv, T, d] and queries [L, Hq, T, d] (optional),
//   hidden_states [L', T, D] (optional: the model's hidden states in HF output_hidden_states indexing,
//   for EpiKV and HS-var, SPEC §4), write_gate [L, Hkv, T] (optional: recorded WG-KV gate values g,
//   SPEC §3) or keys_pre_rope [L, Hkv, T, d] (optional, with keys: the gate's input, for --gate),
//   gate_input [L, T, D] (optional: each layer's attention input after its input RMSNorm, the input
//   of TRIM-KV's and DBTrimKV's retention gates, for --gate with trimkv and dbtrimkv).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/gate/safetensors.hpp"

namespace kvpolicy::replay {

struct Trace {
  int layers = 0, kv_heads = 0, q_heads = 0, head_dim = 0;
  std::int64_t tokens = 0;
  std::vector<float> log_beta;               // [L, Hkv, T]
  std::vector<float> keys, values, queries;  // empty unless has_attention()
  int hidden_layers = 0, hidden_size = 0;    // L' and D of hidden_states
  std::vector<float> hidden;                 // [L', T, D], empty unless has_hidden()
  std::vector<float> write_gate;             // [L, Hkv, T] or empty
  std::vector<float> keys_pre_rope;          // [L, Hkv, T, d] or empty
  int gate_input_size = 0;                   // D of gate_input
  std::vector<float> gate_input;             // [L, T, D] or empty

  bool has_attention() const { return !queries.empty(); }
  bool has_hidden() const { return !hidden.empty(); }
  CacheShape shape() const { return {layers, kv_heads, q_heads, head_dim}; }
  float lb(int l, int h, std::int64_t t) const { return log_beta[static_cast<std::size_t>((l * kv_heads + h) * tokens + t)]; }
};

// A trace from a parsed safetensors file; every shape is checked, errors name `f.source()`.
inline Trace parse_trace(const safetensors::File& f) {
  const std::string& path = f.source();
  Trace tr;
  const auto& lb = f.info("log_beta");
  require(lb.shape.size() == 3 && lb.shape[0] >= 1 && lb.shape[1] >= 1 && lb.shape[2] >= 1, "trace '", path,
          "': log_beta has shape ", safetensors::shape_string(lb.shape), ", expected [L, Hkv, T] with every extent >= 1");
  for (auto e : lb.shape)
    require(e <= std::int64_t{INT32_MAX}, "trace '", path, "': log_beta extent ", e, " exceeds 2^31 - 1");
  tr.layers = static_cast<int>(lb.shape[0]);
  tr.kv_heads = static_cast<int>(lb.shape[1]);
  tr.tokens = lb.shape[2];
  tr.log_beta = f.floats("log_beta");
  if (f.contains("hidden_states")) {
    const auto& hi = f.info("hidden_states");
    require(hi.shape.size() == 3 && hi.shape[0] >= 1 && hi.shape[0] <= 4096 && hi.shape[1] == tr.tokens &&
                hi.shape[2] >= 1 && hi.shape[2] <= std::int64_t{INT32_MAX},
            "trace '", path, "': hidden_states has shape ", safetensors::shape_string(hi.shape),
            ", expected [L', T = ", tr.tokens, ", D] with 1 <= L' <= 4096");
    tr.hidden_layers = static_cast<int>(hi.shape[0]);
    tr.hidden_size = static_cast<int>(hi.shape[2]);
    tr.hidden = f.floats("hidden_states", {tr.hidden_layers, tr.tokens, tr.hidden_size});
  }
  if (f.contains("gate_input")) {
    const auto& gi = f.info("gate_input");
    require(gi.shape.size() == 3 && gi.shape[0] == tr.layers && gi.shape[1] == tr.tokens && gi.shape[2] >= 1 &&
                gi.shape[2] <= std::int64_t{INT32_MAX},
            "trace '", path, "': gate_input has shape ", safetensors::shape_string(gi.shape), ", expected [L = ", tr.layers,
            ", T = ", tr.tokens, ", D]");
    tr.gate_input_size = static_cast<int>(gi.shape[2]);
    tr.gate_input = f.floats("gate_input", {tr.layers, tr.tokens, tr.gate_input_size}, /*finite=*/true);
  }
  if (f.contains("write_gate")) {
    tr.write_gate = f.floats("write_gate", {tr.layers, tr.kv_heads, tr.tokens}, /*finite=*/true);
    for (const float g : tr.write_gate)
      require(g >= 0.0f && g <= 1.0f, "trace '", path, "': write_gate holds ", g, ", outside [0, 1]");
  }
  const bool k = f.contains("keys"), v = f.contains("values"), q = f.contains("queries");
  require(k == v && v == q, "trace '", path, "': keys, values and queries come together (found keys: ", k,
          ", values: ", v, ", queries: ", q, ")");
  if (!k) return tr;
  const auto& ki = f.info("keys");
  require(ki.shape.size() == 4 && ki.shape[3] >= 1 && ki.shape[3] <= std::int64_t{INT32_MAX}, "trace '", path, "': keys has shape ",
          safetensors::shape_string(ki.shape), ", expected [L, Hkv, T, d]");
  tr.head_dim = static_cast<int>(ki.shape[3]);
  const auto& vi = f.info("values");
  const auto& qi = f.info("queries");
  // d is every head's width: say which tensor disagrees, not only the one read second
  const auto last = [](const safetensors::TensorInfo& t) { return t.shape.empty() ? std::int64_t{-1} : t.shape.back(); };
  require(last(vi) == tr.head_dim && last(qi) == tr.head_dim, "trace '", path,
          "': keys, values and queries disagree on the head width d: keys ", safetensors::shape_string(ki.shape),
          ", values ", safetensors::shape_string(vi.shape), ", queries ", safetensors::shape_string(qi.shape));
  require(qi.shape.size() == 4 && qi.shape[1] >= tr.kv_heads && qi.shape[1] % tr.kv_heads == 0 &&
              qi.shape[1] <= std::int64_t{INT32_MAX}, "trace '", path,
          "': queries has shape ", safetensors::shape_string(qi.shape), ", expected [L, Hq, T, d] with Hq a multiple of Hkv = ",
          tr.kv_heads);
  tr.q_heads = static_cast<int>(qi.shape[1]);
  tr.keys = f.floats("keys", {tr.layers, tr.kv_heads, tr.tokens, tr.head_dim});
  tr.values = f.floats("values", {tr.layers, tr.kv_heads, tr.tokens, tr.head_dim});
  tr.queries = f.floats("queries", {tr.layers, tr.q_heads, tr.tokens, tr.head_dim});
  if (f.contains("keys_pre_rope"))
    tr.keys_pre_rope = f.floats("keys_pre_rope", {tr.layers, tr.kv_heads, tr.tokens, tr.head_dim}, /*finite=*/true);
  return tr;
}

inline Trace read_trace(const std::string& path) { return parse_trace(safetensors::File::read(path)); }

inline void write_trace(const Trace& tr, const std::string& path) {
  safetensors::Writer w;
  w.add_f32("log_beta", {tr.layers, tr.kv_heads, tr.tokens}, tr.log_beta);
  if (tr.has_attention()) {
    w.add_f32("keys", {tr.layers, tr.kv_heads, tr.tokens, tr.head_dim}, tr.keys);
    w.add_f32("values", {tr.layers, tr.kv_heads, tr.tokens, tr.head_dim}, tr.values);
    w.add_f32("queries", {tr.layers, tr.q_heads, tr.tokens, tr.head_dim}, tr.queries);
  }
  if (tr.has_hidden()) w.add_f32("hidden_states", {tr.hidden_layers, tr.tokens, tr.hidden_size}, tr.hidden);
  if (!tr.write_gate.empty()) w.add_f32("write_gate", {tr.layers, tr.kv_heads, tr.tokens}, tr.write_gate);
  if (!tr.gate_input.empty()) w.add_f32("gate_input", {tr.layers, tr.tokens, tr.gate_input_size}, tr.gate_input);
  if (!tr.keys_pre_rope.empty())
    w.add_f32("keys_pre_rope", {tr.layers, tr.kv_heads, tr.tokens, tr.head_dim}, tr.keys_pre_rope);
  w.write(path);
}

// The demo's deterministic synthetic trace: three kinds of heads, as the TRIM-KV paper (Fig. 4)
// finds them in trained models —
//   kind 0, sinks: the first 4 tokens never decay (log_beta = 0), the rest decay fast;
//   kind 1, sliding window: near-uniform retention, so the newest tokens win;
//   kind 2, gist: sparse "period" tokens retain (log_beta ~ -1e-4), the rest decay.
// Queries attend to what each kind keeps (sinks, recent tokens, earlier gist tokens), so a policy
// that keeps the right tokens has a small attention error.
// Hidden states [L + 1, T, 32] (drawn after everything else, from their own generator): a slow
// random walk in every layer, with a jump at layer 2 on each token that some gist
// head retains — the "epiphany" EpiKV's score looks for (SPEC §4); use --band-a 2 --band-b 4.
// A write gate [L, Hkv, T] as a trained WG-KV gate would open it (SPEC §3): 0.9 on the tokens a head
// retains (sinks and gist tokens, log_beta > -1e-3), 0.05 elsewhere.
inline Trace synthetic_trace(int layers = 4, int kv_heads = 2, int group = 4, int head_dim = 64, std::int64_t tokens = 1536,
                             std::uint64_t seed = 2026) {
  Trace tr;
  tr.layers = layers;
  tr.kv_heads = kv_heads;
  tr.q_heads = kv_heads * group;
  tr.head_dim = head_dim;
  tr.tokens = tokens;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const auto T = tokens, d = std::int64_t{head_dim};
  tr.log_beta.resize(static_cast<std::size_t>(layers * kv_heads * T));
  tr.keys.resize(static_cast<std::size_t>(layers * kv_heads * T * d));
  tr.values.resize(tr.keys.size());
  tr.queries.resize(static_cast<std::size_t>(layers * tr.q_heads * T * d));
  for (auto& x : tr.keys) x = normal(rng);
  for (auto& x : tr.values) x = normal(rng);
  const float aim = 1.5f;  // how strongly a query points at its target key (logit ~ aim * d / sqrt(d))
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < kv_heads; ++h) {
      const int kind = (l * kv_heads + h) % 3;
      std::vector<std::int64_t> gists;
      for (std::int64_t t = 0; t < T; ++t) {
        float lb = 0.0f;
        const bool gist = kind == 2 && uniform(rng) < 1.0f / 16;
        if (kind == 0) lb = t < 4 ? 0.0f : -0.05f - 0.02f * uniform(rng);
        if (kind == 1) lb = -0.01f - 0.002f * uniform(rng);
        if (kind == 2) lb = gist ? -1e-4f * uniform(rng) : -0.03f - 0.02f * uniform(rng);
        tr.log_beta[static_cast<std::size_t>((l * kv_heads + h) * T + t)] = lb;
        if (gist) gists.push_back(t);
        for (int g = 0; g < group; ++g) {
          std::int64_t target = t;
          if (kind == 0) target = std::uniform_int_distribution<std::int64_t>(0, std::min<std::int64_t>(3, t))(rng);
          if (kind == 1) target = std::max<std::int64_t>(0, t - std::uniform_int_distribution<std::int64_t>(0, 24)(rng));
          if (kind == 2 && !gists.empty())
            target = gists[std::uniform_int_distribution<std::size_t>(0, gists.size() - 1)(rng)];
          const int qh = h * group + g;
          float* q = &tr.queries[static_cast<std::size_t>(((l * tr.q_heads + qh) * T + t) * d)];
          const float* k = &tr.keys[static_cast<std::size_t>(((l * kv_heads + h) * T + target) * d)];
          for (std::int64_t c = 0; c < d; ++c) q[c] = aim * k[c] + 0.5f * normal(rng);
        }
      }
    }
  tr.write_gate.resize(tr.log_beta.size());
  for (std::size_t i = 0; i < tr.log_beta.size(); ++i) tr.write_gate[i] = tr.log_beta[i] > -1e-3f ? 0.9f : 0.05f;
  // hidden states: every gist token of any head is an epiphany at the band layer
  std::vector<std::uint8_t> epiphany(static_cast<std::size_t>(T), 0);
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < kv_heads; ++h)
      if ((l * kv_heads + h) % 3 == 2)
        for (std::int64_t t = 0; t < T; ++t)
          epiphany[static_cast<std::size_t>(t)] |= tr.log_beta[static_cast<std::size_t>((l * kv_heads + h) * T + t)] > -1e-3f;
  std::mt19937_64 hidden_rng(seed + 1);
  std::normal_distribution<float> hidden_normal;
  constexpr int kHidden = 32, kBand = 2;
  tr.hidden_layers = layers + 1;
  tr.hidden_size = kHidden;
  tr.hidden.resize(static_cast<std::size_t>(tr.hidden_layers * T * kHidden));
  for (int l = 0; l < tr.hidden_layers; ++l) {
    std::vector<float> h(kHidden, 0.0f);
    for (std::int64_t t = 0; t < T; ++t) {
      const float jump = l == kBand && epiphany[static_cast<std::size_t>(t)] ? 3.0f : 0.0f;
      for (int c = 0; c < kHidden; ++c) {
        h[static_cast<std::size_t>(c)] += 0.1f * hidden_normal(hidden_rng) + jump * hidden_normal(hidden_rng);
        tr.hidden[static_cast<std::size_t>((l * T + t) * kHidden + c)] = h[static_cast<std::size_t>(c)];
      }
    }
  }
  return tr;
}

}  // namespace kvpolicy::replay
