// The keys an engine keeps, for tests of a cache over engine-owned K/V whose policy reads them
// (SPEC §9, core/engine_keys.hpp).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/core/engine_keys.hpp"

namespace kvpolicy::testing {

// The keys an engine keeps, as a test engine holds them: a row of type T per (layer, kv head,
// position), written as each step's keys arrive (as llama.cpp writes its cells), read through
// EngineKeys (SPEC §9).
template <class T>
struct EngineStore {
  static constexpr std::int64_t kPositions = 200;
  CacheShape shape;
  std::vector<T> rows = std::vector<T>(static_cast<std::size_t>(shape.layers * shape.kv_heads * kPositions * shape.head_dim));
  std::vector<std::uint8_t> held = std::vector<std::uint8_t>(static_cast<std::size_t>(shape.layers * shape.kv_heads * kPositions), 0);
  std::size_t at(int l, int h, std::int64_t p) const {
    return static_cast<std::size_t>((std::int64_t{l} * shape.kv_heads + h) * kPositions + p);
  }
  /// keys [L, Hkv, T, d] of positions n..n+T-1
  void write(View<const float, 4> keys, std::int64_t n) {
    for (int l = 0; l < shape.layers; ++l)
      for (int h = 0; h < shape.kv_heads; ++h)
        for (std::int64_t t = 0; t < keys.dim(2); ++t) {
          held[at(l, h, n + t)] = 1;
          for (std::int64_t c = 0; c < shape.head_dim; ++c)
            rows[at(l, h, n + t) * static_cast<std::size_t>(shape.head_dim) + static_cast<std::size_t>(c)] = from_float<T>(keys(l, h, t, c));
        }
  }
  EngineKeys keys() {
    constexpr KeyType type = std::is_same_v<T, half> ? KeyType::float16 : std::is_same_v<T, bfloat16> ? KeyType::bfloat16 : KeyType::float32;
    return {type, [this](std::int64_t seq, int l, int h, std::int32_t p) -> const void* {
              if (seq != 0 || p < 0 || p >= kPositions || !held[at(l, h, p)]) return nullptr;
              return rows.data() + at(l, h, p) * static_cast<std::size_t>(shape.head_dim);
            }};
  }
};

}  // namespace kvpolicy::testing
