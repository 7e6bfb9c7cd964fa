/// \file
/// kvpolicy/policy/observed_attention.hpp — SnapKV's score (SPEC §5): the attention the last
/// W_obs = 32 queries give each key, from the window of queries the Cache keeps per layer. Per
/// query head g of the kv head's group: softmax(q k^T / sqrt(d)) of each observed query over the
/// keys it may see (causal), summed over the queries; then max-pooled along positions with kernel
/// 7 (stride 1, same length) over the keys outside the observation window (the SnapKV reference
/// pools the prefix only); then the max over the group (GQA). Keys inside the window keep their
/// unpooled score: the evictor protects them. In double, then fp32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"

namespace kvpolicy::score {

struct ObservedAttention {
  static constexpr bool needs_key_norm = false;
  std::int64_t observation_window = 32;  ///< W_obs
  int pool_kernel = 7;                   ///< odd; 1 = no pooling

  void validate() const {
    require(observation_window >= 1 && observation_window <= (1 << 20), "score::ObservedAttention: W_obs = ",
            observation_window, " must be in [1, 2^20]");
    require(pool_kernel >= 1 && pool_kernel % 2 == 1, "score::ObservedAttention: pool kernel = ", pool_kernel,
            " must be odd and >= 1");
  }

  void score_window(View<const float, 2> keys, std::span<const EntryMeta> meta, StepContext, ObservedQueries q,
                    std::span<float> out) const {
    const std::int64_t N = keys.dim(0), d = keys.dim(1);
    std::vector<std::int64_t> order(static_cast<std::size_t>(N));  // entries by position
    std::iota(order.begin(), order.end(), std::int64_t{0});
    std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return meta[a].position < meta[b].position; });
    const std::int64_t prefix = std::max<std::int64_t>(0, N - observation_window);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> best(static_cast<std::size_t>(N), -std::numeric_limits<double>::infinity());
    std::vector<double> sum(static_cast<std::size_t>(N)), logit(static_cast<std::size_t>(N));
    for (std::int64_t g = 0; g < q.group; ++g) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for (std::int64_t w = 0; w < q.window; ++w) {
        const float* qv = q.query(g, w);
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < N; ++j) {
          double s = -std::numeric_limits<double>::infinity();
          if (meta[j].position <= q.position[w]) {
            s = 0.0;
            for (std::int64_t c = 0; c < d; ++c) s += static_cast<double>(qv[c]) * keys(j, c);
            s *= scale;
          }
          logit[static_cast<std::size_t>(j)] = s;
          mx = std::max(mx, s);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // a query that sees nothing
        double total = 0.0;
        for (double& s : logit) total += s = std::exp(s - mx);
        for (std::int64_t j = 0; j < N; ++j) sum[static_cast<std::size_t>(j)] += logit[static_cast<std::size_t>(j)] / total;
      }
      const std::int64_t r = pool_kernel / 2;
      for (std::int64_t i = 0; i < N; ++i) {
        double v = sum[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
        if (i < prefix)  // max-pool along positions, over the prefix only
          for (std::int64_t k = std::max<std::int64_t>(0, i - r); k <= std::min(prefix - 1, i + r); ++k)
            v = std::max(v, sum[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])]);
        auto& b = best[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
        b = std::max(b, v);  // GQA: the max over the group
      }
    }
    for (std::int64_t j = 0; j < N; ++j)
      out[static_cast<std::size_t>(j)] = q.group > 0 ? static_cast<float>(best[static_cast<std::size_t>(j)]) : 0.0f;
  }
};

static_assert(Scorer<ObservedAttention>, "ObservedAttention must model kvpolicy::Scorer");

}  // namespace kvpolicy::score
