// kvpolicy-replay's engine (replay.hpp): the trace through each registered policy's Cache.
#include "replay.hpp"

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "kvpolicy/cpu/attention.hpp"
#include "kvpolicy/gate/load.hpp"
#include "kvpolicy/gate/write_gate.hpp"
#include "kvpolicy/trimkv.hpp"

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

std::int64_t pool_pages(const Trace& tr) {
  // no head ever holds more than the trace's T tokens, whatever the budget and buffer: enough for
  // every head to hold all of them (the budget bounds use; the pool bounds nothing here)
  return pages_for(CacheShape{tr.layers, tr.kv_heads, 1, 1}, tr.tokens, 1, 16);
}

/// log_beta [L, Hkv, T] from a retention gate file run on the trace's gate_input: TRIM-KV's gate
/// (SPEC §1), or DBTrimKV's tied gate (tied: the authors' rg10, or the paper's literal one).
std::vector<float> gated_log_beta(const Trace& tr, std::string_view policy, bool tied, const std::string& path) {
  require(!tr.gate_input.empty(), "replay: --gate with ", policy,
          " needs the trace's gate_input [L, T, D] (each layer's attention input after its input RMSNorm)");
  const int L = tr.layers, H = tr.kv_heads, D = tr.gate_input_size;
  const std::int64_t T = tr.tokens;
  const auto gate = gate::load_retention_gate(path, L, D, H, tied);
  std::vector<float> out(static_cast<std::size_t>(std::int64_t{L} * H * T));
  for (int l = 0; l < L; ++l)
    gate(l, View<const float, 2>(tr.gate_input.data() + std::int64_t{l} * T * D, {T, D}),
         View<float, 2>(out.data() + std::int64_t{l} * H * T, {H, T}));
  return out;
}

/// The write score of policy P's entries (registry::Inputs) for each step of the trace: the
/// trace's log_beta (none, or a retention gate without --gate), or computed from the trace.
template <registry::Policy P>
Metadata step_scores(const Trace& tr, const registry::Values& v, const CacheShape& shape) {
  using registry::Inputs;
  if constexpr (P::inputs == Inputs::write_gate) {  // SPEC §3: g from the trace's write_gate, or the gate on its keys
    auto source = std::make_shared<std::vector<float>>();
    const std::string& path = v.text("gate");
    if (!path.empty()) {
      require(tr.has_attention() && !tr.keys_pre_rope.empty(), "replay: --gate needs the trace's keys_pre_rope and keys");
      const auto g = gate::WriteGate::load(safetensors::File::read(path),
                                           {.layers = tr.layers, .kv_heads = tr.kv_heads, .head_dim = tr.head_dim});
      source->resize(tr.log_beta.size());
      const std::int64_t T = tr.tokens, d = tr.head_dim;
      for (int l = 0; l < tr.layers; ++l) {
        const auto at = static_cast<std::size_t>(std::int64_t{l} * tr.kv_heads * T);
        g.forward(l, View<const float, 3>(tr.keys_pre_rope.data() + at * d, {tr.kv_heads, T, d}),
                  View<const float, 3>(tr.keys.data() + at * d, {tr.kv_heads, T, d}),
                  View<float, 2>(source->data() + at, {tr.kv_heads, T}));
      }
    } else {
      require(!tr.write_gate.empty(), "replay: policy ", P::name,
              " needs the trace's write_gate, or --gate with keys_pre_rope");
      *source = tr.write_gate;
    }
    return [&tr, source](std::int64_t n, std::int64_t len, const std::vector<float>&, const std::vector<float>&,
                         std::vector<float>& out) {
      out = slice(*source, tr.layers, tr.kv_heads, tr.tokens, 1, n, len);
    };
  } else if constexpr (P::inputs == Inputs::hidden_states) {  // SPEC §4: one score per token
    require(tr.has_hidden(), "replay: policy ", P::name, " needs the trace's hidden_states [L', T, D]");
    auto signal = std::make_shared<epiphany::Signal>(
        epiphany::SignalConfig{static_cast<int>(v.integer("band-a")), static_cast<int>(v.integer("band-b")), 64, P::variant},
        tr.hidden_size);
    return [&tr, signal, shape](std::int64_t n, std::int64_t len, const std::vector<float>&, const std::vector<float>&,
                                std::vector<float>& out) {
      const auto hidden = slice(tr.hidden, tr.hidden_layers, 1, tr.tokens, tr.hidden_size, n, len);
      std::vector<float> token_scores(static_cast<std::size_t>(len));
      signal->push_hidden(View<const float, 3>(hidden.data(), {tr.hidden_layers, len, tr.hidden_size}), token_scores);
      broadcast_token_scores(shape, token_scores, View<float, 3>(out.data(), {shape.layers, shape.kv_heads, len}));
    };
  } else if constexpr (P::inputs == Inputs::key_value_statistic) {  // SPEC §4: per (layer, kv head)
    auto tracker = std::make_shared<kvstats::Tracker>(shape, kvstats::Config{P::statistic, 64});
    return [tracker, shape](std::int64_t, std::int64_t len, const std::vector<float>& k, const std::vector<float>& val,
                            std::vector<float>& out) {
      const std::int64_t layer_kv = std::int64_t{shape.kv_heads} * len * shape.head_dim;
      for (int l = 0; l < shape.layers; ++l)
        tracker->push(l, View<const float, 3>(k.data() + l * layer_kv, {shape.kv_heads, len, shape.head_dim}),
                      View<const float, 3>(val.data() + l * layer_kv, {shape.kv_heads, len, shape.head_dim}),
                      View<float, 2>(out.data() + std::int64_t{l} * shape.kv_heads * len, {shape.kv_heads, len}));
    };
  } else {  // the trace's log_beta (a retention gate's file replaces it before this)
    return {};
  }
}

/// Replays `trace` through policy P with the option values `v`.
template <registry::Policy P>
Result replay_policy(const Trace& trace, const Options& opt, const registry::Values& v, const Reference& full) {
  using registry::Inputs;
  if constexpr (requires { P::needs_prompt_length; })
    require(opt.prefill > 0, "replay: ", P::name, " compresses the prompt: give its length with --prefill P");
  // --gate with a retention gate: the trace's log_beta is replaced by the gate's on its gate_input
  Trace with_gate;
  if constexpr (P::inputs == Inputs::retention_gate || P::inputs == Inputs::tied_retention_gate)
    if (!v.text("gate").empty()) {
      with_gate = trace;
      with_gate.log_beta = gated_log_beta(trace, P::name, P::inputs == Inputs::tied_retention_gate, v.text("gate"));
    }
  const Trace& tr = with_gate.layers > 0 ? with_gate : trace;
  CacheShape shape = tr.shape();
  if (!tr.has_attention()) shape = CacheShape{tr.layers, tr.kv_heads, tr.kv_heads, 1};
  const Metadata metadata = step_scores<P>(tr, v, shape);
  return P::template make<cpu_backend>(v, shape, memory::Paged<16>(pool_pages(tr)), [&](auto& cache) {
    using S = typename std::remove_reference_t<decltype(cache)>::scorer_type;
    // what the scorer reads beyond the metadata: the attention (H2O, SnapKV), the keys (KeyDiff)
    constexpr bool needs_kv = kvpolicy::detail::ScorerInputs<S>::observes_attention || scorer_needs_head_keys<S> ||
                              P::inputs == Inputs::key_value_statistic;
    require(!needs_kv || tr.has_attention(), "replay: policy ", P::name,
            " needs the trace's keys, values and queries, and this trace has none");
    return run(cache, tr, opt, full, metadata);
  });
}

}  // namespace

Result replay(const Trace& trace, const Options& opt, const Reference& full) {
  require(opt.prefill >= 0, "replay: --prefill P = ", opt.prefill, " must be >= 0");
  return registry::visit(opt.policy, [&]<registry::Policy P>() {
    return replay_policy<P>(trace, opt, registry::values<P>(opt.given), full);
  });
}

}  // namespace kvpolicy::replay
