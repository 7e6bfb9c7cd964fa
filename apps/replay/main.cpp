// kvpolicy-replay — replay a recorded trace through a KV-cache policy and budget.
//   kvpolicy-replay --trace IN.safetensors --policy POLICY --budget M --buffer B
//                   [--horizon h] [--floor f] [--window w] [--threshold a [--min-tokens F]] [--prefill P] [--probe Q]
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

#include "../common/run_flags.hpp"
#include "heatmap.hpp"
#include "kvpolicy/open.hpp"
#include "replay.hpp"

using namespace kvpolicy;

namespace {

const char* kUsage = R"(kvpolicy-replay: replay a KV-cache trace through a policy and budget.

usage:
  kvpolicy-replay --trace IN.safetensors --policy POLICY --budget M --buffer B --out OUT.safetensors
                  [--horizon h] [--floor f] [--window w] [--threshold a [--min-tokens F]] [--prefill P]
                  [--probe Q] [--png DIR [--layers 0,1,..] [--heads 0,1,..]]
  kvpolicy-replay --demo [--png DIR]
  kvpolicy-replay --write-synthetic OUT.safetensors [--tokens T]   the demo's trace, as a file

options:
  --policy P       one of the policies below (default trimkv); its options as --NAME VALUE
  --prefill P      append the first P tokens as one chunk, the prompt (default 0: one token per step)
  --probe Q        the Q tokens after the prompt are a probe step that never joins the sequence
                   (a policy whose inputs are a reconstruction, kvzip: the model repeating its prompt)
  --list-policies  the registered policies, one per line: name, options, inputs, prompt, device
  --list-options   every policy's options, defaults and values, as a Markdown table
  --png DIR        write retention and eviction heatmaps (TRIM-KV paper, Fig. 4)
  --layers, --heads  which heatmaps (default: layer 0, every kv head)
  --no-reference   skip the full-cache attention (no attn_rel_error; most of a run's time on a
                   real trace)

Every argument is checked before any work; an option the policy does not take is an error.
--gate: trimkv and dbtrimkv run their retention gate on the trace's gate_input in place of its
log_beta; wgkv runs its write gate on the trace's keys_pre_rope and keys. The
output is written atomically (a failed run leaves an existing OUT as it was) and its metadata
records every option of the run.

input  (safetensors): log_beta [L,Hkv,T] f32; optional keys, values [L,Hkv,T,d], queries [L,Hq,T,d],
                      hidden_states [L',T,D], write_gate [L,Hkv,T], keys_pre_rope [L,Hkv,T,d],
                      gate_input [L,T,D]
output (safetensors): evicted_at [L,Hkv,T] i64 (tokens read at eviction, -1 = survived), step_end [S] i64,
                      attn_rel_error [S] f32 (with keys/values/queries)
)";

// Every option of the run, as the output's metadata (a file describes the run that made it).
std::vector<std::pair<std::string, std::string>> run_metadata(const replay::Options& o, const std::string& trace,
                                                               bool reference, bool trace_has_attention) {
  std::vector<std::pair<std::string, std::string>> out{{"trace", trace}, {"policy", o.policy}, {"prefill", std::to_string(o.prefill)},
                                                  {"probe", std::to_string(o.probe)}};
  // every registered option, as the run used it (its policy's value, else the registry's default)
  for (const registry::Option& option : registry::all_options())
    out.emplace_back(option.record_key(), o.value(std::string(option.name)));
  out.emplace_back("reference", !trace_has_attention ? "none (the trace has no keys, values and queries)"
                                : reference         ? "full-cache attention"
                                                    : "none (--no-reference)");
  return out;
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
    std::string label;
    replay::Options o;
    std::int64_t M = 0, B = 0;  // the table's budget and buffer columns (B = 0: the policy takes none)
  };
  std::vector<Row> rows;
  // M and B where the policy takes them (the EpiKV family: K = M, no buffer)
  const auto row = [&](std::string label, std::string_view policy, std::int64_t M) -> replay::Options& {
    replay::Options o;
    o.policy = std::string(policy);
    o.offer("budget", static_cast<double>(M)).offer("buffer", static_cast<double>(M / 8));
    // WG-KV: a ring of W_local = M / 2 and every older token its gate admitted (memory not fixed);
    // the EpiKV family: bands 2 and 4 of the synthetic hidden states (the jumps are at layer 2)
    o.offer("local", static_cast<double>(M / 2)).offer("band-a", 2).offer("band-b", 4);
    // a policy that compresses the prompt (SnapKV, AdaKV): the first 1024 tokens as one chunk
    if (registry::needs_prompt_length(policy)) {
      o.prefill = 1024;
      label += " P=1024";
    }
    // one that runs a probe after the prompt (KVzip): the 128 tokens after it as the probe, the
    // prompt compressed to M per head on average
    if (registry::input_source(policy).probes) {
      o.prefill = 1024;
      o.probe = 128;
      o.set("ratio", 1.0 - static_cast<double>(M) / 1024.0);
      label += " P=1024";
    }
    rows.push_back({std::move(label), o, M, registry::takes(policy, "buffer") ? M / 8 : 0});
    return rows.back().o;
  };
  for (std::int64_t M : {64, 128, 256}) {
    // every registered policy (the registry's list: a new policy appears here by being registered)
    for (const std::string_view name : registry::names())
      if (name != "full") row(std::string(name), name, M);
    // two settings more: DBTrimKV's floor quotas, and WG-KV's hard budget M_avg (appendix K, the
    // budget column) with a ring of half of it
    row("dbtrimkv f=0.5", "dbtrimkv", M).set("floor", 0.5);
    row("wgkv+budget", "wgkv", M / 2).set("local", static_cast<double>(M / 4)).set("avg-budget", static_cast<double>(M / 2));
  }
  row("full cache", "full", tr.tokens);
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
    std::printf("%-18s %7lld %6s %11lld %10.1f%% %10.1f%% %12.4f %12.4f %11.1f\n", row.label.c_str(),
                static_cast<long long>(row.M), row.B > 0 ? std::to_string(row.B).c_str() : "-",
                static_cast<long long>(r.peak_entries_per_head), 100.0 * r.peak_entries_total / full_entries,
                100.0 * r.mean_entries_total / full_entries, mean_err, tail_err, 1e6 * r.seconds_per_step);
    if (!png_dir.empty() && row.M == 128 && !row.o.given.contains("floor") && !row.o.given.contains("avg-budget")) {
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
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        require(i + 1 < argc, a, " needs a value");
        return argv[++i];
      };
      apps::answer_info_flag(a, kUsage);
      if (a == "--demo") run_demo = true;
      else if (a == "--no-reference") reference = false;
      else if (a == "--write-synthetic") synthetic_out = value();
      else if (a == "--tokens") synthetic_tokens = cli::integer(a, value());
      else if (a == "--trace") trace = value();
      else if (a == "--out") out = value();
      else if (a == "--png") png = value();
      else if (a == "--policy") o.policy = value();
      else if (a == "--prefill") o.prefill = cli::integer(a, value());
      else if (a == "--probe") o.probe = cli::integer(a, value());
      else if (a.starts_with("--") && registry::is_option(a.substr(2))) o.set(a.substr(2), value());
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
    // the policy and its options (the registry refuses an option the policy does not take)
    registry::check_options(o);
    require(png.empty() ? layers.empty() && heads.empty() : true, "--layers and --heads choose heatmaps: give --png DIR");
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
