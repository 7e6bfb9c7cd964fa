// A brute-force oracle for SPEC §1–2 eviction: sort everything, apply the SPEC text literally.
// It shares only the scorers with the library (hand-tested in test_math.cpp); triggers, window
// protection, ties, quotas and thresholds are written here again, the slow obvious way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/shape.hpp"

namespace oracle {

using kvpolicy::CacheShape;
using kvpolicy::EntryMeta;

using Heads = std::vector<std::vector<EntryMeta>>;  // [L * Hkv], head_index order

struct Params {
  std::int64_t budget = 4, buffer = 2, window = 0;
  double threshold = 0.0, floor_ratio = 0.0;
  std::int64_t sinks = 0;
  std::int64_t min_tokens = 0;  // the threshold's floor per head
};

struct Ranked {
  float score;
  std::int32_t position;
  std::int64_t head;
  std::size_t index;
};
inline bool before(const Ranked& a, const Ranked& b) {
  return std::make_tuple(-a.score, -static_cast<std::int64_t>(a.position), a.head) <
         std::make_tuple(-b.score, -static_cast<std::int64_t>(b.position), b.head);
}

// Scores of one head, with the `window` largest and the `sinks` smallest positions at +inf.
template <class Scorer>
std::vector<Ranked> scored(const std::vector<EntryMeta>& head, std::int64_t h, std::int64_t n, const Scorer& s,
                           std::int64_t window, std::int64_t sinks = 0) {
  std::vector<std::int32_t> pos;
  for (const auto& e : head) pos.push_back(e.position);
  std::sort(pos.rbegin(), pos.rend());
  const auto len = static_cast<std::int64_t>(pos.size());
  std::vector<Ranked> out;
  for (std::size_t i = 0; i < head.size(); ++i) {
    // rank of this position from the newest (0) and from the oldest (0), by counting
    const auto newer = std::count_if(pos.begin(), pos.end(), [&](std::int32_t p) { return p > head[i].position; });
    const bool protect = newer < window || len - 1 - newer < sinks;
    out.push_back({protect ? std::numeric_limits<float>::infinity() : s(head[i], kvpolicy::StepContext{n, 0, false, 0, h}),
                   head[i].position, h, i});
  }
  return out;
}

inline void keep_only(std::vector<EntryMeta>& head, const std::vector<std::size_t>& keep_idx) {
  std::vector<EntryMeta> kept;
  for (auto i : keep_idx) kept.push_back(head[i]);
  head = kept;
}

// The threshold variant's test for the i-th best (protections first) entry of its head: its score
// reaches log alpha, or it is among the head's min_tokens best.
inline bool above_threshold(const Ranked& r, std::size_t i_in_head, const Params& p) {
  return r.score >= static_cast<float>(std::log(p.threshold)) || static_cast<std::int64_t>(i_in_head) < p.min_tokens;
}

// SPEC §1: each head with len >= M + B keeps its top M; with the threshold variant every head,
// after every step, keeps each entry scoring >= log alpha and its min_tokens best.
template <class Scorer>
void per_head(const CacheShape&, Heads& heads, std::int64_t n, const Scorer& s, const Params& p) {
  for (std::size_t h = 0; h < heads.size(); ++h) {
    if (p.threshold == 0 && static_cast<std::int64_t>(heads[h].size()) < p.budget + p.buffer) continue;
    auto r = scored(heads[h], static_cast<std::int64_t>(h), n, s, p.window, p.sinks);
    std::sort(r.begin(), r.end(), before);
    std::vector<std::size_t> keep;
    for (std::size_t i = 0; i < r.size(); ++i)
      if (p.threshold > 0 ? above_threshold(r[i], i, p) : static_cast<std::int64_t>(i) < p.budget)
        keep.push_back(r[i].index);
    keep_only(heads[h], keep);
  }
}

// Pooled selection over heads [first, last): top K, or floor quotas, or threshold.
template <class Scorer>
void pooled(Heads& heads, std::size_t first, std::size_t last, std::int64_t n, const Scorer& s, const Params& p,
            std::int64_t K) {
  std::vector<Ranked> all;
  for (std::size_t h = first; h < last; ++h) {
    auto r = scored(heads[h], static_cast<std::int64_t>(h), n, s, p.window, p.sinks);
    all.insert(all.end(), r.begin(), r.end());
  }
  std::sort(all.begin(), all.end(), before);
  std::map<std::int64_t, std::vector<std::size_t>> keep;
  if (p.threshold > 0) {
    std::map<std::int64_t, std::size_t> seen;  // entries of each head ranked so far: `all` is sorted
    for (auto& r : all)
      if (above_threshold(r, seen[r.head]++, p)) keep[r.head].push_back(r.index);
  } else if (p.floor_ratio == 0.0) {
    for (std::size_t i = 0; i < all.size() && static_cast<std::int64_t>(i) < K; ++i) keep[all[i].head].push_back(all[i].index);
  } else {
    const auto k1 = static_cast<std::int64_t>(std::floor((1.0 - p.floor_ratio) * static_cast<double>(K)));
    std::map<std::int64_t, std::int64_t> count;
    for (std::size_t i = 0; i < all.size() && static_cast<std::int64_t>(i) < k1; ++i) ++count[all[i].head];
    const auto fq = static_cast<std::int64_t>(std::floor(static_cast<double>(p.budget) * p.floor_ratio));
    for (std::size_t h = first; h < last; ++h) {
      auto r = scored(heads[h], static_cast<std::int64_t>(h), n, s, p.window, p.sinks);
      std::sort(r.begin(), r.end(), before);
      const std::int64_t quota = count[static_cast<std::int64_t>(h)] + fq;
      for (std::size_t i = 0; i < r.size() && static_cast<std::int64_t>(i) < quota; ++i)
        keep[static_cast<std::int64_t>(h)].push_back(r[i].index);
    }
  }
  for (std::size_t h = first; h < last; ++h) keep_only(heads[h], keep[static_cast<std::int64_t>(h)]);
}

// SPEC §2 layer-wise: a layer with total > Hkv (M + B) keeps its top Hkv M; the threshold variant
// runs after every step.
template <class Scorer>
void layer_wise(const CacheShape& shape, Heads& heads, std::int64_t n, const Scorer& s, const Params& p) {
  for (int l = 0; l < shape.layers; ++l) {
    const std::size_t first = static_cast<std::size_t>(l) * shape.kv_heads, last = first + shape.kv_heads;
    std::int64_t total = 0;
    for (std::size_t h = first; h < last; ++h) total += static_cast<std::int64_t>(heads[h].size());
    if (p.threshold > 0 || total > shape.kv_heads * (p.budget + p.buffer)) pooled(heads, first, last, n, s, p, shape.kv_heads * p.budget);
  }
}

// SPEC §2 global: total >= L Hkv (M + B) keeps the top L Hkv M (floor quotas); the threshold
// variant runs after every step.
template <class Scorer>
void global(const CacheShape& shape, Heads& heads, std::int64_t n, const Scorer& s, const Params& p) {
  std::int64_t total = 0;
  for (auto& h : heads) total += static_cast<std::int64_t>(h.size());
  if (p.threshold > 0 || total >= shape.heads_total() * (p.budget + p.buffer)) pooled(heads, 0, heads.size(), n, s, p, shape.heads_total() * p.budget);
}

// SPEC §8 token level: once the sequence holds M + B positions, each position's score is the max,
// or the mean (summed in double, rounded to fp32; any +inf wins, then any -inf), of its heads'
// scores; the S oldest and w newest positions rank first; the top M by (score, larger position)
// stay in every head.
template <class Scorer>
void token_level(const CacheShape&, Heads& heads, std::int64_t n, const Scorer& s, const Params& p, bool mean) {
  std::set<std::int32_t> all;
  for (auto& h : heads)
    for (auto& e : h) all.insert(e.position);
  if (static_cast<std::int64_t>(all.size()) < p.budget + p.buffer) return;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::pair<float, std::int32_t>> ranked;  // (score, position)
  const std::vector<std::int32_t> sorted(all.begin(), all.end());
  for (std::size_t j = 0; j < sorted.size(); ++j) {
    const std::int32_t pos = sorted[j];
    std::vector<float> v;
    for (std::size_t h = 0; h < heads.size(); ++h)
      for (auto& e : heads[h])
        if (e.position == pos) v.push_back(s(e, kvpolicy::StepContext{n, 0, false, 0, static_cast<std::int64_t>(h)}));
    float score = -inf;
    if (!mean) {
      for (float x : v) score = std::max(score, x);
    } else if (std::find(v.begin(), v.end(), inf) != v.end()) {
      score = inf;
    } else if (std::find(v.begin(), v.end(), -inf) == v.end()) {
      double sum = 0;
      for (float x : v) sum += x;
      score = static_cast<float>(sum / static_cast<double>(v.size()));
    }
    const auto older = static_cast<std::int64_t>(j), newer = static_cast<std::int64_t>(sorted.size() - 1 - j);
    if (older < p.sinks || newer < p.window) score = inf;
    ranked.push_back({score, pos});
  }
  std::sort(ranked.begin(), ranked.end(), [](auto a, auto b) { return a.first > b.first || (a.first == b.first && a.second > b.second); });
  std::set<std::int32_t> kept;
  for (std::int64_t i = 0; i < p.budget && i < static_cast<std::int64_t>(ranked.size()); ++i) kept.insert(ranked[static_cast<std::size_t>(i)].second);
  for (auto& h : heads) {
    std::vector<EntryMeta> out;
    for (auto& e : h)
      if (kept.contains(e.position)) out.push_back(e);
    h = out;
  }
}

// A log_beta drawn so that ties are common: a few discrete values, sometimes 0 or -inf.
inline float tie_prone_log_beta(std::mt19937_64& rng) {
  static const float values[] = {0.0f, -0.25f, -0.5f, -1.0f, -2.0f, -std::numeric_limits<float>::infinity()};
  std::uniform_int_distribution<int> pick(0, 9);
  const int k = pick(rng);
  if (k < 6) return values[k];
  return -std::uniform_real_distribution<float>(0.0f, 3.0f)(rng);
}

}  // namespace oracle
