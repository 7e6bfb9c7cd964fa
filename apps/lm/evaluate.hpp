// kvpolicy-lm's measurements: the per-token negative log-likelihood of a text run through a policy's
// cache (eviction decided inside the loop, step by step), and the comparison with llama.cpp's golden
// data (kvpolicy_tools.eval.llama_golden).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "decoder.hpp"
#include "kvpolicy/gate/safetensors.hpp"

namespace kvpolicy::lm {

struct Run {
  std::vector<float> nll;           // [N]: nll[t] = -log p(token t | tokens < t); nll[0] = NaN
  Matrix logits;                    // [N, V] when kept
  std::int64_t peak_entries = 0;    // most entries the sequence held after any step
  std::int64_t final_entries = 0;
  double mean_entries = 0.0;        // entries held after each step, averaged over the text's tokens
  double sd_entries = 0.0;          // their standard deviation, weighted alike: how far memory swings
  std::int64_t evictions = 0;       // steps whose trigger fired (a threshold budget's: every step)
  double seconds = 0.0;
};

/// -log softmax(row)[id], in double.
inline double nll_of(const Eigen::Ref<const Eigen::RowVectorXf>& row, int id) {
  const double mx = row.maxCoeff();
  double sum = 0.0;
  for (Eigen::Index j = 0; j < row.size(); ++j) sum += std::exp(static_cast<double>(row(j)) - mx);
  return std::log(sum) + mx - static_cast<double>(row(id));
}

/// Runs `tokens` as sequence 0 of `cache`: a first step of `prefill` tokens (declared as the
/// prompt), then `probe`'s tokens as a probe step where given (SPEC §10: probe_tokens, for a policy
/// that reads a reconstruction; they are no part of the text and score nothing), then steps of
/// `chunk`; every step commits (trigger and eviction) before the next. at_end, when given, sees the
/// cache after the last step, before the sequence is removed.
template <class CacheT>
Run score_text(Decoder& dec, CacheT& cache, const EntryMetadata& metadata, std::span<const int> tokens,
               std::int64_t prefill, std::int64_t chunk, bool keep_logits,
               const std::function<void(const CacheT&)>& at_end = {}, std::span<const int> probe = {}) {
  const auto N = static_cast<std::int64_t>(tokens.size());
  require(prefill >= 1 && chunk >= 1, "kvpolicy-lm: --prefill ", prefill, " and --chunk ", chunk, " must be >= 1");
  Run r;
  r.nll.assign(static_cast<std::size_t>(N), std::nanf(""));
  if (keep_logits) r.logits.resize(N, dec.config().vocab);
  cache.add_sequence(0, std::min(prefill, N));
  Matrix logits;
  double mean_square = 0.0;  // of the entries held, token-weighted as mean_entries
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t n = 0; n < N;) {
    const std::int64_t T = std::min(n == 0 ? prefill : chunk, N - n);
    r.evictions += dec.step(cache, 0, tokens.subspan(static_cast<std::size_t>(n), static_cast<std::size_t>(T)), metadata,
                            &logits).triggered;
    for (std::int64_t t = 0; t < T; ++t) {
      if (n + t + 1 < N)
        r.nll[static_cast<std::size_t>(n + t + 1)] =
            static_cast<float>(nll_of(logits.row(t), tokens[static_cast<std::size_t>(n + t + 1)]));
      if (keep_logits) r.logits.row(n + t) = logits.row(t);
    }
    if (n == 0 && !probe.empty()) {  // the probe's entries leave at its commit: it adds no step to the text
      cache.open_probe(0);
      r.evictions += dec.step(cache, 0, probe, metadata, nullptr).triggered;
    }
    n += T;
    r.peak_entries = std::max(r.peak_entries, cache.total_length(0));
    const auto held = static_cast<double>(cache.total_length(0));
    r.mean_entries += static_cast<double>(T) * held / static_cast<double>(N);
    mean_square += static_cast<double>(T) * held * held / static_cast<double>(N);
  }
  r.sd_entries = std::sqrt(std::max(0.0, mean_square - r.mean_entries * r.mean_entries));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.final_entries = cache.total_length(0);
  if (at_end) at_end(cache);
  cache.remove_sequence(0);
  return r;
}

/// exp(mean nll[t]) over t in [max(from, 1), N).
inline double perplexity(const std::vector<float>& nll, std::int64_t from) {
  double sum = 0.0;
  std::int64_t n = 0;
  for (std::size_t t = static_cast<std::size_t>(std::max<std::int64_t>(from, 1)); t < nll.size(); ++t, ++n) sum += nll[t];
  require(n > 0, "kvpolicy-lm: no position to score: --score-from ", from, " is past the ", nll.size(), " tokens");
  return std::exp(sum / static_cast<double>(n));
}

/// llama.cpp's run of the same text (kvpolicy_tools.eval.llama_golden): the token ids, the NLL of each position
/// and the top-k logits of each position.
struct Golden {
  std::vector<std::int64_t> tokens;   // [N]
  std::vector<float> nll;             // [N], nll[0] unused
  std::vector<std::int64_t> top_ids;  // [N, k]
  std::vector<float> top_logits;      // [N, k]
  std::int64_t k = 0;

  static Golden load(const std::string& path) {
    const auto f = safetensors::File::read(path);
    Golden g;
    g.tokens = f.int64s("tokens");
    const auto N = static_cast<std::int64_t>(g.tokens.size());
    g.nll = f.floats("nll", {N});
    g.k = f.info("top_ids").shape.at(1);
    g.top_ids = f.int64s("top_ids", {N, g.k});
    g.top_logits = f.floats("top_logits", {N, g.k}, true);
    return g;
  }
};

struct Agreement {
  bool same_tokens = false;
  std::int64_t first_difference = -1;  // the first position whose token differs
  double ppl = 0.0, golden_ppl = 0.0;  // over positions >= score_from
  double top1 = 0.0;                   // fraction of positions whose argmax is llama.cpp's
  double mean_abs_dlogit = 0.0;        // over positions and llama.cpp's top-k ids
  double max_abs_dlogit = 0.0;
};

inline Agreement compare(const Golden& g, std::span<const int> tokens, const Run& r, std::int64_t score_from) {
  Agreement a;
  const auto N = static_cast<std::int64_t>(tokens.size());
  a.same_tokens = N == static_cast<std::int64_t>(g.tokens.size());
  for (std::int64_t t = 0; t < std::min<std::int64_t>(N, static_cast<std::int64_t>(g.tokens.size())); ++t)
    if (tokens[static_cast<std::size_t>(t)] != g.tokens[static_cast<std::size_t>(t)]) {
      a.same_tokens = false;
      a.first_difference = t;
      break;
    }
  if (!a.same_tokens) return a;
  a.ppl = perplexity(r.nll, score_from);
  a.golden_ppl = perplexity(g.nll, score_from);
  std::int64_t agree = 0;
  double sum = 0.0;
  for (std::int64_t t = 0; t < N; ++t) {
    Eigen::Index best = 0;
    r.logits.row(t).maxCoeff(&best);
    agree += best == g.top_ids[static_cast<std::size_t>(t * g.k)];
    for (std::int64_t j = 0; j < g.k; ++j) {
      const auto i = static_cast<std::size_t>(t * g.k + j);
      const double dl = std::abs(static_cast<double>(r.logits(t, g.top_ids[i])) - g.top_logits[i]);
      sum += dl;
      a.max_abs_dlogit = std::max(a.max_abs_dlogit, dl);
    }
  }
  a.top1 = static_cast<double>(agree) / static_cast<double>(N);
  a.mean_abs_dlogit = sum / static_cast<double>(N * g.k);
  return a;
}

}  // namespace kvpolicy::lm
