/// \file
/// kvpolicy/policy/selection.hpp — what an eviction keeps, stated once as data (SPEC §1–5). An
/// Evictor states its rule with three members, and both executors run that statement: the host
/// select() (evict::detail::select_heads / select_pools, over policy/rank.hpp) and the device's
/// evict_step (cuda/evict_step.cuh: its trigger kernel calls fires(), its selection kernels take
/// the selection's numbers):
///   group_heads(shape)              how many consecutive heads (head_index order) trigger and rank
///                                   together: 1 (per head), Hkv (a layer), L * Hkv (the sequence);
///   fires(group_length, heads, ctx) KVPOLICY_HD: whether a group holding group_length entries over
///                                   its `heads` heads evicts at this step;
///   head_selection()                what each triggered head keeps (per-head rules), or
///   pool_selection()                what each triggered group keeps (pooled rules, SPEC §2).
#pragma once

#include <concepts>
#include <cstdint>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/math.hpp"
#include "kvpolicy/core/shape.hpp"

namespace kvpolicy::evict {

/// What a triggered head keeps (SPEC §1 top-M and threshold, §3 ring and gate, §4 prompt + K, §5
/// sinks and window). Protected entries rank above every score (+inf); then the top `keep` by
/// (score, larger position) survive, or with `threshold` every entry scoring >= bound.
struct HeadSelection {
  std::int64_t keep = 0;      // survivors of the top-k variant (past the prompt, when keeps_prompt)
  bool threshold = false;     // keep score >= bound instead of a top-k
  float bound = 0.0f;         // log alpha (SPEC §1), or WG-KV's tau on the gate g (SPEC §3)
  std::int64_t window = 0;    // the w newest entries of the head are protected
  std::int64_t sinks = 0;     // the S oldest entries of the head are protected (SPEC §5)
  bool keeps_prompt = false;  // entries before StepContext::prompt are protected, and keep counts past them (SPEC §4)
};

/// What a triggered group of heads keeps (SPEC §2 global and layer-wise): each head's window and
/// sinks protected, then the pooled top group_heads * budget by (score, larger position, lower
/// head index); with floor_ratio f > 0 the pooled top floor((1 - f) K), then each head its top
/// (count among those + floor(budget f)); with threshold every entry scoring >= bound.
struct PoolSelection {
  std::int64_t budget = 0;   // M per head: the pool keeps group_heads * M
  double floor_ratio = 0.0;  // f in [0, 1)
  std::int64_t window = 0;
  std::int64_t sinks = 0;
  bool threshold = false;
  float bound = 0.0f;        // log alpha
};

/// An Evictor that states its rule as data (this file's three members): the rule the device runs.
template <class E>
concept StatedEvictor =
    requires(const E& e, const CacheShape& shape, std::int64_t length, StepContext c) {
      { e.group_heads(shape) } -> std::convertible_to<std::int64_t>;
      { e.fires(length, length, c) } -> std::same_as<bool>;
    } && (requires(const E& e) {
      { e.head_selection() } -> std::same_as<HeadSelection>;
    } || requires(const E& e) {
      { e.pool_selection() } -> std::same_as<PoolSelection>;
    });

template <class E>
constexpr bool selects_per_head = requires(const E& e) {
  { e.head_selection() } -> std::same_as<HeadSelection>;
};

}  // namespace kvpolicy::evict
