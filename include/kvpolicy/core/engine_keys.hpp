/// \file
/// kvpolicy/core/engine_keys.hpp — the keys an engine keeps, as a Cache over engine-owned K/V
/// reads them (SPEC §9): a Scorer that ranks by stored keys (KeyDiff) or by the attention over them
/// (H2O, TOVA, SnapKV) reads each entry's key where the engine holds it, when it needs it (a step's
/// attention, a commit's scoring), and the Cache keeps no copy. The engine says where a key is by
/// (sequence, layer, kv head, position); llama.cpp's integration answers from the cell each
/// position was written to (apps/llama/main.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <vector>

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/view.hpp"

namespace kvpolicy {

/// The element type of the engine's key rows.
enum class KeyType : std::uint8_t { float32, float16, bfloat16 };

/// Where an engine keeps its keys. row(seq, layer, kv_head, position) is the address of the key the
/// engine attends with at that position (after RoPE, as Cache::append takes keys): head_dim
/// elements of `type`, contiguous; nullptr where the engine holds no such key, which the Cache
/// reports as an error. The Cache calls it only inside its own calls (observe, commit, step), on the
/// thread that makes the call (calls on different sequences may run at once: docs/concurrency.md),
/// for positions it holds, the step's own included; an address must stay valid until that call
/// returns.
struct EngineKeys {
  KeyType type = KeyType::float16;
  std::function<const void*(std::int64_t seq, int layer, int kv_head, std::int32_t position)> row;
};

namespace memory {

/// f(std::type_identity<T>{}) with T the C++ type of the engine's key rows (float, half, bfloat16).
template <class F>
decltype(auto) with_key_type(KeyType type, F&& f) {
  switch (type) {
    case KeyType::float32: return f(std::type_identity<float>{});
    case KeyType::float16: return f(std::type_identity<half>{});
    case KeyType::bfloat16: return f(std::type_identity<bfloat16>{});
  }
  fail("EngineKeys: key type ", static_cast<int>(type), " is none of float32, float16, bfloat16");
}

/// The address of one entry's key in the engine; throws where the engine says it holds none.
inline const void* engine_key_row(const EngineKeys& keys, std::int64_t seq, int layer, int kv_head, std::int32_t position) {
  const void* row = keys.row(seq, layer, kv_head, position);
  require(row != nullptr, "EngineKeys: the engine holds no key for sequence ", seq, " layer ", layer, " kv head ",
          kv_head, " position ", position, ", an entry the cache holds");
  return row;
}

/// The keys of the entries `meta` (one head's, in that order) read from the engine and widened to
/// fp32 into `buffer`: [N, d], as a Scorer reads a head's stored keys.
inline View<const float, 2> read_engine_keys(const EngineKeys& keys, std::int64_t seq, int layer, int kv_head,
                                             std::span<const EntryMeta> meta, int d, std::vector<float>& buffer) {
  const auto N = static_cast<std::int64_t>(meta.size());
  buffer.resize(static_cast<std::size_t>(N * d));
  with_key_type(keys.type, [&]<class T>(std::type_identity<T>) {
    for (std::int64_t j = 0; j < N; ++j) {
      const auto* r = static_cast<const T*>(engine_key_row(keys, seq, layer, kv_head, meta[static_cast<std::size_t>(j)].position));
      for (int c = 0; c < d; ++c) buffer[static_cast<std::size_t>(j * d + c)] = to_float(r[c]);
    }
  });
  return View<const float, 2>{buffer.data(), {N, static_cast<std::int64_t>(d)}};
}

}  // namespace memory
}  // namespace kvpolicy
