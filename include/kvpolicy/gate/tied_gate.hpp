/// \file
/// kvpolicy/gate/tied_gate.hpp — the DBTrimKV weight-tied retention gate on Eigen (SPEC §2):
///   P[l] = act(Wp[l] x + bp[l]) reshaped to [Hkv, J]
///   log_beta[h] = logsigmoid(P[l][h] . wg + bg)      wg [J], bg scalar: one pair for the whole model
#pragma once

#include <string>
#include <vector>

#include "kvpolicy/gate/retention_gate.hpp"

namespace kvpolicy::gate {

/// The tied gate's sizes (SPEC §2): layers, D, Hkv and the projection J.
struct TiedGateConfig {
  int layers = 0;
  int hidden = 0;    // D
  int kv_heads = 0;  // Hkv
  int proj = 64;     // J
  Activation activation = Activation::silu;

  void validate() const {
    require(layers >= 1, "TiedGate: layers = ", layers, " must be >= 1");
    require(hidden >= 1, "TiedGate: hidden = ", hidden, " must be >= 1");
    require(kv_heads >= 1, "TiedGate: kv_heads = ", kv_heads, " must be >= 1");
    require(proj >= 1, "TiedGate: proj J = ", proj, " must be >= 1");
  }
};

/// DBTrimKV's weight-tied retention gate in the paper's form (SPEC §2), which no released checkpoint
/// uses (gate/rg10_gate.hpp). Shapes, errors and threads are those of RetentionGate.
class TiedGate {
 public:
  static std::string prefix(int l) { return "model.layers." + std::to_string(l) + ".self_attn.retention_gate."; }
  static constexpr const char* readout_weight = "retention_gate.readout.weight";
  static constexpr const char* readout_bias = "retention_gate.readout.bias";

  static TiedGate load(const safetensors::File& f, const TiedGateConfig& c) {
    c.validate();
    TiedGate g;
    g.config_ = c;
    const std::int64_t hj = std::int64_t{c.kv_heads} * c.proj;
    for (int l = 0; l < c.layers; ++l) {
      g.proj_w_.push_back(load_matrix(f, prefix(l) + "proj.weight", {hj, c.hidden}));
      g.proj_b_.push_back(load_matrix(f, prefix(l) + "proj.bias", {hj}));
    }
    g.readout_w_ = load_matrix(f, readout_weight, {c.proj});
    g.readout_b_ = load_matrix(f, readout_bias, {1})(0, 0);
    return g;
  }

  const TiedGateConfig& config() const { return config_; }

  /// x [T, D] -> log_beta [Hkv, T].
  void forward(int layer, View<const float, 2> x, View<float, 2> log_beta) const {
    require(layer >= 0 && layer < config_.layers, "TiedGate: layer ", layer, " out of range [0, ", config_.layers, ")");
    const std::int64_t T = x.dim(0);
    require_shape(x, {T, config_.hidden}, "TiedGate: x");
    require_finite(x, "TiedGate: x");
    require_shape(View<const float, 2>(log_beta), {config_.kv_heads, T}, "TiedGate: log_beta");
    const auto l = static_cast<std::size_t>(layer);
    const Eigen::Map<const RowMatrix> X(x.data, T, config_.hidden);
    RowMatrix P = (X * proj_w_[l].transpose()).rowwise() + proj_b_[l].col(0).transpose();  // [T, Hkv*J]
    const Activation act = config_.activation;
    P = P.unaryExpr([act](float v) { return activate(act, v); });
    const int J = config_.proj;
    for (std::int64_t t = 0; t < T; ++t)
      for (int h = 0; h < config_.kv_heads; ++h) {
        const float z = P.row(t).segment(std::int64_t{h} * J, J).dot(readout_w_.col(0).transpose()) + readout_b_;
        log_beta(h, t) = math::logsigmoid(z);
      }
  }

 private:
  TiedGateConfig config_;
  std::vector<RowMatrix> proj_w_, proj_b_;
  RowMatrix readout_w_;
  float readout_b_ = 0.0f;
};

}  // namespace kvpolicy::gate
