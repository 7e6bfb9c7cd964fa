/// \file
/// kvpolicy/open_sharded.hpp — registry::open for one rank of a communicator: the Cache of the policy
/// a Selection names over this rank's share of the kv heads (tensor parallelism: rank r holds heads
/// [r Hkv/N, (r+1) Hkv/N) of every layer), its Evictor sharded by dist::with_sharded_evictor, and
/// the producer of its inputs for the whole model (each head's inputs read that head alone; the
/// engine takes this rank's rows). The Cache keeps &comm: the communicator outlives it.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>

#include "kvpolicy/dist/communicator.hpp"
#include "kvpolicy/dist/sharded.hpp"
#include "kvpolicy/open.hpp"

namespace kvpolicy::registry {

/// This rank's share of `full`: every layer, Hkv / N kv heads and Hq / N query heads. Throws unless N
/// divides both.
template <dist::Communicator C>
CacheShape rank_shape(const CacheShape& full, const C& comm) {
  const int n = comm.size();
  require(full.kv_heads % n == 0 && full.q_heads % n == 0, "registry::open_sharded: ", n, " ranks must divide the ",
          full.kv_heads, " kv heads and the ", full.q_heads, " query heads");
  return {full.layers, full.kv_heads / n, full.q_heads / n, full.head_dim};
}

/// The Cache `selection` names for this rank of `comm`, over a pool of `pages` pages (of this
/// rank's heads) of K/V stored as Storage. Built from the parts of the policy's unsharded Cache
/// (one page), whose Evictor dist::with_sharded_evictor gives its sharded form or refuses.
template <class Storage = float, dist::Communicator C>
std::unique_ptr<AnyCache> open_sharded_cache(const Selection& selection, const CacheShape& full, std::int64_t pages,
                                             C& comm) {
  using Pool = memory::Paged<page_entries, Storage>;
  const CacheShape local = rank_shape(full, comm);
  return detail::build<Storage>(selection, [&]<Policy P>(const Values& v) {
    return P::template make<cpu_backend>(v, full, Pool(1), [&](auto& whole) {
      using Whole = std::decay_t<decltype(whole)>;
      return dist::with_sharded_evictor(whole.evictor(), &comm, full, [&](auto evictor) {
        Cache<typename Whole::scorer_type, typename Whole::admitter_type, decltype(evictor), Pool, cpu_backend> mine(
            local, Pool(pages), evictor, whole.scorer(), whole.admitter());
        return detail::erased(mine);
      });
    });
  });
}

/// open_sharded_cache and the producer of the policy's inputs for the whole model.
template <class Storage = float, dist::Communicator C>
Opened open_sharded(const Selection& selection, const inputs::ModelShape& full, std::int64_t pages, C& comm) {
  inputs::Producer producer = open_inputs(selection, full);
  return {open_sharded_cache<Storage>(selection, full.cache, pages, comm), std::move(producer)};
}

}  // namespace kvpolicy::registry
