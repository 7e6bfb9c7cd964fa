/// \file
/// kvpolicy/policies/kvzap.hpp — KVzap (SPEC §11), as NVIDIA kvpress 0.5.5's DMSPress(KVzapPress)
/// runs it: a small model per layer (KVzapSurrogate) reads each token's attention input when it is
/// written and predicts the log of the KVzip+ score its entry would get in each kv head; that score
/// is frozen in the entry, and after every step each (layer, kv head) drops its entries scoring
/// below tau, except its W newest. No budget: what stays depends on the text. The surrogate is the
/// policy's input source (KVzapInputs, inputs/source.hpp): the engines run it through the
/// registry's producer on the normed input they compute for every gate.
///
///   kvpolicy::KVzapCache<> cache(shape, kvpolicy::memory::Paged<16>(pages), kvpolicy::kvzap_evictor({.tau = -3.5}));
///   surrogate.forward(layer, normed_input /* [T, D] */, scores /* [Hkv, T] */);   // per layer
///   cache.step(seq, keys, values, scores /* [L, Hkv, T], in place of log_beta */);
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/core/by_name.hpp"
#include "kvpolicy/core/math.hpp"
#include "kvpolicy/core/rule.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/cpu/backend_fwd.hpp"
#include "kvpolicy/inputs/source.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/memory_bound.hpp"
#include "kvpolicy/parts/score/retention.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// KVzap's settings: tau on the predicted log score, and kvpress's window of 128 tokens.
struct KVzapConfig {
  [[no_unique_address]] ByName by_name{};
  double tau = -4.0;           ///< an entry past the window leaves when its score is < tau (kvpress's example)
  std::int64_t window = 128;   ///< W: the W newest entries of each head stay whatever their score
};

/// KVzap's rule (SPEC §11) on a head's entries, with the surrogate's score frozen in each: after
/// every step a head longer than W keeps its W newest entries and every older one scoring >= tau.
/// Every token is written to every head and none of the W newest leaves, so a head's W newest are
/// the sequence's last W positions: kvpress's rule (masked once t < N - W and s < tau) exactly.
struct KVzapEvictor {
  double tau = -4.0;
  std::int64_t window = 128;

  void validate(const CacheShape& shape) const {
    shape.validate();
    require(std::isfinite(tau) && std::fabs(tau) <= 1e30, "KVzap: tau = ", tau, " must be finite and within fp32's range");
    require(window >= 0 && window <= INT32_MAX, "KVzap: window W = ", window, " must be in [0, 2^31 - 1]");
  }
  std::int64_t group_heads(const CacheShape&) const { return 1; }
  KVPOLICY_HD bool fires(std::int64_t length, std::int64_t, StepContext) const { return length > window; }
  /// No budget bounds a head: every entry scoring >= tau stays.
  std::optional<evict::MemoryBound> memory_bound(const CacheShape&) const { return std::nullopt; }
  /// kvpress compares the fp32 score with tau in fp32 (`scores < threshold` on a float tensor).
  evict::HeadSelection selection() const {
    evict::HeadSelection sel;
    sel.threshold = true;
    sel.bound = static_cast<float>(tau);
    sel.window = window;
    return sel;
  }
};

/// KVzap's surrogate (SPEC §11): one small model per layer from a token's attention input (after
/// the layer's input RMSNorm) to one score per kv head, the log of the KVzip+ score the token would
/// get:
///   linear:  s = W x + b                              W [Hkv, D]
///   mlp:     s = W2 GELU(W1 x + b1) + b2              W1 [I, D], W2 [Hkv, I], GELU with erf
/// under kvpress's tensor names (KVzapModel's state dict: layers.{l}.weight and .bias, or
/// layers.{l}.0.* and layers.{l}.2.* for the MLP), so that a file kvpress saves loads here and a
/// file trained here loads in kvpress; the file says which by the names it holds. Loaded once;
/// forward is const and keeps no state, so one surrogate may serve every thread at once. Sums run
/// in double and round once to the fp32 score.
class KVzapSurrogate {
 public:
  /// The sizes it is loaded for: layers L, the attention input's width D, kv heads Hkv (the model's).
  struct Config {
    int layers = 0;
    int hidden = 0;
    int kv_heads = 0;
  };

  static std::string prefix(int l) { return "layers." + std::to_string(l) + "."; }
  /// True when the file holds an MLP surrogate (layer 0's first Linear), else a linear one.
  static bool is_mlp(const inputs::GateTensors& f) { return f.contains(prefix(0) + "0.weight"); }

  /// Loads every layer; F32, F16 and BF16 all load. Throws for a size below 1, or for a tensor that
  /// is missing, has the wrong shape or dtype, or holds a value that is not finite; for an MLP, the
  /// width I is layer 0's and every layer must have it.
  static KVzapSurrogate load(const inputs::GateTensors& f, const Config& c) {
    require(c.layers >= 1 && c.hidden >= 1 && c.kv_heads >= 1, "Surrogate: layers = ", c.layers, ", hidden = ", c.hidden,
            ", kv_heads = ", c.kv_heads, " must each be >= 1");
    KVzapSurrogate s;
    s.config_ = c;
    s.mlp_ = is_mlp(f);
    require(s.mlp_ || f.contains(prefix(0) + "weight"), "Surrogate: '", f.source,
            "' holds no KVzap surrogate (neither layers.0.weight nor layers.0.0.weight)");
    if (s.mlp_) s.width_ = static_cast<int>(f.shape(prefix(0) + "0.weight").at(0));
    const std::int64_t I = s.width_, D = c.hidden, H = c.kv_heads;
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = prefix(l);
      if (s.mlp_)
        s.layers_.push_back(Layer{f.floats(p + "0.weight", {I, D}), f.floats(p + "0.bias", {I}),
                                  f.floats(p + "2.weight", {H, I}), f.floats(p + "2.bias", {H})});
      else
        s.layers_.push_back(Layer{f.floats(p + "weight", {H, D}), f.floats(p + "bias", {H}), {}, {}});
    }
    require(!f.contains(prefix(c.layers) + (s.mlp_ ? "0.weight" : "weight")), "Surrogate: '", f.source,
            "' holds more layers than the model's ", c.layers);
    return s;
  }

  const Config& config() const { return config_; }
  bool mlp() const { return mlp_; }
  /// The MLP's width I; 0 for a linear surrogate.
  int width() const { return width_; }

  /// x [T, D] (layer `layer`'s attention input) -> scores [Hkv, T] (the layout Cache::append
  /// takes). Throws for a layer out of range, a shape mismatch, or an x that is not finite.
  void forward(int layer, View<const float, 2> x, View<float, 2> scores) const {
    require(layer >= 0 && layer < config_.layers, "Surrogate: layer ", layer, " out of range [0, ", config_.layers, ")");
    const std::int64_t T = x.dim(0), D = config_.hidden, H = config_.kv_heads;
    require_shape(x, {T, D}, "Surrogate: x");
    require_finite(x, "Surrogate: x");
    require_shape(View<const float, 2>(scores), {H, T}, "Surrogate: scores");
    const Layer& w = layers_[static_cast<std::size_t>(layer)];
    std::vector<float> hidden(static_cast<std::size_t>(width_));
    for (std::int64_t t = 0; t < T; ++t) {
      const float* xt = x.data + t * D;
      if (mlp_) {
        for (int i = 0; i < width_; ++i)
          hidden[static_cast<std::size_t>(i)] = math::gelu(affine(w.w1, w.b1, i, xt, D));
        for (std::int64_t h = 0; h < H; ++h) scores.data[h * T + t] = affine(w.w2, w.b2, h, hidden.data(), width_);
      } else {
        for (std::int64_t h = 0; h < H; ++h) scores.data[h * T + t] = affine(w.w1, w.b1, h, xt, D);
      }
    }
  }

 private:
  struct Layer {
    std::vector<float> w1, b1;  // linear: W [Hkv, D], b [Hkv]; mlp: W1 [I, D], b1 [I]
    std::vector<float> w2, b2;  // mlp only: W2 [Hkv, I], b2 [Hkv]
  };
  /// Row `row` of the affine map (weight [rows, n], bias [rows]) at x [n], summed in double.
  static float affine(const std::vector<float>& weight, const std::vector<float>& bias, std::int64_t row, const float* x,
                      std::int64_t n) {
    const float* wr = weight.data() + row * n;
    double acc = bias[static_cast<std::size_t>(row)];
    for (std::int64_t j = 0; j < n; ++j) acc += static_cast<double>(wr[j]) * x[j];
    return static_cast<float>(acc);
  }

  Config config_;
  bool mlp_ = false;
  int width_ = 0;
  std::vector<Layer> layers_;
};

/// KVzap's input source (inputs/source.hpp): the surrogate named by --gate, on each layer's normed
/// input, writes each new entry's frozen score [Hkv, T].
struct KVzapInputs {
  static constexpr std::string_view name = "surrogate";
  static constexpr inputs::Scores scores = inputs::Scores::score;
  static constexpr bool gated = true;

  template <class P>
  static inputs::Needs needs(const registry::Values&) {
    inputs::Needs n;
    n.normed_input = true;
    return n;
  }
  template <class P>
  static inputs::Producer producer(const registry::Values& v, const inputs::ModelShape& m) {
    const int D = m.hidden;
    require(D >= 1, "inputs::producer: policy ", P::name, ": the hidden size D = ", D, " must be >= 1");
    auto s = std::make_shared<const KVzapSurrogate>(
        KVzapSurrogate::load(inputs::read_gate(v.text("gate")), {m.cache.layers, D, m.cache.kv_heads}));
    return {needs<P>(v),
            [s, D](std::int64_t, int l, const inputs::LayerActivations& a, View<float, 2> out) {
              inputs::detail::require_given(a.normed_input, "normed input");
              require_shape(a.normed_input, {out.dim(1), D}, "inputs::Producer: normed input");
              s->forward(l, a.normed_input, out);
            },
            {}, {}};
  }
  /// A linear surrogate of small random weights (normal, sigma 0.05, a fixed seed) for the model,
  /// every bias `level`: its scores sit near `level`.
  static void example_gate(const inputs::GateSink& add, const inputs::ModelShape& m, float level) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    const int H = m.cache.kv_heads, D = m.hidden;
    for (int l = 0; l < m.cache.layers; ++l) {
      std::vector<float> w(static_cast<std::size_t>(H) * static_cast<std::size_t>(D));
      for (auto& e : w) e = normal(rng);
      add(KVzapSurrogate::prefix(l) + "weight", {H, D}, w);
      add(KVzapSurrogate::prefix(l) + "bias", {H}, std::vector<float>(static_cast<std::size_t>(H), level));
    }
  }
};

inline KVzapEvictor kvzap_evictor(const KVzapConfig& c = {}) { return KVzapEvictor{c.tau, c.window}; }

/// KVzap's Cache: the surrogate's scores in place of log_beta at every step (score::Frozen).
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using KVzapCache = Cache<score::Frozen, admit::All, KVzapEvictor, memory::Paged<PageSize, Storage>, Backend>;

namespace policies {

/// KVzap's registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it; the engines compute its scores by
/// its input source (KVzapInputs: the surrogate given as --gate).
struct kvzap {
  static constexpr std::string_view name = "kvzap";
  static constexpr std::string_view help =
      "KVzap: a small model on each token's normed input predicts its KVzip score; past the window, entries below tau leave";
  using Config = KVzapConfig;
  static constexpr std::tuple fields{
      registry::bind(&Config::tau, registry::Option{"tau", registry::Kind::real, 0,
                                                    "tau: an entry past the window leaves when its predicted log score is < tau"}),
      registry::field::window<Config>.with_help("W, the newest entries of every head, kept whatever their score")};
  static constexpr auto options = registry::options_of(
      fields, registry::option::gate.with_help("KVzap's surrogate, a safetensors file under kvpress's KVzapModel names"));
  using inputs = KVzapInputs;
  using scorers = registry::scorers<score::Frozen>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    Cache<score::Frozen, admit::All, KVzapEvictor, Alloc, Backend> cache(shape, std::move(pool),
                                                                         kvzap_evictor(registry::read<Config>(v, fields)));
    return f(cache);
  }
};

}  // namespace policies

}  // namespace kvpolicy
