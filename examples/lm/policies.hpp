// kvpolicy-lm's policies by name: each name makes its kvpolicy Cache (one pool for every sequence)
// and the metadata its entries need from the forward pass, then hands both to the caller.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "decoder.hpp"
#include "kvpolicy/inputs/producer.hpp"
#include "kvpolicy/registry.hpp"
#include "kvpolicy/trimkv.hpp"

namespace kvpolicy::lm {

/// A policy by its registry name and the options given to it (registry::Selection); full by default.
struct PolicyOptions : registry::Selection {
  PolicyOptions() { policy = "full"; }
};

/// The options as given, with the model's RoPE described to a policy that takes it (registry
/// option::model_options): this decoder rotates adjacent pairs by θ = the model's rope_base.
template <registry::Policy P>
registry::Values values_for_model(registry::Selection given, const Config& c) {
  given.describe_model("rope-theta", c.rope_base).describe_model("rope-layout", "adjacent");
  require(!registry::takes(P::name, "rope-theta") || c.rope_dim == c.head_dim, "kvpolicy-lm: policy ", P::name,
          " undoes RoPE on every component; this model rotates ", c.rope_dim, " of its ", c.head_dim);
  return registry::values<P>(given.given);
}

/// What policy P's entries need from the forward pass: the library's producer of its inputs
/// (kvpolicy/inputs/producer.hpp), handed what this decoder computes.
template <registry::Policy P>
EntryMetadata entry_metadata(const registry::Values& v, const Config& c) {
  const CacheShape shape = c.cache_shape();
  const inputs::Producer p = inputs::producer<P>(v, {shape, c.hidden});
  const inputs::Needs& needs = p.needs();
  require(needs.key_layout != inputs::RopeLayout::half, "kvpolicy-lm: policy ", P::name,
          "'s gate was trained on keys in RoPE's rotate-half layout; this decoder's keys pair components adjacently");
  EntryMetadata m;
  if (needs.per_layer())
    m.layer = [p, shape, D = c.hidden](std::int64_t seq, int l, const Matrix& h, const std::vector<float>& k_pre,
                                      const std::vector<float>& k, const std::vector<float>& val, std::int64_t T,
                                      float* out) {
      const auto kv = [&](const std::vector<float>& x) {
        return View<const float, 3>(x.empty() ? nullptr : x.data(), {shape.kv_heads, T, shape.head_dim});
      };
      p.layer(seq, l, {View<const float, 2>(h.data(), {T, D}), kv(k_pre), kv(k), kv(val)},
              View<float, 2>(out, {shape.kv_heads, T}));
    };
  if (needs.per_token())
    m.hidden = {(*needs.bands)[0], (*needs.bands)[1],
                [p, D = c.hidden](std::int64_t seq, const Matrix& h_a, const Matrix& h_b, float* out) {
                  const std::int64_t T = h_a.rows();
                  p.tokens(seq, View<const float, 2>(h_a.data(), {T, D}), View<const float, 2>(h_b.data(), {T, D}),
                           std::span<float>(out, static_cast<std::size_t>(T)));
                }};
  return m;
}

/// The dtype the cache stores K and V in: fp16 (llama.cpp's default cache type; half the bytes a
/// decode step reads) or fp32. Attention widens each entry to fp32 as it reads it.
enum class KvDtype { f16, f32 };

/// f(std::type_identity<Storage>{}) with the Storage type `kv` names.
template <class F>
decltype(auto) with_kv_storage(KvDtype kv, F&& f) {
  if (kv == KvDtype::f16) return f(std::type_identity<half>{});
  return f(std::type_identity<float>{});
}

/// Makes the Cache `o` names for `sequences` sequences of up to `max_tokens` tokens each (steps of
/// up to `chunk` tokens), its K/V stored as `kv`, and calls f(cache, metadata). The pool holds every
/// token in every head: the policy, not the pool, bounds what stays (docs/quality.md reports the
/// entries held).
template <class F>
decltype(auto) with_policy(const PolicyOptions& o, KvDtype kv, const Config& c, std::int64_t sequences,
                           std::int64_t max_tokens, F&& f) {
  const CacheShape shape = c.cache_shape();
  const std::int64_t pages = pages_for(shape, max_tokens + 16, sequences, 16);
  return with_kv_storage(kv, [&]<class Storage>(std::type_identity<Storage>) -> decltype(auto) {
    return registry::visit(o.policy, [&]<registry::Policy P>() -> decltype(auto) {
      const registry::Values v = values_for_model<P>(o, c);
      const EntryMetadata meta = entry_metadata<P>(v, c);
      return P::template make<cpu_backend>(v, shape, memory::Paged<16, Storage>(pages),
                                           [&](auto& cache) -> decltype(auto) { return f(cache, meta); });
    });
  });
}

}  // namespace kvpolicy::lm
