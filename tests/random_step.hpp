// A random forward step for the Cache tests that run whole steps (the probe step's and KVzip's):
// keys, values and queries of T tokens for every layer, drawn from `draw`, with zero log_beta, as a
// SequenceStep, and each key or query read back by (layer, head, token, component).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kvpolicy/cache/step_state.hpp"
#include "kvpolicy/core/shape.hpp"

namespace kvpolicy::test {

/// A step of T tokens for every layer: keys, values, queries from `draw`.
struct Step {
  std::vector<float> k, v, lb, q, o;
  Step(const CacheShape& s, std::int64_t T, const std::function<float()>& draw)
      : k(static_cast<std::size_t>(s.layers * s.kv_heads * T * s.head_dim)), v(k.size()),
        lb(static_cast<std::size_t>(s.layers * s.kv_heads * T), 0.0f),
        q(static_cast<std::size_t>(s.layers * s.q_heads * T * s.head_dim)), o(q.size()) {
    for (float& x : k) x = draw();
    for (float& x : v) x = draw();
    for (float& x : q) x = draw();
  }
  SequenceStep view(const CacheShape& s, std::int64_t seq) {
    const std::int64_t T = static_cast<std::int64_t>(lb.size()) / (s.layers * s.kv_heads);
    return {seq,
            {k.data(), {s.layers, s.kv_heads, T, s.head_dim}},
            {v.data(), {s.layers, s.kv_heads, T, s.head_dim}},
            {lb.data(), {s.layers, s.kv_heads, T}},
            {q.data(), {s.layers, s.q_heads, T, s.head_dim}},
            {o.data(), {s.layers, s.q_heads, T, s.head_dim}}};
  }
  float key(const CacheShape& s, int l, int h, std::int64_t t, int x, std::int64_t T) const {
    return k[static_cast<std::size_t>(((l * s.kv_heads + h) * T + t) * s.head_dim + x)];
  }
  float query(const CacheShape& s, int l, int qh, std::int64_t t, int x, std::int64_t T) const {
    return q[static_cast<std::size_t>(((l * s.q_heads + qh) * T + t) * s.head_dim + x)];
  }
};

}  // namespace kvpolicy::test
