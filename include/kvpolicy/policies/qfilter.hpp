/// \file
/// kvpolicy/policies/qfilter.hpp — Q-Filters (Godey et al. 2025), as NVIDIA kvpress 0.5.5's
/// QFilterPress scores: one learned filter per (layer, kv head), a direction of the keys' space the
/// queries lean along; each entry scores s = -<f[l, h], k>, its key after RoPE against its head's
/// filter, computed once when the key is written and frozen; the per-head budget of SPEC §5 keeps
/// the M best. The filters are the file given as --gate, under kvpress's name: `q_filters`
/// [L, Hkv, d] (QFilters' state dict, as the authors publish them), so a published file loads
/// here. A filter's components pair up as RoPE pairs the keys' it was computed from: the file's
/// metadata `rope_layout` says how (half, transformers' and so the authors', where it says
/// nothing), and the filters are reordered at load to the layout of the engine's keys, the
/// `rope-layout` option an engine fills (kvpolicy-lm and kvpolicy-llama: adjacent). The score reads
/// only the step's keys, so the policy runs over an engine's own K/V.
///
///   kvpolicy::QFilterCache<> cache(shape, kvpolicy::memory::Paged<16>(pages), kvpolicy::baseline_evictor({.budget = 256}));
///   filters.score(layer, keys /* [Hkv, T, d] */, scores /* [Hkv, T] */);   // per layer
///   cache.step(seq, keys, values, scores /* [L, Hkv, T], in place of log_beta */);
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvpolicy/core/rope.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/inputs/source.hpp"
#include "kvpolicy/parts/score/retention.hpp"
#include "kvpolicy/policies/common/per_head_budget.hpp"
#include "kvpolicy/policies/common/token_level.hpp"
#include "kvpolicy/registry/fields.hpp"

namespace kvpolicy {

/// The filters of every (layer, kv head), loaded once; score() is const and keeps no state, so one
/// set may serve every thread at once.
class QFilters {
 public:
  /// kvpress's tensor name (the QFilters module's parameter).
  static constexpr std::string_view tensor = "q_filters";

  /// Loads `q_filters` [L, Hkv, d] (F32, F16 or BF16) for the model's shape, reordered from the
  /// file's RoPE layout (metadata `rope_layout`, half where unsaid) to `keys`, the layout of the keys
  /// it will score; throws, naming the file, for a missing tensor, another shape, a value that is
  /// not finite, or a layout other than half or adjacent.
  static QFilters load(const inputs::GateTensors& f, const CacheShape& shape, RopeLayout keys) {
    shape.validate();
    const auto it = f.metadata.find("rope_layout");
    const std::string saved = it == f.metadata.end() ? "half" : it->second;
    require(saved == "half" || saved == "adjacent", "QFilters: '", f.source, "' says rope_layout '", saved,
            "'; it must be half or adjacent");
    require(keys == RopeLayout::half || keys == RopeLayout::adjacent, "QFilters: the keys' layout must be half or adjacent");
    const Rope from{.layout = saved == "half" ? RopeLayout::half : RopeLayout::adjacent}, to{.layout = keys};
    QFilters q;
    q.shape_ = shape;
    const std::vector<float> file = f.floats(std::string(tensor), {shape.layers, shape.kv_heads, shape.head_dim});
    q.f_.resize(file.size());
    const std::int64_t d = shape.head_dim, heads = shape.heads_total();
    require(from.layout == to.layout || d % 2 == 0, "QFilters: head_dim = ", d, " must be even to change RoPE layout");
    for (std::int64_t h = 0; h < heads; ++h)
      if (from.layout == to.layout) {
        std::copy_n(file.begin() + h * d, d, q.f_.begin() + h * d);
      } else {
        for (std::int64_t i = 0; i < d / 2; ++i) {  // pair i: its two components, in each layout
          const auto [a, b] = from.pair(i, d);
          const auto [x, y] = to.pair(i, d);
          q.f_[static_cast<std::size_t>(h * d + x)] = file[static_cast<std::size_t>(h * d + a)];
          q.f_[static_cast<std::size_t>(h * d + y)] = file[static_cast<std::size_t>(h * d + b)];
        }
      }
    return q;
  }

  /// keys [Hkv, T, d] (layer `layer`'s new keys, after RoPE) -> scores [Hkv, T], each
  /// -<f[layer, h], k> summed in double and rounded once to fp32. Throws for a layer out of range, a
  /// shape mismatch, or a key that is not finite.
  void score(int layer, View<const float, 3> keys, View<float, 2> scores) const {
    require(layer >= 0 && layer < shape_.layers, "QFilters: layer ", layer, " out of range [0, ", shape_.layers, ")");
    const std::int64_t H = shape_.kv_heads, T = keys.dim(1), d = shape_.head_dim;
    require_shape(keys, {H, T, d}, "QFilters: keys");
    require_finite(keys, "QFilters: keys");
    require_shape(View<const float, 2>(scores), {H, T}, "QFilters: scores");
    for (std::int64_t h = 0; h < H; ++h) {
      const float* f = f_.data() + (std::int64_t{layer} * H + h) * d;
      for (std::int64_t t = 0; t < T; ++t) {
        const float* k = keys.data + (h * T + t) * d;
        double dot = 0.0;
        for (std::int64_t j = 0; j < d; ++j) dot += static_cast<double>(f[j]) * k[j];
        scores.data[h * T + t] = static_cast<float>(-dot);
      }
    }
  }

 private:
  CacheShape shape_;
  std::vector<float> f_;  // [L, Hkv, d]
};

/// Q-Filters' input source (inputs/source.hpp): the filters given as --gate, on each layer's new
/// keys after RoPE, write each new entry's frozen score [Hkv, T].
struct QFilterInputs {
  static constexpr std::string_view name = "q_filter";
  static constexpr inputs::Scores scores = inputs::Scores::score;
  static constexpr bool gated = true;

  template <class P>
  static inputs::Needs needs(const registry::Values&) {
    inputs::Needs n;
    n.keys = true;
    return n;
  }
  template <class P>
  static inputs::Producer producer(const registry::Values& v, const inputs::ModelShape& m) {
    const RopeLayout keys = v.choice("rope-layout") == 0 ? RopeLayout::half : RopeLayout::adjacent;
    auto q = std::make_shared<const QFilters>(QFilters::load(inputs::read_gate(v.text("gate")), m.cache, keys));
    return {needs<P>(v),
            [q](std::int64_t, int l, const inputs::LayerActivations& a, View<float, 2> out) {
              inputs::detail::require_given(a.keys, "keys");
              q->score(l, a.keys, out);
            },
            {}, {}};
  }
  /// Filters of small random components (normal, sigma 0.05, a fixed seed); they have no bias, so
  /// `level` changes nothing: the budget alone decides what stays.
  static void example_gate(const inputs::GateSink& add, const inputs::ModelShape& m, float) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    const CacheShape& s = m.cache;
    std::vector<float> f(static_cast<std::size_t>(s.layers) * static_cast<std::size_t>(s.kv_heads) *
                         static_cast<std::size_t>(s.head_dim));
    for (float& e : f) e = normal(rng);
    add(std::string(QFilters::tensor), {s.layers, s.kv_heads, s.head_dim}, f);
  }
};

/// Q-Filters' Cache: the filters' scores in place of log_beta at every step (score::Frozen), under
/// the per-head budget of SPEC §5.
template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using QFilterCache = PerHeadBudgetCache<score::Frozen, Backend, Storage, PageSize>;

namespace policies {

/// Q-Filters' registry entry (registry/policy.hpp): its name, help, options and make(), by which
/// `--policy`, registry::open and the Python package build it; the engines compute its scores by
/// its input source (QFilterInputs: the filters given as --gate, on the step's keys).
struct qfilter {
  static constexpr std::string_view name = "qfilter";
  static constexpr std::string_view help =
      "Q-Filters: each key scored against its head's learned filter when written, -<f, k>; per-head budget M";
  static constexpr auto fields = detail::baseline_fields;
  static constexpr auto options = registry::options_of(
      fields, registry::option::mode,
      registry::option::gate.with_help("the filters, a safetensors file holding q_filters [L, Hkv, d] (kvpress's QFilters)"),
      registry::option::rope_layout);
  using inputs = QFilterInputs;
  using scorers = registry::scorers<score::Frozen>;

  template <class Backend, class Alloc, class F>
  static decltype(auto) make(const registry::Values& v, const CacheShape& shape, Alloc pool, F&& f) {
    return detail::make_in_mode<Backend>(v, shape, std::move(pool),
                                         baseline_evictor(registry::read<BaselineConfig>(v, fields)), score::Frozen{},
                                         evict::Aggregate::max, std::forward<F>(f));
  }
};

}  // namespace policies

}  // namespace kvpolicy
