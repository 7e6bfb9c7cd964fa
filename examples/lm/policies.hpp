// kvpolicy-lm's policies by name: each name makes its kvpolicy Cache (one pool for every sequence)
// and the metadata its entries need from the forward pass, then hands both to the caller.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "decoder.hpp"
#include "kvpolicy/baselines.hpp"
#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/epikv.hpp"
#include "kvpolicy/gate/retention_gate.hpp"
#include "kvpolicy/gate/rg10_gate.hpp"
#include "kvpolicy/gate/tied_gate.hpp"
#include "kvpolicy/gate/write_gate.hpp"
#include "kvpolicy/policy/kv_statistics.hpp"
#include "kvpolicy/trimkv.hpp"
#include "kvpolicy/wgkv.hpp"

namespace kvpolicy::lm {

struct PolicyOptions {
  std::string name = "full";
  std::int64_t budget = 256;   // M per (layer, kv head); K for the EpiKV family
  std::int64_t buffer = 16;    // B
  std::int64_t sinks = -1;     // S protected oldest entries per head; -1 = SPEC §5's default (4 for streamingllm, else 0)
  std::int64_t window = 0;     // w protected newest entries per head, every policy (h2o: 0 = M/2; snapkv: W_obs, 0 = min(32, M))
  std::int64_t recency = -1;   // R (EpiKV family)
  int band_a = 10, band_b = 21;  // epikv, hs-var: hidden-state bands A and B (SPEC §4's defaults)
  std::uint64_t seed = 0;      // random
  std::string gate;            // trimkv, dbtrimkv, wgkv: the gate's safetensors file
  std::int64_t local = 256;    // W_local (wgkv)
  double tau = 0.1;            // wgkv
};

inline const std::vector<std::string>& policy_names() {
  static const std::vector<std::string> names{"full",   "streamingllm", "h2o",    "snapkv", "knorm",    "keydiff", "random",
                                              "kv-key", "kv-val",       "lag-kv", "epikv",  "hs-var",   "trimkv",  "dbtrimkv", "wgkv"};
  return names;
}

/// The gate-free policies (every one but the learned gates'), the quality table's rows.
inline const std::vector<std::string>& gate_free_policies() {
  static const std::vector<std::string> names{"streamingllm", "h2o", "snapkv", "knorm", "keydiff", "random",
                                              "kv-key", "kv-val", "lag-kv", "epikv", "hs-var"};
  return names;
}

namespace detail {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace detail

/// Makes the Cache `o` names for `sequences` sequences of up to `max_tokens` tokens each (steps of
/// up to `chunk` tokens), and calls f(cache, metadata). The pool holds every token in every head:
/// the policy, not the pool, bounds what stays (docs/quality.md reports the entries held).
template <class F>
decltype(auto) with_policy(const PolicyOptions& o, const Config& c, std::int64_t sequences, std::int64_t max_tokens, F&& f) {
  const CacheShape shape = c.cache_shape();
  const std::int64_t pages = pages_for(shape, max_tokens + 16, sequences, 16);
  memory::Paged<16> pool(pages);
  require(o.budget >= 1, "kvpolicy-lm: --budget ", o.budget, " must be >= 1");
  require(o.buffer >= 1, "kvpolicy-lm: --buffer ", o.buffer, " must be >= 1");
  const bool gated = o.name == "trimkv" || o.name == "dbtrimkv" || o.name == "wgkv";
  require(!gated || !o.gate.empty(), "kvpolicy-lm: policy ", o.name,
          " needs its trained gate: --gate FILE (a safetensors file under SPEC's tensor names)");
  require(gated || o.gate.empty(), "kvpolicy-lm: --gate applies to trimkv, dbtrimkv and wgkv, not to ", o.name);
  const EntryMetadata none;
  const std::int64_t sinks = o.sinks >= 0 ? o.sinks : o.name == "streamingllm" ? 4 : 0;
  // SPEC §5: every evictor protects the S oldest and the w newest entries of each head
  require(sinks >= 0 && o.window >= 0, "kvpolicy-lm: --sinks ", sinks, " and --window ", o.window, " must be >= 0");
  require(o.name != "wgkv" || o.window == 0, "kvpolicy-lm: wgkv's protected window is its ring: set --local, not --window");
  const BaselineConfig base{o.budget, o.buffer, sinks, o.window};
  if (o.name == "full") {  // never evicts: the budget is past any sequence
    StreamingLLMCache<> cache(shape, std::move(pool), baseline_evictor({std::numeric_limits<std::int32_t>::max() - 1, 1}),
                              score::Recency{0});
    return f(cache, none);
  }
  if (o.name == "streamingllm") {
    // the sinks rank first by the score itself (SPEC §5 StreamingLLM)
    StreamingLLMCache<> cache(shape, std::move(pool), baseline_evictor({o.budget, o.buffer, 0, o.window}),
                              score::Recency{sinks});
    return f(cache, none);
  }
  if (o.name == "h2o") {
    H2OCache<> cache(shape, std::move(pool), h2o_evictor(base));
    return f(cache, none);
  }
  if (o.name == "snapkv") {  // compresses the prompt (add_sequence's prompt_tokens) to M per head once
    SnapKVConfig s;  // SPEC §5's defaults: avg-pool 5, GQA mean
    s.budget = o.budget;
    s.window = o.window > 0 ? o.window : std::min<std::int64_t>(32, o.budget);
    s.sinks = sinks;
    SnapKVCache<> cache(shape, std::move(pool), snapkv_evictor(s), snapkv_scorer(s));
    return f(cache, none);
  }
  if (o.name == "knorm") {
    KNormCache<> cache(shape, std::move(pool), baseline_evictor(base));
    return f(cache, none);
  }
  if (o.name == "keydiff") {
    KeyDiffCache<> cache(shape, std::move(pool), baseline_evictor(base));
    return f(cache, none);
  }
  if (o.name == "random") {
    RandomCache<> cache(shape, std::move(pool), baseline_evictor(base), score::SeededRandom{o.seed});
    return f(cache, none);
  }
  if (o.name == "kv-key" || o.name == "kv-val" || o.name == "lag-kv") {  // SPEC §4: K/V statistics per head
    const auto stat = o.name == "kv-key"   ? kvstats::Statistic::key
                      : o.name == "kv-val" ? kvstats::Statistic::value
                                           : kvstats::Statistic::lag;
    // one tracker per sequence: the statistics follow each sequence's own tokens
    auto trackers = std::make_shared<std::map<std::int64_t, kvstats::Tracker>>();
    const LayerMetadata scores = [trackers, shape, stat](std::int64_t seq, int l, const Matrix&, const std::vector<float>&,
                                                         const std::vector<float>& k, const std::vector<float>& v,
                                                         std::int64_t T, float* out) {
      auto it = trackers->try_emplace(seq, shape, kvstats::Config{stat, 64}).first;
      it->second.push(l, View<const float, 3>(k.data(), {shape.kv_heads, T, shape.head_dim}),
                    View<const float, 3>(v.data(), {shape.kv_heads, T, shape.head_dim}),
                    View<float, 2>(out, {shape.kv_heads, T}));
    };
    EpiKVCache<> cache(shape, std::move(pool), epikv_evictor({o.budget, o.recency, sinks, o.window}));
    return f(cache, EntryMetadata{scores, {}});
  }
  if (o.name == "epikv" || o.name == "hs-var") {  // SPEC §4: one score per token from two hidden-state bands
    require(o.band_a >= 0 && o.band_a <= c.layers && o.band_b >= 0 && o.band_b <= c.layers, "kvpolicy-lm: --band-a ",
            o.band_a, " and --band-b ", o.band_b, " must be hidden-state indices in [0, ", c.layers,
            "] (0 = embeddings, ", c.layers, " = the final norm's output)");
    epiphany::SignalConfig config;
    config.band_a = o.band_a;
    config.band_b = o.band_b;
    config.variant = o.name == "epikv" ? epiphany::Variant::epikv : epiphany::Variant::hs_var;
    // one signal per sequence: g(t) and the rolling windows follow each sequence's own tokens
    auto signals = std::make_shared<std::map<std::int64_t, epiphany::Signal>>();
    EntryMetadata m;
    m.hidden = {o.band_a, o.band_b,
                [signals, config, D = c.hidden](std::int64_t seq, const Matrix& h_a, const Matrix& h_b, float* out) {
                  const std::int64_t T = h_a.rows();
                  auto it = signals->try_emplace(seq, config, D).first;
                  it->second.push(View<const float, 2>(h_a.data(), {T, D}), View<const float, 2>(h_b.data(), {T, D}),
                                  std::span<float>(out, static_cast<std::size_t>(T)));
                }};
    EpiKVCache<> cache(shape, std::move(pool), epikv_evictor({o.budget, o.recency, sinks, o.window}));
    return f(cache, m);
  }
  if (o.name == "trimkv") {  // SPEC §1: log_beta from the retention gate on the layer's normed input
    const auto file = safetensors::File::read(o.gate);
    const int inner = static_cast<int>(file.info(gate::RetentionGate::prefix(0) + "linear1.weight").shape.at(0));
    auto g = std::make_shared<gate::RetentionGate>(gate::RetentionGate::load(
        file, {c.layers, c.hidden, c.kv_heads, inner, gate::Activation::silu}));
    const LayerMetadata lb = [g, c](std::int64_t, int l, const Matrix& h, const std::vector<float>&, const std::vector<float>&,
                                    const std::vector<float>&, std::int64_t T, float* out) {
      g->forward(l, View<const float, 2>(h.data(), {T, c.hidden}), View<float, 2>(out, {c.kv_heads, T}));
    };
    TrimKVCache<> cache(shape, std::move(pool), trimkv_evictor({o.budget, o.buffer, o.window, 0.0, sinks}));
    return f(cache, EntryMetadata{lb, {}});
  }
  if (o.name == "dbtrimkv") {  // SPEC §2: the tied gate, one global budget
    // the authors' rg10 (their released checkpoints), or the paper's literal tied gate (SPEC §2)
    const auto file = safetensors::File::read(o.gate);
    LayerMetadata lb;
    if (gate::Rg10Gate::holds(file)) {
      const int inner = static_cast<int>(file.info(gate::Rg10Gate::prefix(0) + "linear1.weight").shape.at(0));
      auto g = std::make_shared<gate::Rg10Gate>(
          gate::Rg10Gate::load(file, {c.layers, c.hidden, c.kv_heads, inner, gate::Activation::silu}));
      lb = [g, c](std::int64_t, int l, const Matrix& h, const std::vector<float>&, const std::vector<float>&,
                  const std::vector<float>&, std::int64_t T, float* out) {
        g->forward(l, View<const float, 2>(h.data(), {T, c.hidden}), View<float, 2>(out, {c.kv_heads, T}));
      };
    } else {
      const int proj = static_cast<int>(file.info(gate::TiedGate::readout_weight).shape.at(0));
      auto g = std::make_shared<gate::TiedGate>(
          gate::TiedGate::load(file, {c.layers, c.hidden, c.kv_heads, proj, gate::Activation::silu}));
      lb = [g, c](std::int64_t, int l, const Matrix& h, const std::vector<float>&, const std::vector<float>&,
                  const std::vector<float>&, std::int64_t T, float* out) {
        g->forward(l, View<const float, 2>(h.data(), {T, c.hidden}), View<float, 2>(out, {c.kv_heads, T}));
      };
    }
    const DBTrimKVConfig d{o.budget, o.buffer, 2, 0.0, o.window, 0.0, sinks};
    DBTrimKVCache<> cache(shape, std::move(pool), dbtrimkv_evictor(d), dbtrimkv_scorer(d));
    return f(cache, EntryMetadata{lb, {}});
  }
  if (o.name == "wgkv") {  // SPEC §3: g from the write gate on the keys before and after RoPE
    auto g = std::make_shared<gate::WriteGate>(gate::WriteGate::load(safetensors::File::read(o.gate),
                                                                    {.layers = c.layers, .kv_heads = c.kv_heads, .head_dim = c.head_dim}));
    const LayerMetadata gates = [g, c](std::int64_t, int l, const Matrix&, const std::vector<float>& k_pre, const std::vector<float>& k,
                                       const std::vector<float>&, std::int64_t T, float* out) {
      g->forward(l, View<const float, 3>(k_pre.data(), {c.kv_heads, T, c.head_dim}),
                 View<const float, 3>(k.data(), {c.kv_heads, T, c.head_dim}), View<float, 2>(out, {c.kv_heads, T}));
    };
    WGKVCache<> cache(shape, std::move(pool), wgkv_evictor({o.local, o.tau, sinks}));
    return f(cache, EntryMetadata{gates, {}});
  }
  std::string known;
  for (const auto& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
  fail("kvpolicy-lm: unknown policy '", o.name, "' (known: ", known, ")");
}

}  // namespace kvpolicy::lm
