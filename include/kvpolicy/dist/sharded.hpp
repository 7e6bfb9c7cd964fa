/// \file
/// kvpolicy/dist/sharded.hpp — a pooled Evictor (evict::Global, evict::LayerWise: DBTrimKV's one
/// budget, SPEC §2) for a Cache that holds one tensor-parallel rank's share of the kv heads: the kv
/// heads [r * Hkv / TP, (r + 1) * Hkv / TP) of every layer, with their query heads. Each rank's
/// Cache keeps exactly the entries the unsharded Cache keeps in those heads: its trigger fires on
/// each pool's length summed over the ranks, its selection is dist::select_pools (dist/select.hpp).
///
///   dist::Mpi comm(tp_group);
///   const CacheShape full{L, Hkv, Hq, d};
///   dist::Sharded<evict::Global, dist::Mpi> e{dbtrimkv_evictor(config), &comm, full};
///   Cache<score::Lookahead, admit::All, decltype(e), memory::Paged<16>, cpu_backend> cache(e.local_shape(), pool, e,
///                                                                                   scorer);
///
/// Every rank must commit the same sequences' steps in the same order (each commit of a firing pool
/// runs collectives); the engine's TP group does, running one forward pass. A refusal of the step's
/// input is agreed before it goes in (dist::step); a user-defined Scorer's NaN in the commit's
/// scoring is agreed there (agree_on), so every rank refuses the commit with the same error. Either
/// backend: the device Cache (cuda_backend) scores and compacts on the GPU and runs this selection
/// on the host over the scores it reads back (cuda/executor.cuh).
#pragma once

#include <array>
#include <type_traits>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/dist/agree.hpp"
#include "kvpolicy/dist/communicator.hpp"
#include "kvpolicy/dist/select.hpp"
#include "kvpolicy/cache/evictor_hooks.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"

namespace kvpolicy::dist {

/// A pooled Evictor over the heads of every rank: each rank ranks its own heads, and the group keeps what the
/// unsharded Cache would (dist/select.hpp).
template <Evictor E, Communicator C>
  requires evictor_states_selection<E> && (!selects_per_head<E>)
struct Sharded {
  E inner;                // the pooled Evictor, as the unsharded Cache would take it
  C* comm = nullptr;      // the TP group (the engine's; outlives the Cache)
  CacheShape full{};      // the unsharded shape: every rank's heads together

  /// This rank's Cache shape: Hkv / TP kv heads and Hq / TP query heads of every layer.
  CacheShape local_shape() const {
    require(comm != nullptr, "dist::Sharded: no communicator");
    return CacheShape{full.layers, full.kv_heads / comm->size(), full.q_heads / comm->size(), full.head_dim};
  }
  /// The global (layer, kv head) index of this rank's local head `local` (layer-major).
  std::int64_t global_head(std::int64_t local) const {
    const std::int64_t per = full.kv_heads / comm->size();
    return (local / per) * full.kv_heads + comm->rank() * per + local % per;
  }

  void validate(const CacheShape& shape) const {
    require(comm != nullptr, "dist::Sharded: no communicator");
    full.validate();
    inner.validate(full);
    require(full.kv_heads % comm->size() == 0, "dist::Sharded: Hkv = ", full.kv_heads, " kv heads do not split over ",
            comm->size(), " ranks");
    const std::int64_t group = inner.group_heads(full);
    require(group % full.kv_heads == 0, "dist::Sharded: a pool of ", group,
            " heads is not whole layers; only layer-aligned pools shard by kv head");
    require(shape == local_shape(), "dist::Sharded: rank ", comm->rank(), "'s Cache has shape L = ", shape.layers,
            ", Hkv = ", shape.kv_heads, ", Hq = ", shape.q_heads, ", d = ", shape.head_dim, "; its share of the full ",
            "shape is Hkv = ", local_shape().kv_heads, ", Hq = ", local_shape().q_heads);
  }
  template <class S>
    requires evictor_checks_scorer<E, S>
  void validate_scorer(const S& s) const {
    inner.validate_scorer(s);
  }

  /// Each pool's local share: its heads on this rank (the pools are whole layers).
  std::int64_t group_heads(const CacheShape&) const { return inner.group_heads(full) / comm->size(); }
  /// The pool fires on its length over every rank (one all-reduce of one count): every rank decides
  /// as the unsharded trigger does. The Cache calls trigger() instead, which sums every pool at once.
  bool fires(std::int64_t length, std::int64_t heads, StepContext c) const {
    std::array<std::int64_t, 1> total{length};
    comm->all_reduce_sum(total);
    return inner.fires(total[0], heads * comm->size(), c);
  }
  /// The trigger of every pool of the sequence in one all-reduce of one count per pool
  /// (dist::trigger_pools): one round trip a step, whatever the number of pools.
  bool trigger(const CacheShape&, StepContext c, std::span<const std::int64_t> lengths,
               std::span<std::uint8_t> active) const {
    std::vector<std::int64_t> heads(lengths.size());
    for (std::size_t j = 0; j < lengths.size(); ++j) heads[j] = global_head(static_cast<std::int64_t>(j));
    return trigger_pools(*comm, inner, full, c, lengths, heads, active);
  }
  /// The commit's scoring, refused on every rank when it is on any (a user-defined Scorer's NaN).
  template <class F>
  void agree_on(F&& score) const {
    agree(*comm, score);
  }
  /// The pooled selection over the ranks (dist::select_pools): the survivors the unsharded Cache keeps.
  void select(const CacheShape&, StepContext, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    std::vector<std::int64_t> heads(static_cast<std::size_t>(s.segments()));
    for (std::int64_t j = 0; j < s.segments(); ++j) heads[static_cast<std::size_t>(j)] = global_head(j);
    select_pools(*comm, inner.selection(), inner.group_heads(full), full.heads_total(), s, heads, keep);
  }
};

/// WG-KV's hard budget (SPEC §3, evict::WriteGatedBudget with score::GatedObservedAttention:
/// WGKVBudgetCache) for a Cache that holds one rank's share of the kv heads. The budget weighs the
/// sequence's global caches, every head of every rank, against one sum: the sequence's entries
/// (which the scorer compares with the budget) and its global total (which the selection does) are
/// each summed over the ranks by one all-reduce; each head's drop is its own. Its trigger fires at
/// every commit, so that every rank plans (and runs those collectives) at every step: a head that
/// the unsharded trigger leaves alone (it holds no more than its ring) keeps everything here too,
/// since its ring is protected. Hence its reports say `triggered` at every commit.
template <Communicator C>
struct ShardedWriteGatedBudget {
  evict::WriteGatedBudget inner;  // as the unsharded Cache would take it: budget L * Hkv * M_avg
  C* comm = nullptr;
  CacheShape full{};

  CacheShape local_shape() const {
    require(comm != nullptr, "dist::ShardedWriteGatedBudget: no communicator");
    return CacheShape{full.layers, full.kv_heads / comm->size(), full.q_heads / comm->size(), full.head_dim};
  }
  AttentionMask attention_mask() const { return inner.attention_mask(); }
  void validate(const CacheShape& shape) const {
    require(comm != nullptr, "dist::ShardedWriteGatedBudget: no communicator");
    full.validate();
    inner.validate(full);
    require(full.kv_heads % comm->size() == 0, "dist::ShardedWriteGatedBudget: Hkv = ", full.kv_heads,
            " kv heads do not split over ", comm->size(), " ranks");
    require(shape == local_shape(), "dist::ShardedWriteGatedBudget: rank ", comm->rank(), "'s Cache has Hkv = ",
            shape.kv_heads, ", Hq = ", shape.q_heads, "; its share is Hkv = ", local_shape().kv_heads, ", Hq = ",
            local_shape().q_heads);
  }
  template <class S>
  void validate_scorer(const S& s) const {
    inner.validate_scorer(s);
  }
  template <class F>
  void agree_on(F&& score) const {
    agree(*comm, score);
  }
  /// The sequence's entries over every rank: what the scorer weighs against the budget.
  StepContext shared_context(StepContext c) const {
    std::array<std::int64_t, 1> entries{c.entries};
    comm->all_reduce_sum(entries);
    c.entries = entries[0];
    return c;
  }
  /// The budget binds when the global caches of every rank together pass it: one all-reduce.
  bool budget_binds(StepContext, std::span<const EntryMeta> meta, std::span<const std::int64_t> offsets) const {
    std::array<std::int64_t, 1> total{inner.global_total(meta, offsets)};
    comm->all_reduce_sum(total);
    return inner.budget_entries > 0 && total[0] > inner.budget_entries;
  }
  std::int64_t group_heads(const CacheShape& shape) const { return shape.heads_total(); }
  bool fires(std::int64_t, std::int64_t, StepContext) const { return true; }
  void select(const CacheShape&, StepContext c, const SegmentedScores& s, std::span<std::uint8_t> keep) const {
    inner.select_within(c, s, keep, [&](std::int64_t total) {
      std::array<std::int64_t, 1> sum{total};
      comm->all_reduce_sum(sum);
      return sum[0];
    });
  }
};

/// The Evictor a rank's Cache takes where the unsharded Cache takes `e`, handed to f: a per-head
/// Evictor as it is (its heads need nothing from other ranks; so one that selects each head alone), a pooled one as Sharded, WG-KV's hard
/// budget as ShardedWriteGatedBudget. So a registered policy's Cache shards without a word of its
/// own (apps/lm's --tp builds each rank's Cache from the unsharded one's parts).
template <Evictor E, Communicator C, class F>
decltype(auto) with_sharded_evictor(const E& e, C* comm, const CacheShape& full, F&& f) {
  if constexpr (std::is_same_v<E, evict::WriteGatedBudget>) {
    return f(ShardedWriteGatedBudget<C>{e, comm, full});
  } else if constexpr (selects_per_head<E>) {
    require(e.group_heads(full) == 1, "dist::with_sharded_evictor: a per-head selection whose trigger pools ",
            e.group_heads(full), " heads has no sharded form");
    return f(e);
  } else if constexpr (EvictorHooks<E>::selects_heads_alone) {
    return f(e);
  } else if constexpr (EvictorHooks<E>::needs_every_token) {
    // SPEC §8 aggregates each position over every head of the sequence, across the ranks' shares
    fail("dist::with_sharded_evictor: token-level eviction (SPEC §8, --mode union) aggregates each position over "
         "every kv head, which a rank holding a share of them cannot; run it unsharded or with --mode per-head");
    return f(e);  // not reached: the refusal above is the answer, this keeps the return type
  } else if constexpr (!evictor_states_selection<E>) {
    // a rule of its own over every head (KVzip's global selection at a probe, SPEC §10) states no
    // pooled selection that Sharded could run across the ranks
    fail("dist::with_sharded_evictor: this policy selects over every kv head of the sequence by a rule of its own, "
         "which has no sharded form; run it unsharded");
    return f(e);  // not reached: the refusal above is the answer, this keeps the return type
  } else {
    return f(Sharded<E, C>{e, comm, full});
  }
}

}  // namespace kvpolicy::dist
