/// \file
/// kvpolicy/core/rule.hpp — what an eviction keeps, as data (SPEC §1–5). An Evictor states its
/// rule with three members (core/concepts.hpp, concept Evictor), and both executors run that one
/// statement: the host's (parts/evict/selection.hpp, over parts/evict/rank.hpp) and the device's
/// (cuda/kernels/evict_step.cuh: its trigger kernel calls fires(), its selection kernels read these
/// structs as they are):
///   group_heads(shape)              how many consecutive heads (head_index order) trigger and rank
///                                   together: 1 (per head), Hkv (a layer), L * Hkv (the sequence);
///   fires(group_length, heads, ctx) KVPOLICY_HD: whether a group holding group_length entries over
///                                   its `heads` heads evicts at this step;
///   selection()                     what each triggered group keeps: a HeadSelection (per-head
///                                   rules) or a PoolSelection (pooled rules, SPEC §2).
#pragma once

#include <cstdint>

namespace kvpolicy::evict {

/// The budget and buffer a policy takes when none is given (SPEC §1's M and B), stated once: the
/// policies' configs, the Evictors and the registry's --budget and --buffer start from these.
inline constexpr std::int64_t default_budget = 1024;
inline constexpr std::int64_t default_buffer = 128;

/// What a triggered head keeps (SPEC §1 top-M and threshold, §3 ring and gate, §4 prompt + K, §5
/// sinks and window). Protected entries rank above every score (+inf); then the head's `guaranteed`
/// best (protections first) rank there too; then the top `keep` by (score, larger position)
/// survive, or with `threshold` every entry scoring >= bound.
struct HeadSelection {
  std::int64_t keep = 0;        // survivors of the top-k variant (past the prompt, when keeps_prompt)
  bool threshold = false;       // keep score >= bound instead of a top-k
  float bound = 0.0f;           // log alpha (SPEC §1), or WG-KV's tau on the gate g (SPEC §3)
  std::int64_t window = 0;      // the w newest entries of the head are protected
  std::int64_t sinks = 0;       // the S oldest entries of the head are protected (SPEC §5)
  bool keeps_prompt = false;    // entries before StepContext::prompt are protected, and keep counts past them (SPEC §4)
  std::int64_t guaranteed = 0;  // the threshold's floor (SPEC §1 min_tokens): the head's best this many
                                // (past the prompt, as keep) are kept whatever the bound
};

/// What a triggered group of heads keeps (SPEC §2 global and layer-wise; AdaKV's allocation): each
/// head's window and sinks protected, and its `guaranteed` best (AdaKV's safeguard), then the pooled
/// top group_heads * budget by (score, larger position, lower head index); with floor_ratio f > 0
/// the pooled top floor((1 - f) K), then each head its top (count among those + floor(budget f));
/// with threshold every entry scoring >= bound.
struct PoolSelection {
  std::int64_t budget = 0;      // M per head: the pool keeps group_heads * M
  double floor_ratio = 0.0;     // f in [0, 1)
  std::int64_t window = 0;
  std::int64_t sinks = 0;
  bool threshold = false;
  float bound = 0.0f;           // log alpha
  std::int64_t guaranteed = 0;  // each head's top this many rank above the pool (AdaKV's safeguard)
};

}  // namespace kvpolicy::evict
