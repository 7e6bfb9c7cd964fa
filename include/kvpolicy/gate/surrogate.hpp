/// \file
/// kvpolicy/gate/surrogate.hpp — KVzap's surrogate on Eigen (SPEC §11): one small model per layer
/// from a token's attention input (after the layer's input RMSNorm) to one score per kv head, the
/// log of the KVzip+ score the token would get:
///   linear:  s = W x + b                              W [Hkv, D]
///   mlp:     s = W2 GELU(W1 x + b1) + b2              W1 [I, D], W2 [Hkv, I], GELU with erf
/// under kvpress's tensor names (KVzapModel's state dict: layers.{l}.weight and .bias, or
/// layers.{l}.0.* and layers.{l}.2.* for the MLP), so that a file kvpress saves loads here and a
/// file trained here loads in kvpress. The file says which by the names it holds.
#pragma once

#include <string>
#include <vector>

#include "kvpolicy/core/eigen.hpp"  // first: Eigen's packets without GCC 12's false warnings
#include <Eigen/Dense>

#include "kvpolicy/core/view.hpp"
#include "kvpolicy/gate/activation.hpp"
#include "kvpolicy/gate/retention_gate.hpp"  // RowMatrix, load_matrix
#include "kvpolicy/gate/safetensors.hpp"

namespace kvpolicy::gate {

/// The surrogate's sizes: layers L, the attention input's width D, kv heads Hkv (the model's).
struct SurrogateConfig {
  int layers = 0;
  int hidden = 0;
  int kv_heads = 0;
};

/// KVzap's surrogate (SPEC §11). Loaded once; forward is const and keeps no state, so one
/// surrogate may serve every thread at once.
class Surrogate {
 public:
  struct Layer {
    RowMatrix w1;  // linear: W [Hkv, D]; mlp: W1 [I, D]
    RowMatrix b1;  // [Hkv, 1] or [I, 1]
    RowMatrix w2;  // mlp only: W2 [Hkv, I]
    RowMatrix b2;  // mlp only: [Hkv, 1]
  };

  static std::string prefix(int l) { return "layers." + std::to_string(l) + "."; }
  /// True when the file holds an MLP surrogate (layer 0's first Linear), else a linear one.
  static bool is_mlp(const safetensors::File& f) { return f.contains(prefix(0) + "0.weight"); }

  /// Loads every layer; F32, F16 and BF16 all load. Throws for a size below 1, or for a tensor that
  /// is missing, has the wrong shape or dtype, or holds a value that is not finite; for an MLP, the
  /// width I is layer 0's and every layer must have it.
  static Surrogate load(const safetensors::File& f, const SurrogateConfig& c) {
    require(c.layers >= 1 && c.hidden >= 1 && c.kv_heads >= 1, "Surrogate: layers = ", c.layers, ", hidden = ", c.hidden,
            ", kv_heads = ", c.kv_heads, " must each be >= 1");
    Surrogate s;
    s.config_ = c;
    s.mlp_ = is_mlp(f);
    require(s.mlp_ || f.contains(prefix(0) + "weight"), "Surrogate: '", f.source(),
            "' holds no KVzap surrogate (neither layers.0.weight nor layers.0.0.weight)");
    if (s.mlp_) s.width_ = static_cast<int>(f.info(prefix(0) + "0.weight").shape.at(0));
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = prefix(l);
      if (s.mlp_)
        s.layers_.push_back(Layer{load_matrix(f, p + "0.weight", {s.width_, c.hidden}), load_matrix(f, p + "0.bias", {s.width_}),
                                  load_matrix(f, p + "2.weight", {c.kv_heads, s.width_}),
                                  load_matrix(f, p + "2.bias", {c.kv_heads})});
      else
        s.layers_.push_back(Layer{load_matrix(f, p + "weight", {c.kv_heads, c.hidden}), load_matrix(f, p + "bias", {c.kv_heads}), {}, {}});
    }
    require(!f.contains(prefix(c.layers) + (s.mlp_ ? "0.weight" : "weight")), "Surrogate: '", f.source(),
            "' holds more layers than the model's ", c.layers);
    return s;
  }

  const SurrogateConfig& config() const { return config_; }
  bool mlp() const { return mlp_; }
  /// The MLP's width I; 0 for a linear surrogate.
  int width() const { return width_; }

  /// x [T, D] (layer `layer`'s attention input) -> scores [Hkv, T] (the layout Cache::append
  /// takes). Throws for a layer out of range, a shape mismatch, or an x that is not finite.
  void forward(int layer, View<const float, 2> x, View<float, 2> scores) const {
    require(layer >= 0 && layer < config_.layers, "Surrogate: layer ", layer, " out of range [0, ", config_.layers, ")");
    const std::int64_t T = x.dim(0);
    require_shape(x, {T, config_.hidden}, "Surrogate: x");
    require_finite(x, "Surrogate: x");
    require_shape(View<const float, 2>(scores), {config_.kv_heads, T}, "Surrogate: scores");
    const Layer& w = layers_[static_cast<std::size_t>(layer)];
    const Eigen::Map<const RowMatrix> X(x.data, T, config_.hidden);
    Eigen::Map<RowMatrix> S(scores.data, config_.kv_heads, T);  // [Hkv, T]
    if (mlp_) {
      RowMatrix U = (X * w.w1.transpose()).rowwise() + w.b1.col(0).transpose();  // [T, I]
      U = U.unaryExpr([](float v) { return activate(Activation::gelu, v); });
      S = (w.w2 * U.transpose()).colwise() + w.b2.col(0);
    } else {
      S = (w.w1 * X.transpose()).colwise() + w.b1.col(0);
    }
  }

 private:
  SurrogateConfig config_;
  bool mlp_ = false;
  int width_ = 0;
  std::vector<Layer> layers_;
};

}  // namespace kvpolicy::gate
