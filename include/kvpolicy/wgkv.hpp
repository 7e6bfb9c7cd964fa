/// \file
/// kvpolicy/wgkv.hpp — WG-KV, write-gated admission (SPEC §3): a learned gate g per (layer, kv
/// head, token) from the pre- and post-RoPE keys; every head keeps its W_local = 256 newest tokens
/// (the local ring) and, of the older ones, those with g >= tau = 0.1 (the global cache, which grows
/// only by promotion); attention applies the vertical-slash mask.
///
///   auto gate = kvpolicy::gate::WriteGate::load(file, {.layers = L, .kv_heads = Hkv, .head_dim = d});
///   kvpolicy::WGKVCache<> cache(shape, kvpolicy::memory::Paged<16>(pages), kvpolicy::wgkv_evictor());
///   per layer l:  gate.forward(l, k_pre, k_post, g);             // [Hkv, T, d] x2 -> [Hkv, T]
///                 cache.append(seq, l, k_post, values, g);      // g in place of log_beta
///                 cache.attend(seq, l, queries, out);
///   cache.commit(seq);                                           // tokens that left the ring with g < tau go
///
/// Not in this release: the appendix-K SnapKV-style eviction of the global cache under a hard
/// budget, and a physically separate ring (the paged allocator holds both parts; the rule above
/// keeps exactly the ring's survivors, and compaction moves O(dropped) entries per step).
#pragma once

#include "kvpolicy/cache.hpp"
#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/policy/admit.hpp"
#include "kvpolicy/policy/evict.hpp"
#include "kvpolicy/policy/score.hpp"

namespace kvpolicy {

struct WGKVConfig {
  std::int64_t local = 256;  ///< W_local
  double tau = 0.1;          ///< admitted iff g >= tau
};

inline evict::WriteGated wgkv_evictor(const WGKVConfig& c = {}) { return evict::WriteGated{c.local, c.tau}; }

template <class Backend = cpu_backend, class Storage = float, int PageSize = 16>
using WGKVCache = Cache<score::Frozen, admit::All, evict::WriteGated, memory::Paged<PageSize, Storage>, Backend>;

}  // namespace kvpolicy
