/// \file
/// kvpolicy/core/shape.hpp — the model geometry a cache is built for (SPEC, Notation).
#pragma once

#include <cstdint>

#include "kvpolicy/core/error.hpp"

namespace kvpolicy {

/// The model geometry a cache is built for (SPEC, Notation).
struct CacheShape {
  int layers = 0;     // L
  int kv_heads = 0;   // Hkv
  int q_heads = 0;    // Hq, a multiple of Hkv (GQA group G = Hq / Hkv)
  int head_dim = 0;   // d

  constexpr int group() const { return q_heads / kv_heads; }
  constexpr std::int64_t heads_total() const { return std::int64_t{layers} * kv_heads; }

  /// Throws unless layers >= 1, kv_heads >= 1, q_heads is a positive multiple of kv_heads, and
  /// head_dim >= 1. The Cache calls it at construction.
  void validate() const {
    require(layers >= 1, "CacheShape: layers = ", layers, " must be >= 1");
    require(kv_heads >= 1, "CacheShape: kv_heads = ", kv_heads, " must be >= 1");
    require(q_heads >= kv_heads && q_heads % kv_heads == 0, "CacheShape: q_heads = ", q_heads,
            " must be a positive multiple of kv_heads = ", kv_heads);
    require(head_dim >= 1, "CacheShape: head_dim = ", head_dim, " must be >= 1");
  }
  friend constexpr bool operator==(const CacheShape&, const CacheShape&) = default;
};

/// The flat index of (layer, kv head) used by every per-head table: layer-major, as the global
/// ranking's tie-break orders heads (SPEC, Ties).
constexpr std::int64_t head_index(const CacheShape& s, int layer, int head) {
  return std::int64_t{layer} * s.kv_heads + head;
}

}  // namespace kvpolicy
