// kvpolicy-replay's engine: feeds a trace through a policy's Cache one token per step (the first
// `prefill` tokens as one chunk), records when every entry was evicted, and measures the attention
// output against the full cache at every step.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kvpolicy/cpu/attention.hpp"
#include "kvpolicy/baselines.hpp"
#include "kvpolicy/dbtrimkv.hpp"
#include "kvpolicy/epikv.hpp"
#include "kvpolicy/gate/retention_gate.hpp"
#include "kvpolicy/gate/rg10_gate.hpp"
#include "kvpolicy/gate/tied_gate.hpp"
#include "kvpolicy/gate/write_gate.hpp"
#include "kvpolicy/wgkv.hpp"
#include "kvpolicy/trimkv.hpp"
#include "trace.hpp"

namespace kvpolicy::replay {

struct Options {
  std::string policy = "trimkv";  // one of policies()
  std::int64_t budget = 1024;     // M
  std::int64_t buffer = 128;      // B
  int horizon = 2;                // h (dbtrimkv)
  double floor_ratio = 0.0;       // f (dbtrimkv)
  std::int64_t window = 0;        // w, every policy (snapkv: W_obs, 0 = min(32, M); wgkv: its ring is --local)
  double threshold = 0.0;         // alpha
  std::int64_t prefill = 0;       // P: the first P tokens as one chunk
  std::int64_t sinks = -1;        // S, every policy; -1 = the policy's default (4 for streamingllm, else 0)
  std::uint64_t seed = 0;         // random
  int band_a = 10, band_b = 21;   // epikv, hs-var: hidden-state layers A and B
  std::int64_t recency = -1;      // R of the EpiKV family; -1 = min(128, K / 4)
  std::int64_t local = 256;       // W_local (wgkv)
  double tau = 0.1;               // admission threshold (wgkv)
  std::string gate;               // a gate file: wgkv's write gate (on keys_pre_rope and keys); trimkv's and
                                  // dbtrimkv's retention gate (on gate_input), replacing the trace's log_beta
  std::int64_t average_budget = 0;  // wgkv: M_avg of the hard budget (appendix K); 0 = none
  std::string pooling = "avg";    // snapkv: avg | max
  int pool_kernel = 5;            // snapkv: odd
  std::string gqa = "mean";       // snapkv: mean | max over the query heads of a kv head
  /// S as the policy runs it: the given one, or the policy's default (SPEC §5)
  std::int64_t sinks_or_default() const { return sinks >= 0 ? sinks : policy == "streamingllm" ? 4 : 0; }
};

// The EpiKV family (SPEC §4) takes --budget as K over the generated tokens of each head, protects
// the first --prefill tokens (the prompt) and the R newest, and ignores --buffer.
inline const std::vector<std::string>& policies() {
  static const std::vector<std::string> names{"trimkv", "dbtrimkv", "wgkv", "epikv", "hs-var", "kv-key", "kv-val", "lag-kv",
                                              "streamingllm", "h2o", "snapkv", "knorm", "keydiff", "random"};
  return names;
}

inline std::string policy_list() {
  std::string out;
  for (const auto& p : policies()) out += (out.empty() ? "" : ", ") + p;
  return out;
}

struct Result {
  std::vector<std::int64_t> evicted_at;  // [L, Hkv, T]: n when evicted, -1 if it survived
  std::vector<std::int64_t> step_end;    // [S]: n after each step
  std::vector<float> attn_rel_error;     // [S], when the trace has K/V/Q
  std::int64_t peak_entries_per_head = 0;  // resident at any time (before a step's eviction)
  std::int64_t peak_entries_total = 0;
  double mean_entries_total = 0.0;         // after each step
  double seconds_per_step = 0.0;  // the policy cache's step: append + attend + trigger/evict
};

// Steps a trace is cut into: one chunk of `prefill` tokens, then one token per step.
inline std::vector<std::int64_t> step_sizes(std::int64_t tokens, std::int64_t prefill) {
  std::vector<std::int64_t> s;
  if (prefill > 0) s.push_back(std::min(prefill, tokens));
  for (std::int64_t n = s.empty() ? 0 : s[0]; n < tokens; ++n) s.push_back(1);
  return s;
}

// Attention of every query over the full cache (all tokens so far), [T, L, Hq, d] by token.
// Independent of the policy: compute once, compare every policy against it.
inline std::vector<float> full_attention(const Trace& tr) {
  const std::int64_t T = tr.tokens, d = tr.head_dim, G = tr.q_heads / tr.kv_heads;
  std::vector<float> out(static_cast<std::size_t>(T * tr.layers * tr.q_heads * d));
  std::vector<std::int32_t> pos(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t);
  std::vector<float> o(static_cast<std::size_t>(T * d));
  for (int l = 0; l < tr.layers; ++l)
    for (int qh = 0; qh < tr.q_heads; ++qh) {
      const std::int64_t h = qh / G;
      const float* k = &tr.keys[static_cast<std::size_t>((l * tr.kv_heads + h) * T * d)];
      const float* v = &tr.values[static_cast<std::size_t>((l * tr.kv_heads + h) * T * d)];
      const float* q = &tr.queries[static_cast<std::size_t>((l * tr.q_heads + qh) * T * d)];
      // causal: query t sees keys 0..t (the full cache after t was appended)
      cpu::attend_dense(View<const float, 2>(q, {T, d}), View<const float, 2>(k, {T, d}), View<const float, 2>(v, {T, d}),
                        pos, pos, View<float, 2>(o.data(), {T, d}));
      for (std::int64_t t = 0; t < T; ++t)
        std::copy_n(&o[static_cast<std::size_t>(t * d)], d,
                    &out[static_cast<std::size_t>(((t * tr.layers + l) * tr.q_heads + qh) * d)]);
    }
  return out;
}

// The full-cache attention the per-step error is measured against: `given` (the demo computes it
// once for every policy), or computed by replay() once the policy's cache has accepted its
// arguments (a bad argument fails before this, the costliest part of a run on a real trace), or
// none (then Result::attn_rel_error stays empty).
struct Reference {
  const std::vector<float>* given = nullptr;
  bool compute = false;
};

namespace detail {

// Copies tokens [t0, t0 + n) of a [L, H, T, d] tensor into [L, H, n, d].
inline std::vector<float> slice(const std::vector<float>& src, int L, int H, std::int64_t T, std::int64_t d, std::int64_t t0,
                                std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(L * H * n * d));
  for (std::int64_t lh = 0; lh < std::int64_t{L} * H; ++lh)
    std::copy_n(&src[static_cast<std::size_t>((lh * T + t0) * d)], n * d, &out[static_cast<std::size_t>(lh * n * d)]);
  return out;
}

// The write score (EntryMeta::write_score) of a step's entries [L, Hkv, len]: log_beta, or a policy's frozen score.
// Called once per step, in order, with the step's first position and its keys/values [L, Hkv, len, d].
using Metadata = std::function<void(std::int64_t n, std::int64_t len, const std::vector<float>& keys,
                                    const std::vector<float>& values, std::vector<float>& out)>;

template <class C>
Result run(C& cache, const Trace& tr, const Options& opt, const Reference& reference, const Metadata& metadata = {}) {
  const int L = tr.layers, H = tr.kv_heads, Hq = tr.q_heads;
  const std::int64_t T = tr.tokens, d = std::max(tr.head_dim, 1);
  const bool attend = tr.has_attention();
  Result r;
  r.evicted_at.assign(static_cast<std::size_t>(L * H * T), -1);
  cache.add_sequence(0, opt.prefill);  // the first P tokens are the prompt
  std::vector<float> computed;
  const std::vector<float>* full = reference.given;
  if (full == nullptr && reference.compute && attend) {
    computed = full_attention(tr);
    full = &computed;
  }
  std::vector<EvictedEntry> evicted;
  double seconds = 0.0, entries_sum = 0.0;
  std::int64_t n = 0;
  const auto steps = step_sizes(T, opt.prefill);
  for (const std::int64_t len : steps) {
    auto lb = slice(tr.log_beta, L, H, T, 1, n, len);
    std::vector<float> k, v, q, out;
    if (attend) {
      k = slice(tr.keys, L, H, T, d, n, len);
      v = slice(tr.values, L, H, T, d, n, len);
      q = slice(tr.queries, L, Hq, T, d, n, len);
      out.assign(q.size(), 0.0f);
    } else {  // no K/V in the trace: zero keys of width 1 carry the metadata
      k.assign(static_cast<std::size_t>(L * H * len), 0.0f);
      v = k;
    }
    if (metadata) metadata(n, len, k, v, lb);
    // peak memory is before the step's eviction: what it appended is resident until then
    std::int64_t total_before = 0;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const std::int64_t held = cache.length(0, l, h) + len;
        r.peak_entries_per_head = std::max(r.peak_entries_per_head, held);
        total_before += held;
      }
    r.peak_entries_total = std::max(r.peak_entries_total, total_before);
    evicted.clear();
    const auto t0 = std::chrono::steady_clock::now();
    cache.step(0, View<const float, 4>(k.data(), {L, H, len, d}), View<const float, 4>(v.data(), {L, H, len, d}),
               View<const float, 3>(lb.data(), {L, H, len}),
               attend ? View<const float, 4>(q.data(), {L, Hq, len, d}) : View<const float, 4>{},
               attend ? View<float, 4>(out.data(), {L, Hq, len, d}) : View<float, 4>{}, &evicted);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    n += len;
    r.step_end.push_back(n);
    for (const auto& e : evicted)
      r.evicted_at[static_cast<std::size_t>((e.layer * H + e.head) * T + e.position)] = n;
    entries_sum += static_cast<double>(cache.total_length(0));
    if (attend && full != nullptr) {
      double num = 0.0, den = 0.0;
      for (int l = 0; l < L; ++l)
        for (int qh = 0; qh < Hq; ++qh)
          for (std::int64_t t = 0; t < len; ++t)
            for (std::int64_t c = 0; c < d; ++c) {
              const double want = (*full)[static_cast<std::size_t>((((n - len + t) * L + l) * Hq + qh) * d + c)];
              const double got = out[static_cast<std::size_t>(((l * Hq + qh) * len + t) * d + c)];
              num += (got - want) * (got - want);
              den += want * want;
            }
      r.attn_rel_error.push_back(static_cast<float>(std::sqrt(num / std::max(den, 1e-30))));
    }
  }
  r.seconds_per_step = seconds / static_cast<double>(steps.size());
  r.mean_entries_total = entries_sum / static_cast<double>(steps.size());
  return r;
}

inline std::int64_t pool_pages(const Trace& tr) {
  // no head ever holds more than the trace's T tokens, whatever the budget and buffer: enough for
  // every head to hold all of them (the budget bounds use; the pool bounds nothing here)
  return pages_for(CacheShape{tr.layers, tr.kv_heads, 1, 1}, tr.tokens, 1, 16);
}

}  // namespace detail

// Replays `tr` through the policy `opt` names; `full` (see Reference) enables the per-step attention
// error.
/// log_beta [L, Hkv, T] from a retention gate file run on the trace's gate_input: TRIM-KV's gate
/// (SPEC §1) for trimkv; for dbtrimkv the authors' rg10 (SPEC §2), or the paper's literal tied gate.
inline std::vector<float> gated_log_beta(const Trace& tr, const std::string& policy, const std::string& path) {
  require(!tr.gate_input.empty(), "replay: --gate with ", policy,
          " needs the trace's gate_input [L, T, D] (each layer's attention input after its input RMSNorm)");
  const auto file = safetensors::File::read(path);
  const int L = tr.layers, H = tr.kv_heads, D = tr.gate_input_size;
  const std::int64_t T = tr.tokens;
  std::vector<float> out(static_cast<std::size_t>(std::int64_t{L} * H * T));
  const auto run = [&](const auto& g) {
    for (int l = 0; l < L; ++l)
      g.forward(l, View<const float, 2>(tr.gate_input.data() + std::int64_t{l} * T * D, {T, D}),
                View<float, 2>(out.data() + std::int64_t{l} * H * T, {H, T}));
  };
  const auto inner = [&](const std::string& name) { return static_cast<int>(file.info(name).shape.at(0)); };
  if (policy == "trimkv")
    run(gate::RetentionGate::load(file, {L, D, H, inner(gate::RetentionGate::prefix(0) + "linear1.weight")}));
  else if (gate::Rg10Gate::holds(file))
    run(gate::Rg10Gate::load(file, {L, D, H, inner(gate::Rg10Gate::prefix(0) + "linear1.weight")}));
  else
    run(gate::TiedGate::load(file, {L, D, H, inner(gate::TiedGate::readout_weight)}));
  return out;
}

inline Result replay(const Trace& trace, const Options& opt, const Reference& full = {}) {
  // --gate with trimkv or dbtrimkv: the trace's log_beta is replaced by the gate's on its gate_input
  Trace with_gate;
  if (!opt.gate.empty() && (opt.policy == "trimkv" || opt.policy == "dbtrimkv")) {
    with_gate = trace;
    with_gate.log_beta = gated_log_beta(trace, opt.policy, opt.gate);
  }
  const Trace& tr = with_gate.layers > 0 ? with_gate : trace;
  CacheShape shape = tr.shape();
  if (!tr.has_attention()) shape = CacheShape{tr.layers, tr.kv_heads, tr.kv_heads, 1};
  require(opt.prefill >= 0, "replay: --prefill P = ", opt.prefill, " must be >= 0");
  const auto pages = detail::pool_pages(tr);
  const std::int64_t sinks = opt.sinks_or_default();  // SPEC §5: every policy protects S sinks and w newest
  if (opt.policy == "trimkv") {
    TrimKVCache<> cache(shape, memory::Paged<16>(pages),
                        trimkv_evictor({opt.budget, opt.buffer, opt.window, opt.threshold, sinks}));
    return detail::run(cache, tr, opt, full);
  }
  if (opt.policy == "dbtrimkv") {
    const DBTrimKVConfig c{opt.budget, opt.buffer, opt.horizon, opt.floor_ratio, opt.window, opt.threshold, sinks};
    DBTrimKVCache<> cache(shape, memory::Paged<16>(pages), dbtrimkv_evictor(c), dbtrimkv_scorer(c));
    return detail::run(cache, tr, opt, full);
  }
  if (opt.threshold != 0.0) fail("replay: --threshold applies to trimkv and dbtrimkv, not to ", opt.policy);
  if (opt.policy == "wgkv" && opt.window != 0)
    fail("replay: wgkv's protected window is its ring: set --local W, not --window");
  const bool needs_kv = opt.policy == "h2o" || opt.policy == "snapkv" || opt.policy == "keydiff" || opt.policy == "kv-key" ||
                        opt.policy == "kv-val" || opt.policy == "lag-kv";
  require(!needs_kv || tr.has_attention(), "replay: policy ", opt.policy,
          " needs the trace's keys, values and queries, and this trace has none");
  if (opt.policy == "wgkv") {  // SPEC §3: g from the trace's write_gate, or the gate run on its keys
    detail::Metadata gates;
    std::vector<float> computed;
    if (!opt.gate.empty()) {
      require(tr.has_attention() && !tr.keys_pre_rope.empty(), "replay: --gate needs the trace's keys_pre_rope and keys");
      const auto g = gate::WriteGate::load(safetensors::File::read(opt.gate),
                                           {.layers = tr.layers, .kv_heads = tr.kv_heads, .head_dim = tr.head_dim});
      computed.resize(tr.log_beta.size());
      const std::int64_t T = tr.tokens, d = tr.head_dim;
      for (int l = 0; l < tr.layers; ++l) {
        const auto at = static_cast<std::size_t>(std::int64_t{l} * tr.kv_heads * T);
        g.forward(l, View<const float, 3>(tr.keys_pre_rope.data() + at * d, {tr.kv_heads, T, d}),
                  View<const float, 3>(tr.keys.data() + at * d, {tr.kv_heads, T, d}),
                  View<float, 2>(computed.data() + at, {tr.kv_heads, T}));
      }
    } else {
      require(!tr.write_gate.empty(), "replay: policy wgkv needs the trace's write_gate, or --gate with keys_pre_rope");
    }
    const std::vector<float>& source = opt.gate.empty() ? tr.write_gate : computed;
    gates = [&](std::int64_t n, std::int64_t len, const std::vector<float>&, const std::vector<float>&, std::vector<float>& out) {
      out = detail::slice(source, tr.layers, tr.kv_heads, tr.tokens, 1, n, len);
    };
    if (opt.average_budget > 0) {  // SPEC §3 "Admission with eviction"
      require(tr.has_attention(), "replay: wgkv with --avg-budget needs the trace's keys, values and queries");
      const WGKVBudgetConfig c{opt.local, opt.tau, opt.average_budget, 256, 5, 0.1, sinks};
      WGKVBudgetCache<> cache(shape, memory::Paged<16>(pages), wgkv_budget_evictor(shape, c), wgkv_budget_scorer(shape, c));
      return detail::run(cache, tr, opt, full, gates);
    }
    WGKVCache<> cache(shape, memory::Paged<16>(pages), wgkv_evictor({opt.local, opt.tau, sinks}));
    return detail::run(cache, tr, opt, full, gates);
  }
  if (opt.policy == "epikv" || opt.policy == "hs-var") {  // SPEC §4: one score per token from the hidden states
    require(tr.has_hidden(), "replay: policy ", opt.policy, " needs the trace's hidden_states [L', T, D]");
    epiphany::Signal signal({opt.band_a, opt.band_b, 64,
                             opt.policy == "epikv" ? epiphany::Variant::epikv : epiphany::Variant::hs_var},
                            tr.hidden_size);
    const detail::Metadata scores = [&](std::int64_t n, std::int64_t len, const std::vector<float>&, const std::vector<float>&,
                                std::vector<float>& out) {
      const auto hidden = detail::slice(tr.hidden, tr.hidden_layers, 1, tr.tokens, tr.hidden_size, n, len);
      std::vector<float> token_scores(static_cast<std::size_t>(len));
      signal.push_hidden(View<const float, 3>(hidden.data(), {tr.hidden_layers, len, tr.hidden_size}), token_scores);
      broadcast_token_scores(shape, token_scores, View<float, 3>(out.data(), {shape.layers, shape.kv_heads, len}));
    };
    EpiKVCache<> cache(shape, memory::Paged<16>(pages), epikv_evictor({opt.budget, opt.recency, sinks, opt.window}));
    return detail::run(cache, tr, opt, full, scores);
  }
  if (opt.policy == "kv-key" || opt.policy == "kv-val" || opt.policy == "lag-kv") {
    const auto stat = opt.policy == "kv-key"   ? kvstats::Statistic::key
                      : opt.policy == "kv-val" ? kvstats::Statistic::value
                                               : kvstats::Statistic::lag;
    kvstats::Tracker tracker(shape, {stat, 64});
    const detail::Metadata scores = [&](std::int64_t, std::int64_t len, const std::vector<float>& k, const std::vector<float>& v,
                                std::vector<float>& out) {
      const std::int64_t layer_kv = std::int64_t{shape.kv_heads} * len * shape.head_dim;
      for (int l = 0; l < shape.layers; ++l)
        tracker.push(l, View<const float, 3>(k.data() + l * layer_kv, {shape.kv_heads, len, shape.head_dim}),
                     View<const float, 3>(v.data() + l * layer_kv, {shape.kv_heads, len, shape.head_dim}),
                     View<float, 2>(out.data() + std::int64_t{l} * shape.kv_heads * len, {shape.kv_heads, len}));
    };
    EpiKVCache<> cache(shape, memory::Paged<16>(pages), epikv_evictor({opt.budget, opt.recency, sinks, opt.window}));
    return detail::run(cache, tr, opt, full, scores);
  }
  // SPEC §5 baselines: they score from position, attention mass, key norm, keys or a seed, and ignore log_beta
  const auto evictor = baseline_evictor({opt.budget, opt.buffer, sinks, opt.window});
  if (opt.policy == "streamingllm") {  // its sinks are its score's (SPEC §5 Recency), the evictor's none
    StreamingLLMCache<> cache(shape, memory::Paged<16>(pages), baseline_evictor({opt.budget, opt.buffer, 0, opt.window}),
                              score::Recency{sinks});
    return detail::run(cache, tr, opt, full);
  }
  if (opt.policy == "h2o") {
    H2OCache<> cache(shape, memory::Paged<16>(pages), h2o_evictor({opt.budget, opt.buffer, sinks, opt.window}));
    return detail::run(cache, tr, opt, full);
  }
  if (opt.policy == "snapkv") {  // compresses the --prefill prompt to M per head once
    require(opt.prefill > 0, "replay: snapkv compresses the prompt: give its length with --prefill P");
    require(opt.pooling == "avg" || opt.pooling == "max", "replay: --pool '", opt.pooling, "' must be avg or max");
    require(opt.gqa == "mean" || opt.gqa == "max", "replay: --gqa '", opt.gqa, "' must be mean or max");
    const SnapKVConfig c{opt.budget, opt.window > 0 ? opt.window : std::min<std::int64_t>(32, opt.budget), opt.pool_kernel,
                         opt.pooling == "avg" ? score::Pooling::avg : score::Pooling::max,
                         opt.gqa == "mean" ? score::GroupReduce::mean : score::GroupReduce::max, sinks};
    SnapKVCache<> cache(shape, memory::Paged<16>(pages), snapkv_evictor(c), snapkv_scorer(c));
    return detail::run(cache, tr, opt, full);
  }
  if (opt.policy == "knorm") {
    KNormCache<> cache(shape, memory::Paged<16>(pages), evictor);
    return detail::run(cache, tr, opt, full);
  }
  if (opt.policy == "keydiff") {
    KeyDiffCache<> cache(shape, memory::Paged<16>(pages), evictor);
    return detail::run(cache, tr, opt, full);
  }
  if (opt.policy == "random") {
    RandomCache<> cache(shape, memory::Paged<16>(pages), evictor, score::SeededRandom{opt.seed});
    return detail::run(cache, tr, opt, full);
  }
  fail("replay: unknown policy '", opt.policy, "' (known: ", policy_list(), ")");
}

// With the full-cache attention computed by the caller (full_attention), or nullptr for none.
inline Result replay(const Trace& tr, const Options& opt, const std::vector<float>* full) {
  return replay(tr, opt, Reference{full, false});
}

}  // namespace kvpolicy::replay
