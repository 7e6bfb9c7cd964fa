/// \file
/// kvpolicy/gate/rg10_gate.hpp — DBTrimKV's retention gate as the authors' released checkpoints
/// hold it (`rg10`, SPEC §2 "Tied gate"), on Eigen. Per layer l a two-layer MLP, then a readout
/// shared by every layer (tied), one row per kv head:
///   u[l]     = act(W2[l] act(W1[l] x + b1[l]) + b2[l])     W1 [I, D], b1 [I], W2 [I, I], b2 [I]
///   log_beta = logsigmoid(W3 u[l] + b)                     W3 [Hkv, I] (no bias), b [Hkv]
/// x is the layer's attention input after its input RMSNorm. A checkpoint stores the tied pair
/// under every layer's name; load() checks that every copy equals layer 0's and keeps one.
/// gate::TiedGate (tied_gate.hpp) is the paper's literal form, which no released checkpoint uses.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "kvpolicy/gate/retention_gate.hpp"

namespace kvpolicy::gate {

/// The rg10 gate's sizes are TRIM-KV's: layers, D, Hkv, I (512 in the released checkpoints), act.
using Rg10GateConfig = RetentionGateConfig;

/// DBTrimKV's rg10 gate as the authors' checkpoints hold it (SPEC §2, "Tied gate"). Shapes, errors and
/// threads are those of RetentionGate.
class Rg10Gate {
 public:
  struct Layer {
    RowMatrix w1;  // [I, D]
    RowMatrix b1;  // [I, 1]
    RowMatrix w2;  // [I, I]
    RowMatrix b2;  // [I, 1]
  };

  static std::string prefix(int l) { return "model.layers." + std::to_string(l) + ".self_attn.retention_gate."; }

  /// True when the file holds an rg10 gate (layer 0's linear3.weight), not another gate's names.
  static bool holds(const safetensors::File& f) { return f.contains(prefix(0) + "linear3.weight"); }

  /// Loads every layer by the authors' state-dict names (SPEC §2); F32, F16 and BF16 all load. A
  /// layer whose tied copy (linear3.weight, bias) differs from layer 0's is an error naming it.
  static Rg10Gate load(const safetensors::File& f, const Rg10GateConfig& c) {
    c.validate("Rg10Gate");
    Rg10Gate g;
    g.config_ = c;
    const std::int64_t I = c.intermediate;
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = prefix(l);
      g.layers_.push_back(Layer{load_matrix(f, p + "linear1.weight", {I, c.hidden}), load_matrix(f, p + "linear1.bias", {I}),
                                load_matrix(f, p + "linear2.weight", {I, I}), load_matrix(f, p + "linear2.bias", {I})});
      RowMatrix w3 = load_matrix(f, p + "linear3.weight", {c.kv_heads, I});
      RowMatrix b = load_matrix(f, p + "bias", {c.kv_heads});
      if (l == 0) {
        g.w3_ = std::move(w3);
        g.b_ = std::move(b);
        continue;
      }
      const auto same = [](const RowMatrix& a, const RowMatrix& z) {
        return std::memcmp(a.data(), z.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
      };
      require(same(w3, g.w3_) && same(b, g.b_), "Rg10Gate: layer ", l, "'s tied readout (", p, "linear3.weight, ", p,
              "bias) differs from layer 0's: rg10 ties it across every layer (SPEC §2), so this file is not an rg10 "
              "checkpoint or was edited");
    }
    return g;
  }

  const Rg10GateConfig& config() const { return config_; }

  /// x [T, D] -> log_beta [Hkv, T] (the layout Cache::append takes).
  void forward(int layer, View<const float, 2> x, View<float, 2> log_beta) const {
    require(layer >= 0 && layer < config_.layers, "Rg10Gate: layer ", layer, " out of range [0, ", config_.layers, ")");
    const std::int64_t T = x.dim(0);
    require_shape(x, {T, config_.hidden}, "Rg10Gate: x");
    require_finite(x, "Rg10Gate: x");
    require_shape(View<const float, 2>(log_beta), {config_.kv_heads, T}, "Rg10Gate: log_beta");
    const Layer& w = layers_[static_cast<std::size_t>(layer)];
    const Activation act = config_.activation;
    const auto activated = [act](const RowMatrix& m) { return RowMatrix(m.unaryExpr([act](float v) { return activate(act, v); })); };
    const Eigen::Map<const RowMatrix> X(x.data, T, config_.hidden);
    const RowMatrix U1 = activated((X * w.w1.transpose()).rowwise() + w.b1.col(0).transpose());   // [T, I]
    const RowMatrix U2 = activated((U1 * w.w2.transpose()).rowwise() + w.b2.col(0).transpose());  // [T, I]
    const RowMatrix Z = (w3_ * U2.transpose()).colwise() + b_.col(0);                               // [Hkv, T]
    for (std::int64_t h = 0; h < config_.kv_heads; ++h)
      for (std::int64_t t = 0; t < T; ++t) log_beta(h, t) = math::logsigmoid(Z(h, t));
  }

  /// The tied readout every layer shares: W3 [Hkv, I] and b [Hkv, 1].
  const RowMatrix& readout_weight() const { return w3_; }
  const RowMatrix& readout_bias() const { return b_; }
  const Layer& layer(int l) const {
    require(l >= 0 && static_cast<std::size_t>(l) < layers_.size(), "Rg10Gate::layer: layer ", l, " out of range [0, ",
            layers_.size(), ")");
    return layers_[static_cast<std::size_t>(l)];
  }

 private:
  Rg10GateConfig config_;
  std::vector<Layer> layers_;
  RowMatrix w3_, b_;
};

}  // namespace kvpolicy::gate
