/// \file
/// kvpolicy/gate/write_gate.hpp — the WG-KV write gate on Eigen (SPEC §3), per layer and kv head h:
///   f = [ rmsnorm(k_pre) * w_pre ; rmsnorm(k_post) * w_post ]   (2d; eps 1e-6)
///   g = max(sigmoid(w2[h] . gelu(W1[h] f + b1[h]) + b2[h]), 1e-3)   W1[h]: [E, 2d], E = 4d in SPEC
/// k_pre is the key before RoPE, k_post after. Batched over the T tokens of a prefill chunk; a decode
/// token is the T = 1 case. Tensor names: docs/formats.md (kvpolicy-convert-checkpoint writes them).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kvpolicy/core/eigen.hpp"  // first: Eigen's packets without GCC 12's false warnings
#include <Eigen/Dense>

#include "kvpolicy/core/math.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/gate/retention_gate.hpp"
#include "kvpolicy/gate/safetensors.hpp"

namespace kvpolicy::gate {

/// The write gate's sizes (SPEC §3).
struct WriteGateConfig {
  int layers = 0;
  int kv_heads = 0;   ///< Hkv
  int head_dim = 0;   ///< d
  int expansion = 0;  ///< E; 0 = read it from the file (SPEC §3 says 4d; the authors' Qwen3 gates use 1.5d)
  static constexpr float rms_epsilon = 1e-6f;
  static constexpr float floor = 1e-3f;  ///< g is clamped below at 1e-3 (SPEC §3)

  void validate() const {
    require(layers >= 1, "WriteGate: layers = ", layers, " must be >= 1");
    require(kv_heads >= 1, "WriteGate: kv_heads = ", kv_heads, " must be >= 1");
    require(head_dim >= 1, "WriteGate: head_dim = ", head_dim, " must be >= 1");
    require(expansion >= 0, "WriteGate: expansion E = ", expansion, " must be >= 1 (or 0: from the file)");
  }
};

/// WG-KV's write gate (SPEC §3): per layer and kv head, g of each token from its pre- and post-RoPE keys.
/// Loaded once; forward is const and keeps no state, so one gate may serve every thread at once.
class WriteGate {
 public:
  struct Layer {
    RowMatrix pre_norm, post_norm;  // [d, 1]
    RowMatrix w1;                   // [Hkv * E, 2d]: head h is rows h*E .. h*E + E-1
    RowMatrix b1;                   // [Hkv, E]
    RowMatrix w2;                   // [Hkv, E]
    RowMatrix b2;                   // [Hkv, 1]
  };

  static std::string prefix(int l) { return "model.layers." + std::to_string(l) + ".self_attn.write_gate."; }

  /// Loads every layer (docs/formats.md names); F32, F16 and BF16 all load. Throws for layers, kv_heads
  /// or head_dim below 1, for E < 0, and for a tensor that is missing, has the wrong shape (w1.weight
  /// is [Hkv, E, 2d]), has an unsupported dtype, or holds a value that is not finite.
  static WriteGate load(const safetensors::File& f, WriteGateConfig c) {
    c.validate();
    const int d = c.head_dim, H = c.kv_heads;
    if (c.expansion == 0) {
      const auto& info = f.info(prefix(0) + "w1.weight");
      require(info.shape.size() == 3 && info.shape[1] >= 1 && info.shape[1] <= (1 << 24), "WriteGate: '", prefix(0),
              "w1.weight' has shape ", safetensors::shape_string(info.shape), ", expected [Hkv, E, 2d]");
      c.expansion = static_cast<int>(info.shape[1]);
    }
    const int E = c.expansion;
    WriteGate g;
    g.config_ = c;
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = prefix(l);
      const auto w1 = f.floats(p + "w1.weight", {H, E, 2 * d}, /*finite=*/true);
      g.layers_.push_back(Layer{load_matrix(f, p + "pre_norm.weight", {d}), load_matrix(f, p + "post_norm.weight", {d}),
                                Eigen::Map<const RowMatrix>(w1.data(), std::int64_t{H} * E, 2 * d),
                                load_matrix(f, p + "w1.bias", {H, E}), load_matrix(f, p + "w2.weight", {H, E}),
                                load_matrix(f, p + "w2.bias", {H})});
    }
    return g;
  }

  const WriteGateConfig& config() const { return config_; }

  /// k_pre, k_post [Hkv, T, d] -> g [Hkv, T] in [1e-3, 1] (the layout Cache::append takes), all fp32:
  /// WGKVCache's log_beta, or WGKVRetentionCache's gate. Throws for a layer out of range, a shape
  /// mismatch, or keys that are not finite.
  void forward(int layer, View<const float, 3> k_pre, View<const float, 3> k_post, View<float, 2> g) const {
    require(layer >= 0 && layer < config_.layers, "WriteGate: layer ", layer, " out of range [0, ", config_.layers, ")");
    const std::int64_t T = k_pre.dim(1);
    const int d = config_.head_dim, E = config_.expansion;
    require_shape(k_pre, {config_.kv_heads, T, d}, "WriteGate: k_pre");
    require_shape(k_post, {config_.kv_heads, T, d}, "WriteGate: k_post");
    require_shape(View<const float, 2>(g), {config_.kv_heads, T}, "WriteGate: g");
    require_finite(k_pre, "WriteGate: k_pre");
    require_finite(k_post, "WriteGate: k_post");
    const Layer& w = layers_[static_cast<std::size_t>(layer)];
    RowMatrix F(T, 2 * d);
    for (int h = 0; h < config_.kv_heads; ++h) {
      for (std::int64_t t = 0; t < T; ++t) {
        rmsnorm(&k_pre(h, t, 0), w.pre_norm, &F(t, 0));
        rmsnorm(&k_post(h, t, 0), w.post_norm, &F(t, d));
      }
      const auto W1 = w.w1.middleRows(std::int64_t{h} * E, E);                       // [E, 2d]
      RowMatrix U = (F * W1.transpose()).rowwise() + w.b1.row(h);                    // [T, E]
      U = U.unaryExpr([](float v) { return math::gelu(v); });
      const Eigen::VectorXf z = (U * w.w2.row(h).transpose()).array() + w.b2(h, 0);  // [T]
      for (std::int64_t t = 0; t < T; ++t) g(h, t) = std::max(1.0f / (1.0f + std::exp(-z(t))), WriteGateConfig::floor);
    }
  }

 private:
  // out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]
  static void rmsnorm(const float* x, const RowMatrix& weight, float* out) {
    const auto d = weight.rows();
    double ss = 0.0;
    for (std::int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + WriteGateConfig::rms_epsilon));
    for (std::int64_t i = 0; i < d; ++i) out[i] = x[i] * inv * weight(i, 0);
  }

  WriteGateConfig config_;
  std::vector<Layer> layers_;
};

}  // namespace kvpolicy::gate
