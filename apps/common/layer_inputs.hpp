// One layer's inputs of a step for a policy's producer (inputs::Producer::layer), from the flat
// buffers a program holds: kvpolicy-lm's decoder, kvpolicy-llama's captured tensors and
// kvpolicy-replay's trace each keep a layer's step as [T, D] rows and [Hkv, T, d] heads.
#pragma once

#include <cstdint>

#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/inputs/producer.hpp"

namespace kvpolicy::apps {

/// A layer's step as flat buffers; a null one was not computed (the producer's needs() say which
/// it reads).
struct LayerBuffers {
  const float* normed_input = nullptr;   ///< [T, D]: the attention's input after its RMSNorm
  const float* keys_pre_rope = nullptr;  ///< [Hkv, T, d]
  const float* keys = nullptr;           ///< [Hkv, T, d], after RoPE
  const float* values = nullptr;         ///< [Hkv, T, d]
};

/// The producer's per-entry inputs of sequence `seq`'s step of `T` tokens in `layer` -> out [Hkv, T].
inline void layer_inputs(const inputs::Producer& p, std::int64_t seq, int layer, const LayerBuffers& b,
                         const CacheShape& shape, int hidden, std::int64_t T, float* out) {
  const auto heads = [&](const float* x) {
    return x ? View<const float, 3>(x, {shape.kv_heads, T, shape.head_dim}) : View<const float, 3>{};
  };
  inputs::LayerActivations a;
  if (b.normed_input) a.normed_input = View<const float, 2>(b.normed_input, {T, hidden});
  a.keys_pre_rope = heads(b.keys_pre_rope);
  a.keys = heads(b.keys);
  a.values = heads(b.values);
  p.layer(seq, layer, a, View<float, 2>(out, {shape.kv_heads, T}));
}

}  // namespace kvpolicy::apps
