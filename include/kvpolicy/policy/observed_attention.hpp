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

/// WG-KV's admission with a hard budget (SPEC §3, paper appendix K): the entry's metadata float is
/// its write-gate value g. The head holds its W_local newest entries (the ring) and the older ones
/// with g >= tau; an older entry with g < tau scores -inf (a ring would have dropped it already, so
/// it takes no part in what follows). While the sequence holds at most budget_entries, every held
/// entry scores 0 (no attention is computed). Above it, S_j = MaxPool_5(sum over the last W_obs =
/// 256 queries of the max over the kv head's query group of softmax(q k^T / sqrt(d))_j), softmax
/// and pooling along positions over the held entries. In double, then fp32.
struct GatedObservedAttention {
  static constexpr bool needs_key_norm = false;
  static constexpr bool static_score = true;  // the metadata float is g, in [0, 1]
  double tau = 0.1;
  std::int64_t local = 256;               ///< W_local
  std::int64_t budget_entries = 0;        ///< L * Hkv * M_avg; 0 = no budget
  std::int64_t observation_window = 256;  ///< W_obs
  int pool_kernel = 5;

  void validate() const {
    require(std::isfinite(tau) && tau > 0.0 && tau <= 1.0, "score::GatedObservedAttention: tau = ", tau,
            " must be in (0, 1]");
    require(local >= 1, "score::GatedObservedAttention: W_local = ", local, " must be >= 1");
    require(budget_entries >= 0, "score::GatedObservedAttention: budget = ", budget_entries, " must be >= 0");
    ObservedAttention{observation_window, pool_kernel}.validate();
  }

  void score_window(View<const float, 2> keys, std::span<const EntryMeta> meta, StepContext c, ObservedQueries q,
                    std::span<float> out) const {
    const std::int64_t N = keys.dim(0), d = keys.dim(1);
    std::vector<std::int64_t> held;  // by position: the ring (the W_local newest) and the admitted older ones
    {
      std::vector<std::int64_t> order(static_cast<std::size_t>(N));
      std::iota(order.begin(), order.end(), std::int64_t{0});
      std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return meta[a].position < meta[b].position; });
      for (std::int64_t i = 0; i < N; ++i) {
        const std::int64_t j = order[static_cast<std::size_t>(i)];
        if (N - i <= local || meta[j].log_beta >= static_cast<float>(tau))
          held.push_back(j);
        else
          out[static_cast<std::size_t>(j)] = -std::numeric_limits<float>::infinity();
      }
    }
    const auto M = static_cast<std::int64_t>(held.size());
    std::vector<double> raw(static_cast<std::size_t>(M), 0.0);
    if (budget_entries > 0 && c.entries > budget_entries) {
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      std::vector<double> best(static_cast<std::size_t>(M)), logit(static_cast<std::size_t>(M));
      for (std::int64_t w = 0; w < q.window; ++w) {
        std::fill(best.begin(), best.end(), 0.0);
        for (std::int64_t g = 0; g < q.group; ++g) {
          const float* qv = q.query(g, w);
          double mx = -std::numeric_limits<double>::infinity();
          for (std::int64_t i = 0; i < M; ++i) {
            const std::int64_t j = held[static_cast<std::size_t>(i)];
            double s = -std::numeric_limits<double>::infinity();
            if (meta[j].position <= q.position[w]) {
              s = 0.0;
              for (std::int64_t x = 0; x < d; ++x) s += static_cast<double>(qv[x]) * keys(j, x);
              s *= scale;
            }
            logit[static_cast<std::size_t>(i)] = s;
            mx = std::max(mx, s);
          }
          if (mx == -std::numeric_limits<double>::infinity()) continue;
          double total = 0.0;
          for (double& s : logit) total += s = std::exp(s - mx);
          for (std::size_t i = 0; i < best.size(); ++i) best[i] = std::max(best[i], logit[i] / total);  // max over the group
        }
        for (std::size_t i = 0; i < raw.size(); ++i) raw[i] += best[i];  // summed over the window
      }
    }
    const std::int64_t r = pool_kernel / 2;
    for (std::int64_t i = 0; i < M; ++i) {  // max-pool along positions
      double v = raw[static_cast<std::size_t>(i)];
      for (std::int64_t k = std::max<std::int64_t>(0, i - r); k <= std::min(M - 1, i + r); ++k) v = std::max(v, raw[static_cast<std::size_t>(k)]);
      out[static_cast<std::size_t>(held[static_cast<std::size_t>(i)])] = static_cast<float>(v);
    }
  }
};

static_assert(Scorer<ObservedAttention>, "ObservedAttention must model kvpolicy::Scorer");
static_assert(Scorer<GatedObservedAttention>, "GatedObservedAttention must model kvpolicy::Scorer");

}  // namespace kvpolicy::score
