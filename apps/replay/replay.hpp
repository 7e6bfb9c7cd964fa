// kvpolicy-replay's engine: feeds a trace through a policy's Cache one token per step (the first
// `prefill` tokens as one chunk), records when every entry was evicted, and measures the attention
// output against the full cache at every step. replay.cpp holds the engine, every registered
// policy instantiated there once (the library kvpolicy_replay_engine), not in each program and test
// that replays a trace.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvpolicy/registry.hpp"
#include "trace.hpp"

namespace kvpolicy::replay {

// A policy by its registry name and the options given to it (registry::Selection: the registry
// holds the defaults and refuses an option the policy does not take), and the steps.
struct Options : registry::Selection {
  Options() { policy = "trimkv"; }
  std::int64_t prefill = 0;  // P: the first P tokens as one chunk, the prompt
  // Q: the trace's Q tokens after the prompt are a probe step (SPEC §10), which a policy whose
  // inputs are a reconstruction (KVzip) runs; they never join the sequence
  std::int64_t probe = 0;
};

struct Result {
  std::vector<std::int64_t> evicted_at;  // [L, Hkv, T]: the trace's tokens read when evicted, -1 if it survived
  std::vector<std::int64_t> step_end;    // [S]: the trace's tokens read after each step (n, but for a probe's)
  std::vector<float> attn_rel_error;     // [S], when the trace has K/V/Q
  std::int64_t peak_entries_per_head = 0;  // resident at any time (before a step's eviction)
  std::int64_t peak_entries_total = 0;
  double mean_entries_total = 0.0;         // after each step
  double seconds_per_step = 0.0;  // the policy cache's step: append + attend + trigger/evict
};

// Steps a trace is cut into: one chunk of `prefill` tokens, the probe's `probe` tokens as one
// step, then one token per step.
inline std::vector<std::int64_t> step_sizes(std::int64_t tokens, std::int64_t prefill, std::int64_t probe = 0) {
  std::vector<std::int64_t> s;
  if (prefill > 0) s.push_back(std::min(prefill, tokens));
  if (probe > 0 && prefill + probe <= tokens) s.push_back(probe);
  std::int64_t n = 0;
  for (const std::int64_t len : s) n += len;
  for (; n < tokens; ++n) s.push_back(1);
  return s;
}

// Attention of every query over the full cache (all tokens so far), [T, L, Hq, d] by token.
// Independent of the policy: compute once, compare every policy against it.
std::vector<float> full_attention(const Trace& tr);

// The full-cache attention the per-step error is measured against: `given` (the demo computes it
// once for every policy), or computed by replay() once the policy's cache has accepted its
// arguments (a bad argument fails before this, the costliest part of a run on a real trace), or
// none (then Result::attn_rel_error stays empty).
struct Reference {
  const std::vector<float>* given = nullptr;
  bool compute = false;
};

// Replays `trace` through the policy `opt` names; `full` (see Reference) enables the per-step
// attention error.
Result replay(const Trace& trace, const Options& opt, const Reference& full = {});

// With the full-cache attention computed by the caller (full_attention), or nullptr for none.
inline Result replay(const Trace& tr, const Options& opt, const std::vector<float>* full) {
  return replay(tr, opt, Reference{full, false});
}

}  // namespace kvpolicy::replay
