// kvpolicy-replay's engine (replay.hpp): the trace through each registered policy's Cache.
#include "replay.hpp"

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "kvpolicy/cpu/attention.hpp"
#include "../common/layer_inputs.hpp"
#include "kvpolicy/open.hpp"

namespace kvpolicy::replay {

std::vector<float> full_attention(const Trace& tr) {
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

namespace {

// Copies tokens [t0, t0 + n) of a [L, H, T, d] tensor into [L, H, n, d].
std::vector<float> slice(const std::vector<float>& src, int L, int H, std::int64_t T, std::int64_t d, std::int64_t t0,
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

Result run(AnyCache& cache, const Trace& tr, const Options& opt, const Reference& reference, const Metadata& metadata = {}) {
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
  std::int64_t n = 0;           // the trace's tokens read
  std::int64_t probe_skip = 0;  // trace index - cache position, for the tokens after a probe
  const auto steps = step_sizes(T, opt.prefill, opt.probe);
  for (std::size_t step = 0; step < steps.size(); ++step) {
    const std::int64_t len = steps[step];
    const bool probing = opt.probe > 0 && step == 1;  // the step after the prompt (SPEC §10)
    if (probing) cache.open_probe(0);
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
    cache.step({0, View<const float, 4>(k.data(), {L, H, len, d}), View<const float, 4>(v.data(), {L, H, len, d}),
                View<const float, 3>(lb.data(), {L, H, len}),
                attend ? View<const float, 4>(q.data(), {L, Hq, len, d}) : View<const float, 4>{},
                attend ? View<float, 4>(out.data(), {L, Hq, len, d}) : View<float, 4>{}},
               &evicted);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    n += len;
    r.step_end.push_back(n);
    for (const auto& e : evicted) {
      const std::int64_t t = e.position + (e.position >= opt.prefill ? probe_skip : 0);  // the entry's trace token
      r.evicted_at[static_cast<std::size_t>((e.layer * H + e.head) * T + t)] = n;
    }
    if (probing) probe_skip = len;
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

std::int64_t pool_pages(const Trace& tr) {
  // no head ever holds more than the trace's T tokens, whatever the budget and buffer: enough for
  // every head to hold all of them (the budget bounds use; the pool bounds nothing here)
  return pages_for(CacheShape{tr.layers, tr.kv_heads, 1, 1}, tr.tokens, 1, registry::page_entries);
}

/// The scores the trace recorded from the run it was taken from, for a policy whose source writes
/// `scores`, run without its gate file: WG-KV's g (inputs::Scores::gate), else log_beta.
const std::vector<float>& recorded_scores(const Trace& tr, inputs::Scores scores, std::string_view policy) {
  if (scores != inputs::Scores::gate) return tr.log_beta;
  require(!tr.write_gate.empty(), "replay: policy ", policy, " needs the trace's write_gate, or --gate with keys_pre_rope");
  return tr.write_gate;
}

/// The write score of the entries of the policy `sel` names, for each step of the trace: the
/// library's producer of its inputs (registry::open_inputs) run on the trace's tensors; the
/// trace's recorded scores for a gated policy given no --gate; the trace's log_beta for a policy
/// that reads nothing.
Metadata step_scores(const Trace& tr, const registry::Selection& sel, const CacheShape& shape) {
  if (registry::takes(sel.policy, "gate") && sel.value("gate").empty()) {
    const std::vector<float>& recorded = recorded_scores(tr, registry::input_source(sel.policy).scores, sel.policy);
    if (&recorded == &tr.log_beta) return {};
    return [&tr, &recorded](std::int64_t n, std::int64_t len, const std::vector<float>&, const std::vector<float>&,
                            std::vector<float>& out) { out = slice(recorded, tr.layers, tr.kv_heads, tr.tokens, 1, n, len); };
  }
  const inputs::Needs needs = registry::input_needs(sel);
  if (!needs.any()) return {};
  const auto lacks = [&](bool missing, std::string_view what) {
    require(!missing, "replay: policy ", sel.policy, " needs the trace's ", what);
  };
  lacks(needs.normed_input && tr.gate_input.empty(), "gate_input [L, T, D] (each layer's attention input after its input RMSNorm)");
  lacks(needs.keys_pre_rope && tr.keys_pre_rope.empty(), "keys_pre_rope [L, Hkv, T, d] (the keys before RoPE) for --gate");
  lacks((needs.keys || needs.values) && !tr.has_attention(), "keys and values [L, Hkv, T, d]");
  lacks(needs.per_token() && !tr.has_hidden(), "hidden_states [L', T, D]");
  const int D = needs.normed_input ? tr.gate_input_size : tr.hidden_size;
  // the bands are checked against the trace's L' hidden states, whatever the model's L
  const inputs::Producer producer = registry::open_inputs(sel, {shape, D, tr.hidden_layers});
  return [&tr, producer, needs, shape, D](std::int64_t n, std::int64_t len, const std::vector<float>& k,
                                          const std::vector<float>& val, std::vector<float>& out) {
    const int L = shape.layers, H = shape.kv_heads;
    const std::int64_t T = tr.tokens, d = shape.head_dim, layer_kv = std::int64_t{H} * len * d;
    if (needs.per_token()) {  // one score per token, the same in every (layer, kv head)
      const auto band = [&](int b) { return View<const float, 2>(tr.hidden.data() + (b * T + n) * D, {len, D}); };
      std::vector<float> token_scores(static_cast<std::size_t>(len));
      producer.tokens(0, band((*needs.bands)[0]), band((*needs.bands)[1]), token_scores);
      broadcast_token_scores(shape, token_scores, View<float, 3>(out.data(), {L, H, len}));
      return;
    }
    const std::vector<float> pre = needs.keys_pre_rope ? slice(tr.keys_pre_rope, L, H, T, d, n, len) : std::vector<float>{};
    for (int l = 0; l < L; ++l) {
      apps::LayerBuffers b;
      if (needs.normed_input) b.normed_input = tr.gate_input.data() + (l * T + n) * D;
      if (needs.keys_pre_rope) b.keys_pre_rope = pre.data() + l * layer_kv;
      if (needs.keys) b.keys = k.data() + l * layer_kv;
      if (needs.values) b.values = val.data() + l * layer_kv;
      apps::layer_inputs(producer, 0, l, b, shape, D, len, out.data() + std::int64_t{l} * H * len);
    }
  };
}

/// Replays `trace` through the policy `opt` names (registry::open_cache).
Result replay_policy(const Trace& tr, const Options& opt, const Reference& full) {
  registry::check_options(opt);  // first: an option the policy does not take is the answer
  require(!registry::needs_prompt_length(opt.policy) || opt.prefill > 0, "replay: ", opt.policy,
          " compresses the prompt: give its length with --prefill P");
  const bool reconstructs = registry::input_source(opt.policy).probes;
  require(!reconstructs || (opt.prefill > 0 && opt.probe > 0), "replay: ", opt.policy,
          " runs a probe after the prompt (SPEC §10): give the prompt's length with --prefill P and the probe's with "
          "--probe Q, the trace's Q tokens after the prompt");
  require(reconstructs || opt.probe == 0, "replay: --probe applies to a policy that runs a probe after the prompt "
          "(its input source probes), not to ", opt.policy);
  CacheShape shape = tr.shape();
  if (!tr.has_attention()) shape = CacheShape{tr.layers, tr.kv_heads, tr.kv_heads, 1};
  Metadata metadata = step_scores(tr, opt, shape);
  const std::unique_ptr<AnyCache> cache = registry::open_cache(opt, shape, pool_pages(tr));
  // what the Scorer these options build reads beyond the metadata: the attention (H2O, SnapKV),
  // the keys (KeyDiff)
  require(!cache->reads_stored_kv() || tr.has_attention(), "replay: policy ", opt.policy,
          " needs the trace's keys, values and queries, and this trace has none");
  return run(*cache, tr, opt, full, metadata);
}

}  // namespace

Result replay(const Trace& trace, const Options& opt, const Reference& full) {
  require(opt.prefill >= 0, "replay: --prefill P = ", opt.prefill, " must be >= 0");
  require(opt.probe == 0 || (opt.probe > 0 && opt.prefill + opt.probe <= trace.tokens), "replay: --probe Q = ", opt.probe,
          " must be in [0, T - P = ", trace.tokens - opt.prefill, "], the trace's tokens after the prompt");
  return replay_policy(trace, opt, full);
}

}  // namespace kvpolicy::replay
