// What the tests of the prompt-compressing policies (SnapKV's score: AdaKV, PyramidKV) share: a
// sequence whose declared prompt of P tokens arrives in random chunks and then three decode tokens,
// keys drawn from a small palette (so equal scores, ties, are common) and random queries, every
// step attended; and each head's SnapKV score of the prompt as the oracles rank it.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/policies/snapkv.hpp"

namespace kvpolicy::test {

struct PromptStream {
  int L, H, G, d;
  std::int64_t P;
  std::vector<std::vector<float>> palette;
  std::map<std::pair<int, int>, std::vector<float>> K, Q;  // (layer, head) -> [tokens, d], in position order
  std::int64_t n = 0;                                      // tokens so far

  /// Draws the palette of four keys from `rng`.
  PromptStream(int layers, int heads, int group, int head_dim, std::int64_t prompt, std::mt19937_64& rng)
      : L(layers), H(heads), G(group), d(head_dim), P(prompt), palette(4, std::vector<float>(static_cast<std::size_t>(head_dim))) {
    for (auto& k : palette)
      for (auto& x : k) x = std::normal_distribution<float>(0.0f, 1.5f)(rng);
  }

  /// The steps' lengths: the prompt in chunks of 1 to 15 tokens, then three decode tokens.
  std::vector<std::int64_t> chunks(std::mt19937_64& rng) const {
    std::vector<std::int64_t> out;
    for (std::int64_t left = P; left > 0; left -= out.back())
      out.push_back(std::min<std::int64_t>(left, std::uniform_int_distribution<int>(1, 15)(rng)));
    for (int i = 0; i < 3; ++i) out.push_back(1);
    return out;
  }

  /// One step of T tokens through `cache` (sequence 0, declared with prompt P); returns whether it
  /// ended the prompt.
  template <class Cache>
  bool step(Cache& cache, std::int64_t T, std::mt19937_64& rng) {
    std::vector<float> k(static_cast<std::size_t>(L * H * T * d)), q(static_cast<std::size_t>(L * H * G * T * d)),
        out(q.size()), lb(static_cast<std::size_t>(L * H * T), 0.0f);
    for (std::int64_t i = 0; i < L * H * T; ++i) {
      const auto& key = palette[static_cast<std::size_t>(std::uniform_int_distribution<int>(0, 3)(rng))];
      std::copy(key.begin(), key.end(), k.begin() + i * d);
    }
    for (auto& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
    cache.step(0, View<const float, 4>(k.data(), {L, H, T, d}), View<const float, 4>(k.data(), {L, H, T, d}),
               View<const float, 3>(lb.data(), {L, H, T}), View<const float, 4>(q.data(), {L, H * G, T, d}),
               View<float, 4>(out.data(), {L, H * G, T, d}));
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < H; ++h)
        K[{l, h}].insert(K[{l, h}].end(), k.begin() + (l * H + h) * T * d, k.begin() + (l * H + h + 1) * T * d);
      for (int qh = 0; qh < H * G; ++qh)
        Q[{l, qh}].insert(Q[{l, qh}].end(), q.begin() + (l * H * G + qh) * T * d, q.begin() + (l * H * G + qh + 1) * T * d);
    }
    const bool ends = n < P && n + T >= P;
    n += T;
    return ends;
  }

  /// The prompt's entries of head h of layer l scored by SnapKV with observation window W (the
  /// library's score::ObservedAttention, checked against a dense recomputation in test_snapkv.cpp),
  /// the S oldest and W newest at +inf (SPEC §5: protected).
  std::vector<float> snapkv_scores(int l, int h, std::int64_t M, std::int64_t W, std::int64_t S) {
    const std::int64_t wobs = std::min<std::int64_t>(W, P);  // the queries the window holds
    std::vector<float> qw;                                    // [G, wobs, d]
    for (int g = 0; g < G; ++g) {
      const auto& mine = Q[{l, h * G + g}];
      qw.insert(qw.end(), mine.begin() + (P - wobs) * d, mine.begin() + P * d);
    }
    std::vector<std::int32_t> qpos;
    for (std::int64_t t = P - wobs; t < P; ++t) qpos.push_back(static_cast<std::int32_t>(t));
    std::vector<EntryMeta> meta(static_cast<std::size_t>(P));
    for (std::int64_t t = 0; t < P; ++t) meta[static_cast<std::size_t>(t)].position = static_cast<std::int32_t>(t);
    std::vector<float> score(static_cast<std::size_t>(P));
    snapkv_scorer({.budget = M, .window = W})
        .score_window(View<const float, 2>(K[{l, h}].data(), {P, d}), meta, StepContext{P, P, true},
                      ObservedQueries{qw.data(), G, wobs, d, qpos}, score);
    for (std::int64_t t = 0; t < P; ++t)
      if (t < S || t >= P - W) score[static_cast<std::size_t>(t)] = INFINITY;
    return score;
  }
};

/// The prompt's positions by (score, larger position) from best to worst (SPEC, Ties).
inline std::vector<std::int64_t> ranked(const std::vector<float>& score) {
  std::vector<std::int64_t> order(score.size());
  for (std::size_t t = 0; t < order.size(); ++t) order[t] = static_cast<std::int64_t>(t);
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    const float sa = score[static_cast<std::size_t>(a)], sb = score[static_cast<std::size_t>(b)];
    return sa != sb ? sa > sb : a > b;
  });
  return order;
}

}  // namespace kvpolicy::test
