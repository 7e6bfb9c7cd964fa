/// \file
/// kvpolicy/core/rope.hpp — rotary position embedding (RoPE) as the cache sees it: a head's d
/// components rotate in d/2 pairs, pair i by the angle position · θ^(-2i/d). For parts that must
/// undo it (query statistics kept before RoPE: Expected Attention, docs/policies.md) or average it over a
/// range of positions. In double.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "kvpolicy/core/error.hpp"

namespace kvpolicy {

/// How a head's components pair up under RoPE: llama.cpp's adjacent pairs (2j, 2j + 1), which
/// kvpolicy-lm uses, or transformers' rotate-half pairs (j, j + d/2); any: the consumer's result
/// does not depend on the order of a key's components.
enum class RopeLayout { any, adjacent, half };

constexpr std::string_view rope_layout_name(RopeLayout l) {
  return l == RopeLayout::half ? "half" : l == RopeLayout::adjacent ? "adjacent" : "any";
}

/// A model's RoPE: the base θ and the layout of the pairs (unscaled RoPE, every component rotated).
struct Rope {
  double theta = 10000.0;
  RopeLayout layout = RopeLayout::half;

  void validate(std::int64_t head_dim) const {
    require(std::isfinite(theta) && theta >= 1.0, "Rope: theta = ", theta, " must be finite and >= 1");
    require(layout == RopeLayout::half || layout == RopeLayout::adjacent, "Rope: layout ", rope_layout_name(layout),
            " must be half or adjacent");
    require(head_dim % 2 == 0, "Rope: head_dim = ", head_dim, " must be even");
  }

  /// The components (a, b) that pair i of a d-wide head rotates: the first turns towards the second.
  std::pair<std::int64_t, std::int64_t> pair(std::int64_t i, std::int64_t d) const {
    return layout == RopeLayout::half ? std::pair{i, i + d / 2} : std::pair{2 * i, 2 * i + 1};
  }
  /// The angle of pair i at position p per unit of position: θ^(-2i/d).
  double frequency(std::int64_t i, std::int64_t d) const {
    return std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  }

  /// x (d components, rotated at `position`) rotated back: R(position)^T x, in place.
  void unrotate(std::span<double> x, std::int64_t position) const {
    const auto d = static_cast<std::int64_t>(x.size());
    for (std::int64_t i = 0; i < d / 2; ++i) {
      const double angle = static_cast<double>(position) * frequency(i, d), c = std::cos(angle), s = std::sin(angle);
      const auto [a, b] = pair(i, d);
      const double xa = x[static_cast<std::size_t>(a)], xb = x[static_cast<std::size_t>(b)];
      x[static_cast<std::size_t>(a)] = c * xa + s * xb;
      x[static_cast<std::size_t>(b)] = -s * xa + c * xb;
    }
  }

  /// The rotation averaged over positions first .. first + count - 1, R̄ = mean_p R(p): per pair i
  /// the 2x2 block [[c̄, -s̄], [s̄, c̄]] with c̄ = mean cos(p ω_i), s̄ = mean sin(p ω_i). Written as
  /// d/2 pairs (c̄_i, s̄_i) into `cs` [d].
  void averaged(std::int64_t first, std::int64_t count, std::span<double> cs) const {
    const auto d = static_cast<std::int64_t>(cs.size());
    for (std::int64_t i = 0; i < d / 2; ++i) {
      double c = 0.0, s = 0.0;
      for (std::int64_t p = first; p < first + count; ++p) {
        const double angle = static_cast<double>(p) * frequency(i, d);
        c += std::cos(angle);
        s += std::sin(angle);
      }
      cs[static_cast<std::size_t>(2 * i)] = c / static_cast<double>(count);
      cs[static_cast<std::size_t>(2 * i + 1)] = s / static_cast<double>(count);
    }
  }
};

}  // namespace kvpolicy
