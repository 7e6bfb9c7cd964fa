// libFuzzer target: the trace reader of kvpolicy-replay (apps/replay/trace.hpp, format in
// docs/replay.md). Any byte string is a trace or a kvpolicy::Error. A small trace that parses is
// replayed through both policies with a tiny budget: a trace whose values the cache accepts must
// replay without error, within the budget (TRIM-KV: at most M + B entries per head while a step
// is open; DBTrimKV: at most L Hkv (M + B) - 1 + L Hkv in the sequence), with every eviction time
// inside the trace; a trace with values the cache refuses (NaN or positive log_beta, non-finite
// K/V/queries) must be refused with kvpolicy::Error. A trace with a write gate is replayed through
// WG-KV (nothing leaves the ring of W_local newest, nothing with g >= tau ever leaves), one with
// hidden states through EpiKV (the prompt is never evicted, K generated entries at most).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "replay.hpp"

using namespace kvpolicy;

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::optional<replay::Trace> tr;
  try {
    tr.emplace(replay::parse_trace(safetensors::File::parse(std::vector<std::uint8_t>(data, data + size), "fuzz")));
  } catch (const Error&) {
    return 0;
  }
  check(tr->layers >= 1 && tr->kv_heads >= 1 && tr->tokens >= 1);
  check(static_cast<std::int64_t>(tr->log_beta.size()) == std::int64_t{tr->layers} * tr->kv_heads * tr->tokens);
  if (std::int64_t{tr->layers} * tr->kv_heads * tr->tokens > 4096 || tr->q_heads > 64 || tr->head_dim > 64) return 0;
  bool kv_ok = true;  // what Cache::append and attend accept (fp32 storage)
  for (const auto* v : {&tr->keys, &tr->values, &tr->queries})
    for (float x : *v) kv_ok = kv_ok && std::isfinite(x);
  bool accepted = kv_ok;  // and, for the policies that read it, log_beta
  for (float x : tr->log_beta) accepted = accepted && !std::isnan(x) && x <= 0.0f;
  const std::int64_t heads = std::int64_t{tr->layers} * tr->kv_heads;
  if (!tr->write_gate.empty()) {  // SPEC §3
    replay::Options opt;
    opt.policy = "wgkv";
    const std::int64_t local = 2;
    opt.set("local", local).set("tau", 0.5);
    try {
      const auto r = replay::replay(*tr, opt);
      check(kv_ok);  // the gate takes log_beta's place: only K/V/queries can be refused
      for (std::size_t i = 0; i < r.evicted_at.size(); ++i) {
        const auto t = static_cast<std::int64_t>(i) % tr->tokens;
        check(r.evicted_at[i] == -1 || (r.evicted_at[i] > t + local && tr->write_gate[i] < 0.5f));
      }
    } catch (const Error&) {
      check(!kv_ok);
    }
  }
  if (tr->has_hidden() && std::int64_t{tr->hidden_layers} * tr->tokens * tr->hidden_size <= 65536) {  // SPEC §4
    bool hidden_ok = kv_ok;  // the scores take log_beta's place; only the two band layers are read
    const std::size_t band = static_cast<std::size_t>(tr->tokens * tr->hidden_size);
    for (std::size_t i = 0; i < tr->hidden.size(); ++i)
      if (i < band || i >= tr->hidden.size() - band) hidden_ok = hidden_ok && std::isfinite(tr->hidden[i]);
    replay::Options opt;
    opt.policy = "epikv";
    const std::int64_t budget = 3;
    opt.prefill = tr->tokens > 2 ? 2 : 0;
    opt.set("budget", budget).set("band-a", 0).set("band-b", tr->hidden_layers - 1);
    try {
      const auto r = replay::replay(*tr, opt);
      check(hidden_ok);
      for (std::size_t i = 0; i < r.evicted_at.size(); ++i) {
        const auto t = static_cast<std::int64_t>(i) % tr->tokens;
        check(r.evicted_at[i] == -1 || (t >= opt.prefill && r.evicted_at[i] > t));
      }
      check(r.peak_entries_per_head <= std::max<std::int64_t>(opt.prefill + budget + 1, opt.prefill));
    } catch (const Error&) {
      check(!hidden_ok);
    }
  }
  for (const char* policy : {"trimkv", "dbtrimkv"}) {
    replay::Options opt;
    opt.policy = policy;
    const std::int64_t budget = 2, buffer = 2;
    opt.set("budget", budget).set("buffer", buffer);
    opt.prefill = tr->tokens > 3 ? 3 : 0;
    try {
      const auto full = tr->has_attention() ? replay::full_attention(*tr) : std::vector<float>{};
      const auto r = replay::replay(*tr, opt, tr->has_attention() ? &full : nullptr);
      check(accepted);
      for (std::size_t i = 0; i < r.evicted_at.size(); ++i) {
        const auto t = static_cast<std::int64_t>(i) % tr->tokens;  // evicted after its own step, by the end
        check(r.evicted_at[i] == -1 || (r.evicted_at[i] > t && r.evicted_at[i] <= tr->tokens));
      }
      if (opt.policy == std::string("trimkv"))  // SPEC §1: the step that triggers holds at most M + B
        check(r.peak_entries_per_head <= std::max<std::int64_t>(budget + buffer, opt.prefill));
      else  // SPEC §2: below L Hkv (M + B) after a step, plus this step's entries before its eviction
        check(r.peak_entries_total <= std::max<std::int64_t>(heads * (budget + buffer) - 1 + heads, heads * opt.prefill));
    } catch (const Error&) {
      check(!accepted);
    }
  }
  return 0;
}
