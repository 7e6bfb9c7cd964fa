/// \file
/// kvpolicy/gate/load.hpp — a gate on the normed input from its file, as one callable per layer:
/// TRIM-KV's gate (SPEC §1) or DBTrimKV's tied gate (SPEC §2: the authors' rg10 when the file
/// holds it, else the paper's literal tied gate). TRIM-KV also runs an rg10 file (SPEC §1, "Gate
/// kind"): the authors' code takes the gate's kind from the model's config, apart from the cache
/// that evicts by it. The width (I, or the readout's projection) is
/// read from the file.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kvpolicy/gate/retention_gate.hpp"
#include "kvpolicy/gate/rg10_gate.hpp"
#include "kvpolicy/gate/tied_gate.hpp"

namespace kvpolicy::gate {

/// input [T, D] of `layer` (its attention input, after the input RMSNorm) -> log_beta [Hkv, T].
using LayerGate = std::function<void(int layer, View<const float, 2> input, View<float, 2> log_beta)>;

/// The names under which a gate file holds its gate for the token-level layout (SPEC §8, "Gate for
/// the layout"), beside the per-head gate under the plain names.
inline constexpr const char* token_level_prefix = "token_level.";

/// True when the file holds a token-level gate (SPEC §8) beside its per-head one: a tensor under the prefix.
inline bool holds_token_level_gate(const safetensors::File& file) {
  const std::string prefix = token_level_prefix;
  for (const auto& name : file.names())
    if (name.compare(0, prefix.size(), prefix) == 0) return true;
  return false;
}

/// tied = false: TRIM-KV's gate, or rg10 when the file holds it; true: DBTrimKV's (rg10 or the paper's
/// literal tied gate). token_level: the cache evicts whole positions (SPEC §8), so the file's
/// token-level gate is read where it holds one, its per-head gate otherwise. A token-level gate may
/// be of any of the three kinds for either policy: in that layout both rank positions by the max over
/// every layer's heads, the one selection the gate was trained for (SPEC §8, "Gate for the layout").
/// Activation: SiLU, as the authors' gates.
inline LayerGate load_retention_gate(const std::string& path, int layers, int hidden, int kv_heads, bool tied,
                                     bool token_level = false) {
  auto file = safetensors::File::read(path);
  if (token_level && holds_token_level_gate(file)) {
    file = file.section(token_level_prefix);
    tied = file.contains(TiedGate::readout_weight);
  }
  const auto width = [&](const std::string& name) { return static_cast<int>(file.info(name).shape.at(0)); };
  const auto wrap = [](auto gate) -> LayerGate {
    auto g = std::make_shared<const decltype(gate)>(std::move(gate));
    return [g](int layer, View<const float, 2> input, View<float, 2> out) { g->forward(layer, input, out); };
  };
  if (Rg10Gate::holds(file))
    return wrap(Rg10Gate::load(file, {layers, hidden, kv_heads, width(Rg10Gate::prefix(0) + "linear1.weight"), Activation::silu}));
  if (!tied)
    return wrap(RetentionGate::load(
        file, {layers, hidden, kv_heads, width(RetentionGate::prefix(0) + "linear1.weight"), Activation::silu}));
  return wrap(TiedGate::load(file, {layers, hidden, kv_heads, width(TiedGate::readout_weight), Activation::silu}));
}

}  // namespace kvpolicy::gate
