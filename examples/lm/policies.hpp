// kvpolicy-lm's policies by name: each name makes its kvpolicy Cache (one pool for every sequence)
// and the metadata its entries need from the forward pass, then hands both to the caller.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "decoder.hpp"
#include "kvpolicy/gate/load.hpp"
#include "kvpolicy/gate/write_gate.hpp"
#include "kvpolicy/registry.hpp"
#include "kvpolicy/trimkv.hpp"

namespace kvpolicy::lm {

/// A policy by its registry name and the options given to it (registry::Selection); full by default.
struct PolicyOptions : registry::Selection {
  PolicyOptions() { policy = "full"; }
};

/// What policy P's entries need from the forward pass (registry::Inputs), for kvpolicy-lm's decoder.
template <registry::Policy P>
EntryMetadata entry_metadata(const registry::Values& v, const Config& c) {
  using registry::Inputs;
  constexpr bool gated = P::inputs == Inputs::retention_gate || P::inputs == Inputs::tied_retention_gate ||
                         P::inputs == Inputs::write_gate;
  if constexpr (gated)
    require(!v.text("gate").empty(), "kvpolicy-lm: policy ", P::name,
            " needs its trained gate: --gate FILE (a safetensors file under SPEC's tensor names)");
  if constexpr (P::inputs == Inputs::retention_gate || P::inputs == Inputs::tied_retention_gate) {
    // SPEC §1, §2: log_beta from the gate on the layer's normed input
    const auto g = gate::load_retention_gate(v.text("gate"), c.layers, c.hidden, c.kv_heads,
                                             P::inputs == Inputs::tied_retention_gate);
    return {[g, c](std::int64_t, int l, const Matrix& h, const std::vector<float>&, const std::vector<float>&,
                   const std::vector<float>&, std::int64_t T, float* out) {
              g(l, View<const float, 2>(h.data(), {T, c.hidden}), View<float, 2>(out, {c.kv_heads, T}));
            },
            {}};
  } else if constexpr (P::inputs == Inputs::write_gate) {  // SPEC §3: g on the keys before and after RoPE
    auto g = std::make_shared<gate::WriteGate>(gate::WriteGate::load(
        safetensors::File::read(v.text("gate")), {.layers = c.layers, .kv_heads = c.kv_heads, .head_dim = c.head_dim}));
    return {[g, c](std::int64_t, int l, const Matrix&, const std::vector<float>& k_pre, const std::vector<float>& k,
                   const std::vector<float>&, std::int64_t T, float* out) {
              g->forward(l, View<const float, 3>(k_pre.data(), {c.kv_heads, T, c.head_dim}),
                         View<const float, 3>(k.data(), {c.kv_heads, T, c.head_dim}), View<float, 2>(out, {c.kv_heads, T}));
            },
            {}};
  } else if constexpr (P::inputs == Inputs::key_value_statistic) {  // SPEC §4: K/V statistics per head
    // one tracker per sequence: the statistics follow each sequence's own tokens
    auto trackers = std::make_shared<std::map<std::int64_t, kvstats::Tracker>>();
    const CacheShape shape = c.cache_shape();
    return {[trackers, shape](std::int64_t seq, int l, const Matrix&, const std::vector<float>&, const std::vector<float>& k,
                              const std::vector<float>& val, std::int64_t T, float* out) {
              auto it = trackers->try_emplace(seq, shape, kvstats::Config{P::statistic, 64}).first;
              it->second.push(l, View<const float, 3>(k.data(), {shape.kv_heads, T, shape.head_dim}),
                              View<const float, 3>(val.data(), {shape.kv_heads, T, shape.head_dim}),
                              View<float, 2>(out, {shape.kv_heads, T}));
            },
            {}};
  } else if constexpr (P::inputs == Inputs::hidden_states) {  // SPEC §4: one score per token from two bands
    const std::int64_t a = v.integer("band-a"), b = v.integer("band-b");
    require(a >= 0 && a <= c.layers && b >= 0 && b <= c.layers, "kvpolicy-lm: --band-a ", a, " and --band-b ", b,
            " must be hidden-state indices in [0, ", c.layers, "] (0 = embeddings, ", c.layers,
            " = the final norm's output)");
    epiphany::SignalConfig config;
    config.band_a = static_cast<int>(a);
    config.band_b = static_cast<int>(b);
    config.variant = P::variant;
    // one signal per sequence: g(t) and the rolling windows follow each sequence's own tokens
    auto signals = std::make_shared<std::map<std::int64_t, epiphany::Signal>>();
    EntryMetadata m;
    m.hidden = {config.band_a, config.band_b,
                [signals, config, D = c.hidden](std::int64_t seq, const Matrix& h_a, const Matrix& h_b, float* out) {
                  const std::int64_t T = h_a.rows();
                  auto it = signals->try_emplace(seq, config, D).first;
                  it->second.push(View<const float, 2>(h_a.data(), {T, D}), View<const float, 2>(h_b.data(), {T, D}),
                                  std::span<float>(out, static_cast<std::size_t>(T)));
                }};
    return m;
  } else {
    static_assert(P::inputs == Inputs::none, "kvpolicy-lm: a registry::Inputs this decoder does not compute");
    return {};
  }
}

/// The dtype the cache stores K and V in: fp16 (llama.cpp's default cache type; half the bytes a
/// decode step reads) or fp32. Attention widens each entry to fp32 as it reads it.
enum class KvDtype { f16, f32 };

/// f(std::type_identity<Storage>{}) with the Storage type `kv` names.
template <class F>
decltype(auto) with_kv_storage(KvDtype kv, F&& f) {
  if (kv == KvDtype::f16) return f(std::type_identity<half>{});
  return f(std::type_identity<float>{});
}

/// Makes the Cache `o` names for `sequences` sequences of up to `max_tokens` tokens each (steps of
/// up to `chunk` tokens), its K/V stored as `kv`, and calls f(cache, metadata). The pool holds every
/// token in every head: the policy, not the pool, bounds what stays (docs/quality.md reports the
/// entries held).
template <class F>
decltype(auto) with_policy(const PolicyOptions& o, KvDtype kv, const Config& c, std::int64_t sequences,
                           std::int64_t max_tokens, F&& f) {
  const CacheShape shape = c.cache_shape();
  const std::int64_t pages = pages_for(shape, max_tokens + 16, sequences, 16);
  return with_kv_storage(kv, [&]<class Storage>(std::type_identity<Storage>) -> decltype(auto) {
    return registry::visit(o.policy, [&]<registry::Policy P>() -> decltype(auto) {
      const registry::Values v = registry::values<P>(o.given);
      const EntryMetadata meta = entry_metadata<P>(v, c);
      return P::template make<cpu_backend>(v, shape, memory::Paged<16, Storage>(pages),
                                           [&](auto& cache) -> decltype(auto) { return f(cache, meta); });
    });
  });
}

}  // namespace kvpolicy::lm
