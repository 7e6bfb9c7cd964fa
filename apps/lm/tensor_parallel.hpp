// kvpolicy-lm --tp N under mpirun (docs/distributed.md, "A model over ranks"): the model split
// Megatron style over the N ranks of an MPI communicator, each rank's K/V in a Cache of its kv heads.
//   - q, k, v and the MLP's gate and up are split by rows (column-parallel): rank r computes its
//     query heads [r Hq/N, (r+1) Hq/N), their kv heads and its F/N of the MLP's width;
//   - o and down are split by columns (row-parallel): their products are partial sums, added over
//     the ranks by one all-reduce after the attention and one after the MLP of every layer
//     (Decoder's reduce);
//   - embeddings, norms and the output head are every rank's, so every rank computes the logits.
// A rank's Cache is the registered policy's, opened for this rank (registry::open_sharded): per-head
// policies need nothing from other ranks, and DBTrimKV's and WG-KV's budgets are summed over them. The policy's per-head metadata (gates, K/V statistics) is
// computed by the unsharded gate on this rank's heads (shard_metadata).
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "../common/survivors.hpp"
#include "decoder.hpp"
#include "kvpolicy/dist/communicator.hpp"
#include "kvpolicy/open_sharded.hpp"
#include "model.hpp"
#include "policies.hpp"

namespace kvpolicy::lm {

/// Rank `rank`'s share of `full` over `ranks` ranks (F32 weights: the GGUF's blocks are not split).
inline Model shard_model(const Model& full, int rank, int ranks) {
  const Config& c = full.config;
  require(ranks >= 1 && rank >= 0 && rank < ranks, "kvpolicy-lm: rank ", rank, " of ", ranks);
  require(c.kv_heads % ranks == 0 && c.ffn % ranks == 0, "kvpolicy-lm: --tp ", ranks, " must divide the model's ",
          c.kv_heads, " kv heads and its MLP width ", c.ffn);
  Model m;
  m.config = c;
  m.config.q_heads = c.q_heads / ranks;
  m.config.kv_heads = c.kv_heads / ranks;
  m.config.ffn = c.ffn / ranks;
  m.embed.dense = full.embed.dense;
  m.output.dense = full.output.dense;
  m.output_norm = full.output_norm;
  const std::int64_t q = std::int64_t{m.config.q_heads} * c.head_dim, kv = std::int64_t{m.config.kv_heads} * c.head_dim,
                     f = m.config.ffn;
  const auto rows = [](const Weight& w, std::int64_t at, std::int64_t n) { return Weight{w.dense.middleRows(at, n), {}}; };
  const auto cols = [](const Weight& w, std::int64_t at, std::int64_t n) { return Weight{w.dense.middleCols(at, n), {}}; };
  for (const LayerWeights& w : full.layers)
    m.layers.push_back(LayerWeights{w.attn_norm, w.ffn_norm, rows(w.wq, rank * q, q), rows(w.wk, rank * kv, kv),
                                    rows(w.wv, rank * kv, kv), cols(w.wo, rank * q, q), rows(w.w_gate, rank * f, f),
                                    rows(w.w_up, rank * f, f), cols(w.w_down, rank * f, f)});
  return m;
}

/// The policy's per-layer metadata for this rank's kv heads: the unsharded one run on the full
/// head count, this rank's keys and values in its rows and zeros in the others' (each head's
/// metadata reads its own head only), and this rank's rows taken.
inline EntryMetadata shard_metadata(EntryMetadata meta, const Config& full, int rank, int ranks) {
  if (!meta.layer) return meta;
  const int local = full.kv_heads / ranks;
  meta.layer = [inner = meta.layer, full, rank, local](std::int64_t seq, int l, const Matrix& h,
                                                         const std::vector<float>& keys_pre, const std::vector<float>& keys,
                                                         const std::vector<float>& values, std::int64_t T, float* out) {
    const std::size_t part = keys.size(), at = static_cast<std::size_t>(rank) * part;
    std::vector<float> kp(part * static_cast<std::size_t>(full.kv_heads / local), 0.0f), k(kp.size(), 0.0f), v(kp.size(), 0.0f);
    std::copy(keys_pre.begin(), keys_pre.end(), kp.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(keys.begin(), keys.end(), k.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(values.begin(), values.end(), v.begin() + static_cast<std::ptrdiff_t>(at));
    std::vector<float> all(static_cast<std::size_t>(full.kv_heads * T));
    inner(seq, l, h, kp, k, v, T, all.data());
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(std::int64_t{rank} * local * T), local * T, out);
  };
  return meta;
}

/// with_policy for one rank of `comm`: calls f(cache, metadata) with this rank's Cache of the policy
/// `o` names (registry::open_sharded: its share of the kv heads of every layer, K/V stored as `kv`)
/// and the metadata for its heads.
template <dist::Communicator C, class F>
decltype(auto) with_sharded_policy(const registry::Selection& o, KvStorage kv, const Config& full, C& comm, std::int64_t sequences,
                                   std::int64_t max_tokens, F&& f) {
  const CacheShape shape = full.cache_shape();
  const registry::Selection sel = for_model(o, full);
  const std::int64_t pages = pages_for(registry::rank_shape(shape, comm), max_tokens + 16, sequences, registry::page_entries);
  const registry::Opened p = with_lm_storage(kv, [&]<class Storage>(std::type_identity<Storage>) {
    return registry::open_sharded<Storage>(sel, {shape, full.hidden}, pages, comm);
  });
  return f(*p.cache, shard_metadata(entry_metadata(p.inputs, sel.policy, full), full, comm.rank(), comm.size()));
}

/// A digest of what sequence `seq` holds: per (layer, kv head of the full model) a hash of its
/// entries' positions in order, this rank's heads filled and the others 0, to be summed over the
/// ranks; the same digest from an unsharded cache (rank 0 of 1) is the same numbers.
template <class CacheT>
std::vector<std::int64_t> survivor_digest(const CacheT& cache, std::int64_t seq, const Config& full, int rank) {
  const int local = cache.shape().kv_heads;
  std::vector<std::int64_t> digest(static_cast<std::size_t>(full.layers * full.kv_heads), 0);
  for (int l = 0; l < full.layers; ++l)
    for (int h = 0; h < local; ++h)
      digest[static_cast<std::size_t>(l * full.kv_heads + rank * local + h)] = apps::head_digest(cache, seq, l, h);
  return digest;
}

}  // namespace kvpolicy::lm
