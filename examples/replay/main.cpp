// kvpolicy-replay — replay a recorded trace through a KV-cache policy and budget.
//   kvpolicy-replay --trace IN.safetensors --policy POLICY --budget M --buffer B
//                   [--horizon h] [--floor f] [--window w] [--threshold a] [--prefill P]
//                   --out OUT.safetensors [--png DIR --layers 0,1 --heads 0,2]
//   kvpolicy-replay --demo [--png DIR]     the synthetic trace through every policy, as a table
// Formats: docs/replay.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "../cli.hpp"
#include "heatmap.hpp"
#include "replay.hpp"

using namespace kvpolicy;

namespace {

const char* kUsage = R"(kvpolicy-replay: replay a KV-cache trace through a policy and budget.

usage:
  kvpolicy-replay --trace IN.safetensors --policy POLICY --budget M --buffer B --out OUT.safetensors
                  [--horizon h] [--floor f] [--window w] [--threshold a] [--prefill P]
                  [--png DIR [--layers 0,1,..] [--heads 0,1,..]]
  kvpolicy-replay --demo [--png DIR]
  kvpolicy-replay --write-synthetic OUT.safetensors [--tokens T]   the demo's trace, as a file

policies:
  trimkv     TRIM-KV: score log_beta*(n+1-p), per-head budget M, evict when a head reaches M+B
  dbtrimkv   DBTrimKV: lookahead score over horizon h, one global budget L*Hkv*M per sequence,
             optional floor_ratio f
  wgkv       WG-KV: the W_local newest tokens of every head and the older ones with write gate
             g >= tau (from the trace's write_gate, or --gate on its keys_pre_rope and keys)
  epikv      EpiKV: z-scored hidden-state change z_A - z_B (needs hidden_states), budget K = M
             generated tokens per head, the --prefill prompt and R newest protected, 1 eviction/step
  hs-var     HS-var: rolling mean of the hidden-state change, g_A - g_B (as epikv)
  kv-key     rolling mean of the key's variance over its components (as epikv; needs keys)
  kv-val     the same on values
  lag-kv     kv-key + kv-val after lag-relative min-max normalisation per channel
  streamingllm  StreamingLLM: the S first tokens (sinks) and the newest, per-head budget M
  h2o        H2O: accumulated attention mass, the newest M/2 protected, per-head budget M
             (needs keys, values and queries)
  snapkv     SnapKV: compress the --prefill prompt once to M per head by the attention of its
             last W_obs queries (--window, default min(32, M)), pooled along positions (--pool,
             --pool-kernel: avg 5) and reduced over the GQA group (--gqa: mean); decode tokens
             stay (needs keys and queries)
  knorm      KNorm: keep the keys of smallest L2 norm, per-head budget M (needs keys in the trace)
  keydiff    KeyDiff: keep keys least aligned with the head's mean key direction, per-head budget M
  random     Random: seeded uniform scores, per-head budget M

options:
  --budget M       entries kept per (layer, kv head) (default 1024)
  --buffer B       eviction runs once a head (or the sequence) is B past its budget (default 128)
  --horizon h      lookahead horizon, dbtrimkv only (default 2)
  --floor f        floor_ratio in [0, 1), dbtrimkv only (default 0)
  --window w       protect the w newest entries of every head (default 0; h2o: 0 = M/2; snapkv:
                   W_obs, default min(32, M); wgkv: its window is its ring, --local)
  --threshold a    keep every entry scoring >= log(a) instead of a top-M (default off)
  --prefill P      append the first P tokens as one chunk (default 0: one token per step)
  --sinks S        protect the S oldest entries of every head, the attention sinks (default 4 for
                   streamingllm, 0 for the others)
  --pool avg|max   snapkv: pooling along positions (default avg)
  --pool-kernel k  snapkv: the pooling kernel, odd (default 5)
  --gqa mean|max   snapkv: reduction over the query heads of a kv head (default mean)
  --seed N         random only (default 0)
  --band-a A, --band-b B  hidden-state layers of epikv and hs-var (default 10 and 21)
  --recency R      newest generated tokens kept by the epikv family (default min(128, M/4))
  --local W        W_local, wgkv only (default 256)
  --tau t          admission threshold, wgkv only (default 0.1)
  --gate FILE      trimkv, dbtrimkv: retention-gate weights (dbtrimkv: the authors' rg10, or the
                   paper's tied gate) run on the trace's gate_input, in place of its log_beta;
                   wgkv: write-gate weights (docs/formats.md) to run on the trace's keys
  --avg-budget M   wgkv: hard budget of L*Hkv*M global-cache entries (rings not counted); past it
                   each head drops floor(10%) of its global cache by the attention the last 256
                   queries give its global keys (default 0: none)
  --png DIR        write retention and eviction heatmaps (TRIM-KV paper, Fig. 4)
  --layers, --heads  which heatmaps (default: layer 0, every kv head)
  --no-reference   skip the full-cache attention (no attn_rel_error; most of a run's time on a
                   real trace)

Every argument is checked before any work; an option the policy does not take is an error. The
output is written atomically (a failed run leaves an existing OUT as it was) and its metadata
records every option of the run.

input  (safetensors): log_beta [L,Hkv,T] f32; optional keys, values [L,Hkv,T,d], queries [L,Hq,T,d],
                      hidden_states [L',T,D], write_gate [L,Hkv,T], keys_pre_rope [L,Hkv,T,d],
                      gate_input [L,T,D]
output (safetensors): evicted_at [L,Hkv,T] i64 (n at eviction, -1 = survived), step_end [S] i64,
                      attn_rel_error [S] f32 (with keys/values/queries)
)";

// Which policies take each policy option (the others refuse it rather than ignore it).
struct FlagUse {
  const char* flag;
  std::vector<std::string> policies;
};
const std::vector<FlagUse>& flag_uses() {
  static const std::vector<std::string> epikv_family{"epikv", "hs-var", "kv-key", "kv-val", "lag-kv"};
  static const std::vector<FlagUse> uses{
      {"--buffer", {"trimkv", "dbtrimkv", "streamingllm", "h2o", "knorm", "keydiff", "random"}},
      {"--budget", {"trimkv", "dbtrimkv", "epikv", "hs-var", "kv-key", "kv-val", "lag-kv", "streamingllm", "h2o", "snapkv",
                    "knorm", "keydiff", "random"}},
      {"--horizon", {"dbtrimkv"}},
      {"--floor", {"dbtrimkv"}},
      {"--window", {"trimkv", "dbtrimkv", "epikv", "hs-var", "kv-key", "kv-val", "lag-kv", "streamingllm", "h2o", "snapkv",
                    "knorm", "keydiff", "random"}},
      {"--threshold", {"trimkv", "dbtrimkv"}},
      {"--pool", {"snapkv"}},
      {"--pool-kernel", {"snapkv"}},
      {"--gqa", {"snapkv"}},
      {"--seed", {"random"}},
      {"--band-a", {"epikv", "hs-var"}},
      {"--band-b", {"epikv", "hs-var"}},
      {"--recency", epikv_family},
      {"--local", {"wgkv"}},
      {"--tau", {"wgkv"}},
      {"--gate", {"wgkv", "trimkv", "dbtrimkv"}},
      {"--avg-budget", {"wgkv"}},
  };
  return uses;
}

void check_flags_apply(const std::vector<std::string>& given, const std::string& policy) {
  for (const auto& use : flag_uses()) {
    if (std::find(given.begin(), given.end(), use.flag) == given.end()) continue;
    if (std::find(use.policies.begin(), use.policies.end(), policy) != use.policies.end()) continue;
    std::string takers;
    for (const auto& p : use.policies) takers += (takers.empty() ? "" : ", ") + p;
    fail(use.flag, " does not apply to policy ", policy, " (it is for: ", takers, ")");
  }
}

// Every option of the run, as the output's metadata (a file describes the run that made it).
std::vector<std::pair<std::string, std::string>> run_metadata(const replay::Options& o, const std::string& trace,
                                                               bool reference, bool trace_has_attention) {
  const auto num = [](double x) {
    std::ostringstream out;
    out.precision(17);
    out << x;
    return out.str();
  };
  return {{"trace", trace},
          {"policy", o.policy},
          {"budget", std::to_string(o.budget)},
          {"buffer", std::to_string(o.buffer)},
          {"horizon", std::to_string(o.horizon)},
          {"floor_ratio", num(o.floor_ratio)},
          {"window", std::to_string(o.window)},
          {"threshold", num(o.threshold)},
          {"prefill", std::to_string(o.prefill)},
          {"sinks", std::to_string(o.sinks)},
          {"seed", std::to_string(o.seed)},
          {"band_a", std::to_string(o.band_a)},
          {"band_b", std::to_string(o.band_b)},
          {"recency", std::to_string(o.recency)},
          {"local", std::to_string(o.local)},
          {"tau", num(o.tau)},
          {"gate", o.gate},
          {"average_budget", std::to_string(o.average_budget)},
          {"pooling", o.pooling},
          {"pool_kernel", std::to_string(o.pool_kernel)},
          {"gqa", o.gqa},
          {"reference", !trace_has_attention ? "none (the trace has no keys, values and queries)"
                        : reference         ? "full-cache attention"
                                            : "none (--no-reference)"}};
}

std::vector<int> parse_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      std::size_t used = 0;
      out.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      fail(what, ": '", item, "' is not an integer");
    }
  }
  return out;
}

// The heatmaps' layers and kv heads (default: layer 0, every kv head), checked against the trace.
void select_heatmaps(const replay::Trace& tr, std::vector<int>& layers, std::vector<int>& heads) {
  if (layers.empty()) layers = {0};
  if (heads.empty())
    for (int h = 0; h < tr.kv_heads; ++h) heads.push_back(h);
  for (int l : layers) require(l >= 0 && l < tr.layers, "--layers: layer ", l, " out of range [0, ", tr.layers, ")");
  for (int h : heads) require(h >= 0 && h < tr.kv_heads, "--heads: kv head ", h, " out of range [0, ", tr.kv_heads, ")");
}

void write_pngs(const std::string& dir, const replay::Trace& tr, const replay::Result& r, const std::vector<int>& layers,
                const std::vector<int>& heads) {
  std::filesystem::create_directories(dir);
  for (int l : layers)
    for (int h : heads) replay::write_heatmaps(dir, tr, r.evicted_at, l, h);
}

int demo(const std::string& png_dir) {
  const auto tr = replay::synthetic_trace();
  std::printf("kvpolicy demo: synthetic trace, L=%d Hkv=%d Hq=%d d=%d, T=%lld tokens decoded one per step\n",
              tr.layers, tr.kv_heads, tr.q_heads, tr.head_dim, static_cast<long long>(tr.tokens));
  std::printf("heads: sinks (kind 0), sliding window (kind 1), sparse gist tokens (kind 2)\n\n");
  const auto full = replay::full_attention(tr);
  struct Row {
    const char* label;
    replay::Options o;
  };
  std::vector<Row> rows;
  const auto options = [](const char* policy, std::int64_t M, std::int64_t B) {
    replay::Options o;
    o.policy = policy;
    o.budget = M;
    o.buffer = B;
    return o;
  };
  for (std::int64_t M : {64, 128, 256}) {
    for (const char* name : {"trimkv", "dbtrimkv"}) rows.push_back({name, options(name, M, M / 8)});
    rows.back().label = "dbtrimkv h=2";
    rows.push_back({"dbtrimkv f=0.5", options("dbtrimkv", M, M / 8)});
    rows.back().o.floor_ratio = 0.5;
    // WG-KV: a ring of W_local = M / 2 and every older token its gate admitted (memory not fixed)
    rows.push_back({"wgkv W=M/2", options("wgkv", M, 1)});
    rows.back().o.local = M / 2;
    // appendix K: a hard budget M_avg (the budget column) with a ring of half of it
    rows.push_back({"wgkv+budget W=M/2", options("wgkv", M / 2, 1)});
    rows.back().o.local = M / 4;
    rows.back().o.average_budget = M / 2;
    // the EpiKV family: K = M generated tokens, one eviction per step (no buffer); bands 2 and 4 of
    // the synthetic hidden states (the jumps are at layer 2)
    for (const char* name : {"epikv", "hs-var", "kv-key", "kv-val", "lag-kv"}) {
      rows.push_back({name, options(name, M, 1)});
      rows.back().o.band_a = 2;
      rows.back().o.band_b = 4;
    }
    for (const char* name : {"streamingllm", "h2o", "knorm", "keydiff", "random"}) rows.push_back({name, options(name, M, M / 8)});
    // SnapKV compresses a prompt: the first 1024 tokens as one chunk, then the rest is kept
    rows.push_back({"snapkv P=1024", options("snapkv", M, 1)});
    rows.back().o.prefill = 1024;
  }
  rows.push_back({"full cache", options("trimkv", tr.tokens, 1)});
  const double full_entries = static_cast<double>(tr.layers * tr.kv_heads * tr.tokens);
  std::printf("%-18s %7s %6s %11s %11s %11s %12s %12s %11s\n", "policy", "budget", "buffer", "peak/head", "peak mem",
              "mean mem", "attn err", "attn err", "us/step");
  std::printf("%-18s %7s %6s %11s %11s %11s %12s %12s %11s\n", "", "M", "B", "entries", "vs full", "vs full", "mean",
              "last 256", "");
  for (const auto& row : rows) {
    const auto r = replay::replay(tr, row.o, &full);
    double mean_err = 0.0, tail_err = 0.0;
    for (float e : r.attn_rel_error) mean_err += e;
    mean_err /= static_cast<double>(r.attn_rel_error.size());
    const std::size_t tail = std::min<std::size_t>(256, r.attn_rel_error.size());
    for (std::size_t i = r.attn_rel_error.size() - tail; i < r.attn_rel_error.size(); ++i) tail_err += r.attn_rel_error[i];
    tail_err /= static_cast<double>(tail);
    std::printf("%-18s %7lld %6lld %11lld %10.1f%% %10.1f%% %12.4f %12.4f %11.1f\n", row.label,
                static_cast<long long>(row.o.budget), static_cast<long long>(row.o.buffer),
                static_cast<long long>(r.peak_entries_per_head), 100.0 * r.peak_entries_total / full_entries,
                100.0 * r.mean_entries_total / full_entries, mean_err, tail_err, 1e6 * r.seconds_per_step);
    if (!png_dir.empty() && row.o.budget == 128 && row.o.floor_ratio == 0.0) {
      const std::string sub = png_dir + "/" + row.o.policy + "_M128";
      std::filesystem::create_directories(sub);
      for (int l = 0; l < tr.layers; ++l)
        for (int h = 0; h < tr.kv_heads; ++h) replay::write_heatmaps(sub, tr, r.evicted_at, l, h);
    }
  }
  std::printf(
      "\ncolumns:\n"
      "  peak/head entries  the most entries one (layer, kv head) held at any time (before a step's\n"
      "                     eviction). Per-head policies stay within M + B; DBTrimKV's budget is one\n"
      "                     L*Hkv*M for the sequence, so one head may hold far more than M + B while\n"
      "                     others hold less; WG-KV without a hard budget is bounded by its gate only.\n"
      "  peak mem, mean mem entries held at the peak / on average over the steps, as a share of what\n"
      "                     the full cache holds at the end (L*Hkv*T). The full cache grows from 0 to\n"
      "                     T, so its own mean is 50%%.\n"
      "  attn err           ||o - o_full|| / ||o_full|| of the attention output per step, over all\n"
      "                     layers and heads: its mean over every step and over the last 256.\n"
      "  us/step            the policy cache's step (append, attend, trigger, evict), microseconds.\n");
  if (!png_dir.empty())
    std::printf("heatmaps (TRIM-KV paper, Fig. 4), every policy at M = 128: %s/<policy>_M128/ (docs/replay.md)\n",
                png_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string trace, out, png;
    bool run_demo = false;
    std::string synthetic_out;
    std::int64_t synthetic_tokens = 1536;
    std::vector<int> layers, heads;
    replay::Options o;
    bool reference = true;
    std::vector<std::string> given;  // the options on the command line, to refuse those that do not apply
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      given.push_back(a);
      auto value = [&]() -> std::string {
        require(i + 1 < argc, a, " needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (a == "--demo") run_demo = true;
      else if (a == "--no-reference") reference = false;
      else if (a == "--write-synthetic") synthetic_out = value();
      else if (a == "--tokens") synthetic_tokens = cli::integer(a, value());
      else if (a == "--trace") trace = value();
      else if (a == "--out") out = value();
      else if (a == "--png") png = value();
      else if (a == "--policy") o.policy = value();
      else if (a == "--budget") o.budget = cli::integer(a, value());
      else if (a == "--buffer") o.buffer = cli::integer(a, value());
      else if (a == "--horizon") o.horizon = static_cast<int>(cli::integer(a, value()));
      else if (a == "--floor") o.floor_ratio = cli::number(a, value());
      else if (a == "--window") o.window = cli::integer(a, value());
      else if (a == "--sinks") {
        o.sinks = cli::integer(a, value());
        require(o.sinks >= 0, "--sinks S = ", o.sinks, " must be >= 0");
      }
      else if (a == "--seed") o.seed = static_cast<std::uint64_t>(cli::integer(a, value()));
      else if (a == "--threshold") o.threshold = cli::number(a, value());
      else if (a == "--prefill") o.prefill = cli::integer(a, value());
      else if (a == "--band-a") o.band_a = static_cast<int>(cli::integer(a, value()));
      else if (a == "--band-b") o.band_b = static_cast<int>(cli::integer(a, value()));
      else if (a == "--recency") o.recency = cli::integer(a, value());
      else if (a == "--local") o.local = cli::integer(a, value());
      else if (a == "--tau") o.tau = cli::number(a, value());
      else if (a == "--gate") o.gate = value();
      else if (a == "--avg-budget") o.average_budget = cli::integer(a, value());
      else if (a == "--pool") o.pooling = value();
      else if (a == "--pool-kernel") o.pool_kernel = static_cast<int>(cli::integer(a, value()));
      else if (a == "--gqa") o.gqa = value();
      else if (a == "--layers") layers = parse_list(value(), "--layers");
      else if (a == "--heads") heads = parse_list(value(), "--heads");
      else fail("unknown argument '", a, "' (see --help)");
    }
    if (run_demo) return demo(png);
    if (!synthetic_out.empty()) {
      // about 13 KB a token (L 4, Hkv 2, Hq 8, d 64, K, V, Q, hidden states): 2^16 tokens is 850 MB
      constexpr std::int64_t kMaxSyntheticTokens = std::int64_t{1} << 16;
      require(synthetic_tokens >= 1 && synthetic_tokens <= kMaxSyntheticTokens, "--tokens T = ", synthetic_tokens,
              " must be in [1, ", kMaxSyntheticTokens, "]");
      replay::write_trace(replay::synthetic_trace(4, 2, 4, 64, synthetic_tokens), synthetic_out);
      return 0;
    }
    // every argument is checked before any work, and before anything is written
    require(!trace.empty(), "--trace IN.safetensors is required (see --help)");
    require(!out.empty(), "--out OUT.safetensors is required (see --help)");
    {
      namespace fs = std::filesystem;
      std::error_code out_ec, trace_ec, same_ec;
      const auto out_path = fs::weakly_canonical(out, out_ec), trace_path = fs::weakly_canonical(trace, trace_ec);
      const bool same = out_ec || trace_ec ? out == trace : out_path == trace_path;
      require(!same && !fs::equivalent(out, trace, same_ec), "--out '", out, "' is the trace itself: it would overwrite the input");
    }
    require(std::find(replay::policies().begin(), replay::policies().end(), o.policy) != replay::policies().end(),
            "--policy: unknown policy '", o.policy, "' (known: ", replay::policy_list(), ")");
    check_flags_apply(given, o.policy);
    o.sinks = o.sinks_or_default();  // the metadata records the S the run used
    require(png.empty() ? layers.empty() && heads.empty() : true, "--layers and --heads choose heatmaps: give --png DIR");
    require(o.average_budget >= 0, "--avg-budget M = ", o.average_budget, " must be >= 0 (0: no hard budget)");
    // TRIM-KV's score log(beta) * age is <= 0, DBTrimKV's lookahead score <= log(h) (SPEC §1, §2): an
    // alpha above that bound would keep nothing
    const double alpha_max = o.policy == "dbtrimkv" ? static_cast<double>(o.horizon) : 1.0;
    require(o.threshold >= 0.0 && o.threshold <= alpha_max, "--threshold alpha = ", o.threshold, " must be in (0, ",
            alpha_max, "] for ", o.policy, " (its scores are <= log ", alpha_max, ": a larger alpha keeps nothing; 0 = off)");
    const auto tr = replay::read_trace(trace);
    // replay() takes a prompt past the trace as the whole trace; from the command line it is a mistake
    require(o.prefill <= tr.tokens, "--prefill P = ", o.prefill, " must be in [0, T = ", tr.tokens, "], the trace's tokens");
    select_heatmaps(tr, layers, heads);
    const auto r = replay::replay(tr, o, replay::Reference{nullptr, reference});
    safetensors::Writer w;
    w.add_i64("evicted_at", {tr.layers, tr.kv_heads, tr.tokens}, r.evicted_at);
    w.add_i64("step_end", {static_cast<std::int64_t>(r.step_end.size())}, r.step_end);
    if (!r.attn_rel_error.empty())
      w.add_f32("attn_rel_error", {static_cast<std::int64_t>(r.attn_rel_error.size())}, r.attn_rel_error);
    for (const auto& [key, value] : run_metadata(o, trace, reference, tr.has_attention())) w.metadata(key, value);
    w.write(out);
    if (!png.empty()) write_pngs(png, tr, r, layers, heads);
    std::printf("%s: %lld steps, peak %lld entries per head, %.2f us per step -> %s\n", o.policy.c_str(),
                static_cast<long long>(r.step_end.size()), static_cast<long long>(r.peak_entries_per_head),
                1e6 * r.seconds_per_step, out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
