/// \file
/// kvpolicy/gate/retention_gate.hpp — the TRIM-KV retention gate on Eigen (SPEC §1):
///   u = act(W1 x + b1),  z = W2 u + b,  log_beta = logsigmoid(z)   (one value per kv head)
/// x is the attention block's input (after the layer's input RMSNorm). Batched over the T tokens of
/// a prefill chunk; a decode token is the T = 1 case. The gates of kvpolicy/gate/ need Eigen and
/// nlohmann_json (target kvpolicy::cpu).
#pragma once

#include <string>
#include <vector>

#include "kvpolicy/core/eigen.hpp"  // first: Eigen's packets without GCC 12's false warnings
#include <Eigen/Dense>

#include "kvpolicy/core/view.hpp"
#include "kvpolicy/gate/activation.hpp"
#include "kvpolicy/gate/safetensors.hpp"

namespace kvpolicy::gate {

/// A row-major fp32 Eigen matrix: the layout of the gates' weights in their files.
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Reads `name` with shape `shape` as a finite fp32 matrix [rows, cols] (a vector is [n, 1]).
inline RowMatrix load_matrix(const safetensors::File& f, const std::string& name, const std::vector<std::int64_t>& shape) {
  const auto v = f.floats(name, shape, /*finite=*/true);
  const std::int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  return Eigen::Map<const RowMatrix>(v.data(), rows, cols);
}

/// The TRIM-KV gate's sizes (SPEC §1): layers, D, Hkv, I and its activation.
struct RetentionGateConfig {
  int layers = 0;
  int hidden = 0;          // D
  int kv_heads = 0;        // Hkv
  int intermediate = 512;  // I
  Activation activation = Activation::silu;

  /// `who` names the gate in the errors (the rg10 gate shares this config: gate/rg10_gate.hpp).
  void validate(const char* who = "RetentionGate") const {
    require(layers >= 1, who, ": layers = ", layers, " must be >= 1");
    require(hidden >= 1, who, ": hidden = ", hidden, " must be >= 1");
    require(kv_heads >= 1, who, ": kv_heads = ", kv_heads, " must be >= 1");
    require(intermediate >= 1, who, ": intermediate = ", intermediate, " must be >= 1");
  }
};

/// TRIM-KV's retention gate (SPEC §1): one MLP per layer from the hidden state to log beta of every kv head.
/// Loaded once; forward is const and keeps no state, so one gate may serve every thread at once.
class RetentionGate {
 public:
  struct Layer {
    RowMatrix w1;  // [I, D]
    RowMatrix b1;  // [I, 1]
    RowMatrix w2;  // [Hkv, I]
    RowMatrix b;   // [Hkv, 1]
  };

  static std::string prefix(int l) { return "model.layers." + std::to_string(l) + ".self_attn.retention_gate."; }

  /// Loads every layer by the reference state-dict names (SPEC §1); F32, F16 and BF16 all load. Throws
  /// for a config value below 1, or for a tensor that is missing, has the wrong shape, has an
  /// unsupported dtype, or holds a value that is not finite.
  static RetentionGate load(const safetensors::File& f, const RetentionGateConfig& c) {
    c.validate();
    RetentionGate g;
    g.config_ = c;
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = prefix(l);
      g.layers_.push_back(Layer{load_matrix(f, p + "linear1.weight", {c.intermediate, c.hidden}),
                                load_matrix(f, p + "linear1.bias", {c.intermediate}),
                                load_matrix(f, p + "linear2.weight", {c.kv_heads, c.intermediate}),
                                load_matrix(f, p + "bias", {c.kv_heads})});
    }
    return g;
  }

  const RetentionGateConfig& config() const { return config_; }

  /// x [T, D] -> log_beta [Hkv, T] (the layout Cache::append takes), fp32, in [-inf, 0]. Throws for
  /// a layer out of range, a shape mismatch, or an x that is not finite.
  void forward(int layer, View<const float, 2> x, View<float, 2> log_beta) const {
    require(layer >= 0 && layer < config_.layers, "RetentionGate: layer ", layer, " out of range [0, ",
            config_.layers, ")");
    const std::int64_t T = x.dim(0);
    require_shape(x, {T, config_.hidden}, "RetentionGate: x");
    require_finite(x, "RetentionGate: x");
    require_shape(View<const float, 2>(log_beta), {config_.kv_heads, T}, "RetentionGate: log_beta");
    const Layer& w = layers_[static_cast<std::size_t>(layer)];
    const Eigen::Map<const RowMatrix> X(x.data, T, config_.hidden);
    RowMatrix U = (X * w.w1.transpose()).rowwise() + w.b1.col(0).transpose();  // [T, I]
    const Activation act = config_.activation;
    U = U.unaryExpr([act](float v) { return activate(act, v); });
    const RowMatrix Z = (w.w2 * U.transpose()).colwise() + w.b.col(0);  // [Hkv, T]
    for (std::int64_t h = 0; h < config_.kv_heads; ++h)
      for (std::int64_t t = 0; t < T; ++t) log_beta(h, t) = math::logsigmoid(Z(h, t));
  }

 private:
  RetentionGateConfig config_;
  std::vector<Layer> layers_;
};

}  // namespace kvpolicy::gate
