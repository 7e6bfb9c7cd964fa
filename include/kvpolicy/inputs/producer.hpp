/// \file
/// kvpolicy/inputs/producer.hpp — what a policy reads from the forward pass, produced in one place.
/// A registry entry names its input source (`using inputs = ...;`, inputs/source.hpp);
/// `inputs::producer<P>(values, model)` builds that source's producer, and an engine (kvpolicy-lm,
/// kvpolicy-replay, Python's transformers cache) hands it the tensors its `needs()` lists and
/// appends what it writes. This file defines the producers of the shared sources (inputs/sources.hpp):
///   RetentionGate, TiedRetentionGate  log beta from the layer's normed input (SPEC §1, §2)
///   WriteGate                         g from the keys before and after RoPE (SPEC §3)
///   KeyValueStatistic                 a rolling statistic of each sequence's keys and values (SPEC §4)
///   HiddenStates                      one score per token from two hidden-state bands (SPEC §4)
/// Per-layer sources write [Hkv, T] for a layer's new tokens (Cache::append's log_beta); the
/// hidden-state source writes [T] once per step, which the engine gives every (layer, kv head)
/// (broadcast_token_scores). Rolling state is kept per sequence; drop() forgets a finished one.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/gate/load.hpp"
#include "kvpolicy/gate/write_gate.hpp"
#include "kvpolicy/inputs/source.hpp"
#include "kvpolicy/inputs/sources.hpp"
#include "kvpolicy/parts/score/epiphany.hpp"
#include "kvpolicy/parts/score/kvstats.hpp"
#include "kvpolicy/registry/policy.hpp"

namespace kvpolicy::inputs {

/// What policy P reads, from its option values alone (before a model is known: an engine installs
/// its hooks by it): its source's needs. Refuses a gated policy given no gate file.
template <registry::Policy P>
Needs needs(const registry::Values& v) {
  using I = typename P::inputs;
  static_assert(Source<I>, "inputs::needs: the policy's `inputs` is not an input source (inputs/source.hpp)");
  if constexpr (gated_v<I>) require_gate<P>(v);
  Needs n = I::template needs<P>(v);
  require(n.reconstruction.has_value() == probes_v<I>, "inputs::needs: policy ", P::name, "'s source ", I::name,
          probes_v<I> ? " states that it probes and describes no probe" : " describes a probe and does not state probes");
  return n;
}

/// The producer of policy P's inputs for `model`, from its option values (the trained gate's file
/// for a gated source: refused when none is given). Throws kvpolicy::Error on a bad value, naming it.
template <registry::Policy P>
Producer producer(const registry::Values& v, const ModelShape& model) {
  using I = typename P::inputs;
  static_assert(Source<I>, "inputs::producer: the policy's `inputs` is not an input source (inputs/source.hpp)");
  model.cache.validate();
  if constexpr (gated_v<I>) require_gate<P>(v);
  return I::template producer<P>(v, model);
}

/// The tensors of a safetensors file already read (File::read, or File::parse of its bytes).
inline GateTensors gate_tensors(safetensors::File file) {
  auto f = std::make_shared<const safetensors::File>(std::move(file));
  return {f->source(), f->metadata(), [f](const std::string& name) { return f->contains(name); },
          [f](const std::string& name) { return f->info(name).shape; },
          [f](const std::string& name, const std::vector<std::int64_t>& shape) { return f->floats(name, shape, true); }};
}

template <class>
GateTensors read_gate(const std::string& path) {
  return gate_tensors(safetensors::File::read(path));
}

/// Writes to `path` the example gate of policy P's source for `model` (its example_gate; level:
/// every readout bias).
template <registry::Policy P>
void example_gate(const std::string& path, const ModelShape& model, float level) {
  using I = typename P::inputs;
  if constexpr (gated_v<I>) {
    safetensors::Writer w;
    I::example_gate([&](const std::string& name, const std::vector<std::int64_t>& shape,
                        const std::vector<float>& values) { w.add_f32(name, shape, values); },
                    model, level);
    w.write(path);
  } else {
    fail("inputs::example_gate: policy ", P::name, " reads no gate file (its input source: ", I::name, ")");
  }
}

namespace detail {

/// Requires the hidden size D a source that reads the normed input or the hidden states needs.
template <class P>
void require_hidden(const ModelShape& model) {
  require(model.hidden >= 1, "inputs::producer: policy ", P::name, ": the hidden size D = ", model.hidden, " must be >= 1");
}

/// The producer of a gate on the layer's normed input: g(layer, input [T, D], out [Hkv, T]).
inline Producer normed_input_producer(Needs n, gate::LayerGate g, int D) {
  return {std::move(n),
          [g = std::move(g), D](std::int64_t, int l, const LayerActivations& a, View<float, 2> out) {
            require_given(a.normed_input, "normed input");
            require_shape(a.normed_input, {out.dim(1), D}, "inputs::Producer: normed input");
            g(l, a.normed_input, out);
          },
          {}, {}};
}

/// Small random weights (normal, sigma 0.05, a fixed seed) for an example gate.
class ExampleWeights {
 public:
  std::vector<float> random(std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& e : v) e = normal_(rng_);
    return v;
  }
  static std::vector<float> fill(std::int64_t n, float x) { return std::vector<float>(static_cast<std::size_t>(n), x); }

 private:
  std::mt19937 rng_{7};
  std::normal_distribution<float> normal_{0.0f, 0.05f};
};

/// The example gates' hidden width I.
inline constexpr int example_width = 32;

}  // namespace detail

// SPEC §1: log beta from TRIM-KV's gate (or an rg10 file) on the layer's normed input; in the
// token-level mode, from the file's token-level gate where it holds one (SPEC §8).
template <class P>
Needs RetentionGate::needs(const registry::Values&) {
  Needs n;
  n.normed_input = true;
  return n;
}
template <class P>
Producer RetentionGate::producer(const registry::Values& v, const ModelShape& m) {
  detail::require_hidden<P>(m);
  return detail::normed_input_producer(
      needs<P>(v),
      gate::load_retention_gate(v.text("gate"), m.cache.layers, m.hidden, m.cache.kv_heads, false, registry::token_level(v)),
      m.hidden);
}
/// `level`: every layer's readout bias (beta near sigmoid(level)).
inline void RetentionGate::example_gate(const GateSink& add, const ModelShape& m, float level) {
  detail::ExampleWeights w;
  const int I = detail::example_width, D = m.hidden, H = m.cache.kv_heads;
  for (int l = 0; l < m.cache.layers; ++l) {
    const auto p = gate::RetentionGate::prefix(l);
    add(p + "linear1.weight", {I, D}, w.random(I * D));
    add(p + "linear1.bias", {I}, w.random(I));
    add(p + "linear2.weight", {H, I}, w.random(H * I));
    add(p + "bias", {H}, w.fill(H, level));
  }
}

// SPEC §2: log beta from DBTrimKV's tied gate (rg10 when the file holds it, else the paper's); in
// the token-level mode, from the file's token-level gate where it holds one (SPEC §8).
template <class P>
Needs TiedRetentionGate::needs(const registry::Values&) {
  Needs n;
  n.normed_input = true;
  return n;
}
template <class P>
Producer TiedRetentionGate::producer(const registry::Values& v, const ModelShape& m) {
  detail::require_hidden<P>(m);
  return detail::normed_input_producer(
      needs<P>(v),
      gate::load_retention_gate(v.text("gate"), m.cache.layers, m.hidden, m.cache.kv_heads, true, registry::token_level(v)),
      m.hidden);
}
/// The authors' rg10: one readout tied across layers under every layer's name; `level`: its bias.
inline void TiedRetentionGate::example_gate(const GateSink& add, const ModelShape& m, float level) {
  detail::ExampleWeights w;
  const int I = detail::example_width, D = m.hidden, H = m.cache.kv_heads;
  const auto w3 = w.random(H * I);
  for (int l = 0; l < m.cache.layers; ++l) {
    const auto p = gate::Rg10Gate::prefix(l);
    add(p + "linear1.weight", {I, D}, w.random(I * D));
    add(p + "linear1.bias", {I}, w.random(I));
    add(p + "linear2.weight", {I, I}, w.random(I * I));
    add(p + "linear2.bias", {I}, w.random(I));
    add(p + "linear3.weight", {H, I}, w3);
    add(p + "bias", {H}, w.fill(H, level));
  }
}

// SPEC §3: g from WG-KV's write gate on the keys before and after RoPE, in the layout the gate was
// trained in (its file's metadata; adjacent, kvpolicy-lm's, if unsaid).
template <class P>
Needs WriteGate::needs(const registry::Values& v) {
  Needs n;
  n.keys_pre_rope = n.keys = true;
  const auto meta = safetensors::File::read(v.text("gate")).metadata();
  const auto it = meta.find("rope_layout");
  const std::string layout = it == meta.end() ? "adjacent" : it->second;
  require(layout == "adjacent" || layout == "half", "policy ", P::name, ": the gate '", v.text("gate"),
          "' says rope_layout '", layout, "'; it must be adjacent or half");
  n.key_layout = layout == "half" ? RopeLayout::half : RopeLayout::adjacent;
  return n;
}
template <class P>
Producer WriteGate::producer(const registry::Values& v, const ModelShape& m) {
  const CacheShape& s = m.cache;
  auto g = std::make_shared<const gate::WriteGate>(gate::WriteGate::load(
      safetensors::File::read(v.text("gate")), {.layers = s.layers, .kv_heads = s.kv_heads, .head_dim = s.head_dim}));
  return {needs<P>(v),
          [g](std::int64_t, int l, const LayerActivations& a, View<float, 2> out) {
            detail::require_given(a.keys_pre_rope, "keys before RoPE");
            detail::require_given(a.keys, "keys");
            g->forward(l, a.keys_pre_rope, a.keys, out);
          },
          {}, {}};
}
/// `level`: every head's readout bias (g near sigmoid(level)).
inline void WriteGate::example_gate(const GateSink& add, const ModelShape& m, float level) {
  detail::ExampleWeights w;
  const int H = m.cache.kv_heads, d = m.cache.head_dim, E = d;
  for (int l = 0; l < m.cache.layers; ++l) {
    const auto p = gate::WriteGate::prefix(l);
    add(p + "pre_norm.weight", {d}, w.fill(d, 1.0f));
    add(p + "post_norm.weight", {d}, w.fill(d, 1.0f));
    add(p + "w1.weight", {H, E, 2 * d}, w.random(std::int64_t{H} * E * 2 * d));
    add(p + "w1.bias", {H, E}, w.random(H * E));
    add(p + "w2.weight", {H, E}, w.random(H * E));
    add(p + "w2.bias", {H}, w.fill(H, level));
  }
}

// SPEC §4: one tracker of P::statistic per sequence.
template <class P>
Producer KeyValueStatistic::producer(const registry::Values& v, const ModelShape& m) {
  const CacheShape shape = m.cache;
  auto trackers = std::make_shared<detail::PerSequence<kvstats::Tracker>>(
      [shape] { return kvstats::Tracker(shape, kvstats::Config{P::statistic, 64}); });
  return {needs<P>(v),
          [trackers](std::int64_t seq, int l, const LayerActivations& a, View<float, 2> out) {
            detail::require_given(a.keys, "keys");
            detail::require_given(a.values, "values");
            (*trackers)(seq).push(l, a.keys, a.values, out);
          },
          {}, [trackers](std::int64_t seq) { trackers->drop(seq); }};
}

// SPEC §4: one signal of P::variant per sequence. The bands index the hidden states the caller
// gives, not the model's layers: a trace may hold more or fewer than L + 1 of them (docs/replay.md,
// hidden_states [L', T, D]).
template <class P>
Producer HiddenStates::producer(const registry::Values& v, const ModelShape& m) {
  detail::require_hidden<P>(m);
  Needs n = needs<P>(v);
  const auto [a, b] = *n.bands;
  const int given = m.hidden_states > 0 ? m.hidden_states : m.cache.layers + 1;
  require(a >= 0 && a < given && b >= 0 && b < given, "policy ", P::name, ": --band-a ", a, " and --band-b ", b,
          " must be hidden-state indices in [0, ", given - 1, "] of the L' = ", given,
          " hidden states given (0 = the embeddings)");
  epiphany::SignalConfig config;
  config.band_a = a;
  config.band_b = b;
  config.variant = P::variant;
  const int D = m.hidden;
  auto signals = std::make_shared<detail::PerSequence<epiphany::Signal>>([config, D] { return epiphany::Signal(config, D); });
  return {n, {},
          [signals](std::int64_t seq, View<const float, 2> h_a, View<const float, 2> h_b, std::span<float> out) {
            (*signals)(seq).push(h_a, h_b, out);
          },
          [signals](std::int64_t seq) { signals->drop(seq); }};
}

}  // namespace kvpolicy::inputs
