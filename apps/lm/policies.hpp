// kvpolicy-lm's policies by name: registry::open makes the Cache (one pool for every sequence) and
// the producer of what its entries need from the forward pass, handed to the caller as the decoder
// feeds it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../common/layer_inputs.hpp"
#include "decoder.hpp"
#include "tokenizer.hpp"
#include "kvpolicy/open.hpp"

namespace kvpolicy::lm {

/// The options as given, with the model's RoPE described to a policy that takes it (registry
/// option::model_options): this decoder rotates adjacent pairs by θ = the model's rope_base.
inline registry::Selection for_model(registry::Selection given, const Config& c) {
  given.describe_model("rope-theta", c.rope_base).describe_model("rope-layout", "adjacent");
  require(!registry::takes(given.policy, "rope-theta") || c.rope_dim == c.head_dim, "kvpolicy-lm: policy ",
          given.policy, " undoes RoPE on every component; this model rotates ", c.rope_dim, " of its ", c.head_dim);
  return given;
}

/// What the policy's entries need from the forward pass: its producer of inputs (registry::open),
/// handed what this decoder computes.
inline EntryMetadata entry_metadata(const inputs::Producer& p, const std::string& policy, const Config& c) {
  const CacheShape shape = c.cache_shape();
  const inputs::Needs& needs = p.needs();
  require(needs.key_layout != inputs::RopeLayout::half, "kvpolicy-lm: policy ", policy,
          "'s gate was trained on keys in RoPE's rotate-half layout; this decoder's keys pair components adjacently");
  EntryMetadata m;
  if (needs.per_layer())
    m.layer = [p, shape, D = c.hidden](std::int64_t seq, int l, const Matrix& h, const std::vector<float>& k_pre,
                                      const std::vector<float>& k, const std::vector<float>& val, std::int64_t T,
                                      float* out) {
      const auto data = [](const std::vector<float>& x) { return x.empty() ? nullptr : x.data(); };
      apps::layer_inputs(p, seq, l, {h.data(), data(k_pre), data(k), data(val)}, shape, D, T, out);
    };
  if (needs.per_token())
    m.hidden = {(*needs.bands)[0], (*needs.bands)[1],
                [p, D = c.hidden](std::int64_t seq, const Matrix& h_a, const Matrix& h_b, float* out) {
                  const std::int64_t T = h_a.rows();
                  p.tokens(seq, View<const float, 2>(h_a.data(), {T, D}), View<const float, 2>(h_b.data(), {T, D}),
                           std::span<float>(out, static_cast<std::size_t>(T)));
                }};
  m.reconstruction = needs.reconstruction;
  return m;
}

/// The probe a policy that reads a reconstruction runs after `prompt` (SPEC §10): its instruction,
/// "\n" where a chat template would put its assistant header (this program feeds raw text), then the
/// prompt's tokens from its prefix on. Empty for any other policy.
inline std::vector<int> probe_tokens(const EntryMetadata& m, const Tokenizer& tok, std::span<const int> prompt) {
  if (!m.reconstruction) return {};
  std::vector<int> out = tok.encode(std::string(m.reconstruction->instruction));
  for (const int id : tok.encode("\n")) out.push_back(id);
  const auto from = static_cast<std::size_t>(std::min<std::int64_t>(m.reconstruction->prefix, std::ssize(prompt)));
  out.insert(out.end(), prompt.begin() + static_cast<std::ptrdiff_t>(from), prompt.end());
  return out;
}

/// The K/V storage kvpolicy-lm offers (--kv): fp16 (llama.cpp's default cache type; half the bytes
/// a decode step reads) or fp32. Attention widens each entry to fp32 as it reads it.
template <class F>
decltype(auto) with_lm_storage(KvStorage kv, F&& f) {
  require(kv == KvStorage::float16 || kv == KvStorage::float32, "kvpolicy-lm: K/V stored as f16 or f32");
  if (kv == KvStorage::float16) return f(std::type_identity<half>{});
  return f(std::type_identity<float>{});
}

/// Opens the policy `o` names (registry::open) for `sequences` sequences of up to `max_tokens`
/// tokens each, its K/V stored as `kv`, and calls f(cache, metadata). The pool holds every token
/// in every head (and a probe's beside them): the policy, not the pool, bounds what stays
/// (docs/quality.md reports the entries held).
template <class F>
decltype(auto) with_policy(const registry::Selection& o, KvStorage kv, const Config& c, std::int64_t sequences,
                           std::int64_t max_tokens, F&& f) {
  const CacheShape shape = c.cache_shape();
  const registry::Selection sel = for_model(o, c);
  // a probe after the prompt (SPEC §10: KVzip) holds the prompt again beside it until its commit,
  // with its instruction (probe_tokens; under 48 tokens)
  const bool probes = registry::input_source(sel.policy).probes;
  const std::int64_t pages =
      pages_for(shape, (probes ? 2 * max_tokens + 48 : max_tokens) + 16, sequences, registry::page_entries);
  const registry::Opened p = with_lm_storage(kv, [&]<class Storage>(std::type_identity<Storage>) {
    return registry::open<Storage>(sel, {shape, c.hidden}, pages);
  });
  return f(*p.cache, entry_metadata(p.inputs, sel.policy, c));
}

}  // namespace kvpolicy::lm
