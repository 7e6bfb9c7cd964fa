// libFuzzer target: the trace reader of kvpolicy-replay (examples/replay/trace.hpp, format in
// docs/replay.md). Any byte string is a trace or a kvpolicy::Error. A small trace that parses is
// replayed through both policies with a tiny budget: a trace whose values the cache accepts must
// replay without error, within the budget (TRIM-KV: at most M + B entries per head while a step
// is open; DBTrimKV: at most L Hkv (M + B) - 1 + L Hkv in the sequence), with every eviction time
// inside the trace; a trace with values the cache refuses (NaN or positive log_beta, non-finite
// K/V/queries) must be refused with kvpolicy::Error.
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
  bool accepted = true;  // what Cache::append and attend accept (fp32 storage)
  for (float x : tr->log_beta) accepted = accepted && !std::isnan(x) && x <= 0.0f;
  for (const auto* v : {&tr->keys, &tr->values, &tr->queries})
    for (float x : *v) accepted = accepted && std::isfinite(x);
  const std::int64_t heads = std::int64_t{tr->layers} * tr->kv_heads;
  for (const char* policy : {"trimkv", "dbtrimkv"}) {
    replay::Options opt;
    opt.policy = policy;
    opt.budget = 2;
    opt.buffer = 2;
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
        check(r.peak_entries_per_head <= std::max<std::int64_t>(opt.budget + opt.buffer, opt.prefill));
      else  // SPEC §2: below L Hkv (M + B) after a step, plus this step's entries before its eviction
        check(r.peak_entries_total <= std::max<std::int64_t>(heads * (opt.budget + opt.buffer) - 1 + heads, heads * opt.prefill));
    } catch (const Error&) {
      check(!accepted);
    }
  }
  return 0;
}
