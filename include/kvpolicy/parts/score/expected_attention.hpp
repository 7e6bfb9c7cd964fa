/// \file
/// kvpolicy/parts/score/expected_attention.hpp — Expected Attention's score (not in SPEC: NVIDIA
/// kvpress 0.5.5's ExpectedAttentionPress, whose code defines it; docs/policies.md): the attention
/// that future queries are expected to pay each key, from the statistics of the prompt's queries. Per query head g of the kv head's
/// group, with μ_g, Σ_g the mean and covariance (÷ N) of its N queries before RoPE past the first S
/// positions, and R̄ the RoPE rotation averaged over the F positions after the prompt (q_len ..
/// q_len + F - 1):
///   μ̃ = R̄ μ_g,  Σ̃ = R̄ Σ_g R̄ᵀ,  z_i = μ̃ · k_i / √d + ½ k_iᵀ Σ̃ k_i / d     (E exp(q·k/√d), q Gaussian)
///   p_g = softmax_i(z) over the head's keys past its S oldest;   score_i = (mean_g p_g,i + ε) · ‖v_i‖
/// The S oldest keys (the sinks) score above every other, as kvpress pads them with max + 1; the
/// evictor protects them as well. Without the covariance term z is μ̃ · k_i / √d; without the value
/// norm the score is mean_g p_g,i. In double, then fp32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvpolicy/core/concepts.hpp"
#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/rope.hpp"
#include "kvpolicy/memory/query_statistics.hpp"
#include "kvpolicy/parts/score/observed_attention.hpp"  // detail::by_position

namespace kvpolicy::score {

/// Expected Attention's Scorer (this file's comment), with kvpress's defaults. It records each
/// layer's query moments (its Record) and scores a head from them, its keys and its values.
struct ExpectedAttention {
  using Record = std::vector<memory::QueryStatistics>;  // per layer
  static constexpr EntryData head_data{.keys = true, .values = true};

  std::int64_t sinks = 4;               ///< S: the oldest keys not scored, the first queries not counted (kvpress's n_sink)
  std::int64_t future_positions = 512;  ///< F: the positions after the prompt R̄ averages over
  Rope rope{};                          ///< the model's RoPE, to undo on the queries and to average
  bool covariance = true;               ///< the ½ kᵀΣ̃k/d term (kvpress's use_covariance)
  bool value_norm = true;               ///< the ‖v‖ factor (kvpress's use_vnorm)
  double epsilon = 0.0;                 ///< ε, added before the value norm

  void validate() const {
    require(sinks >= 0 && sinks <= INT32_MAX, "score::ExpectedAttention: sinks S = ", sinks, " must be in [0, 2^31 - 1]");
    require(future_positions >= 1 && future_positions <= (1 << 24), "score::ExpectedAttention: future positions F = ",
            future_positions, " must be in [1, 2^24]");
    require(std::isfinite(epsilon) && epsilon >= 0.0, "score::ExpectedAttention: epsilon = ", epsilon,
            " must be finite and >= 0");
    rope.validate(2);
  }

  /// The RoPE it undoes on the queries pairs d's components.
  void validate_shape(const CacheShape& shape) const { rope.validate(shape.head_dim); }

  // the record's hooks (core/concepts.hpp, RecordingScorer): the moments of the queries before RoPE,
  // from position S on, up to the declared prompt's end (none kept where no prompt is declared)
  Record open_record(const CacheShape& shape, std::int64_t prompt_tokens) const {
    return Record(static_cast<std::size_t>(shape.layers),
                  memory::QueryStatistics(shape.q_heads, shape.head_dim, rope, sinks, prompt_tokens));
  }
  void record_queries(Record& r, int layer, View<const float, 3> queries, std::int64_t first) const {
    r[static_cast<std::size_t>(layer)].push(queries, first);
  }
  void commit_record(Record& r) const {
    for (auto& m : r) m.commit();
  }
  void discard_record(Record& r, EntryFields) const {
    for (auto& m : r) m.discard();
  }
  void score_recorded(const Record& r, HeadEntries e, StepContext c, std::span<float> out) const {
    std::vector<double> moments;
    score_moments(e.keys, e.values, e.meta, c, r[static_cast<std::size_t>(e.layer)].moments(e.kv_head, e.group, moments), out);
  }

  /// The scores of a head's entries (keys, values [N, d], meta [N]) from the moments m of its query group.
  void score_moments(View<const float, 2> keys, View<const float, 2> values, std::span<const EntryMeta> meta, StepContext,
                     QueryMoments m, std::span<float> out) const {
    const auto N = static_cast<std::int64_t>(meta.size());
    const std::int64_t d = keys.dim(1);
    const std::vector<std::int64_t> order = detail::by_position(meta);  // the first S are the sinks
    const std::int64_t S = std::min(sinks, N);
    std::vector<double> score(static_cast<std::size_t>(N), 0.0);
    // R̄ as d/2 pairs (c̄, s̄) over q_len .. q_len + F - 1
    std::vector<double> cs(static_cast<std::size_t>(d));
    rope.averaged(m.next_position, future_positions, cs);
    std::vector<double> mu(static_cast<std::size_t>(d)), sigma(static_cast<std::size_t>(d * d)), z(static_cast<std::size_t>(N)),
        sk(static_cast<std::size_t>(d));
    const double n = static_cast<double>(std::max<std::int64_t>(m.count, 1)), root_d = std::sqrt(static_cast<double>(d));
    for (std::int64_t g = 0; g < m.group; ++g) {
      for (std::int64_t a = 0; a < d; ++a) mu[static_cast<std::size_t>(a)] = m.sum_of(g)[a] / n;
      for (std::int64_t a = 0; a < d; ++a)
        for (std::int64_t b = 0; b < d; ++b)
          sigma[static_cast<std::size_t>(a * d + b)] =
              m.outer_of(g)[a * d + b] / n - mu[static_cast<std::size_t>(a)] * mu[static_cast<std::size_t>(b)];
      rotate_by_average(cs, mu.data(), 1);                                  // μ̃ = R̄ μ
      for (std::int64_t a = 0; a < d; ++a) rotate_by_average(cs, sigma.data() + a, d);      // R̄ Σ: each column
      for (std::int64_t a = 0; a < d; ++a) rotate_by_average(cs, sigma.data() + a * d, 1);  // (R̄ Σ) R̄ᵀ: each row
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t r = S; r < N; ++r) {
        const std::int64_t j = order[static_cast<std::size_t>(r)];
        double lin = 0.0, quad = 0.0;
        for (std::int64_t a = 0; a < d; ++a) lin += mu[static_cast<std::size_t>(a)] * keys(j, a);
        if (covariance) {
          for (std::int64_t a = 0; a < d; ++a) {
            double row = 0.0;
            for (std::int64_t b = 0; b < d; ++b) row += sigma[static_cast<std::size_t>(a * d + b)] * keys(j, b);
            quad += keys(j, a) * row;
          }
        }
        double& zj = z[static_cast<std::size_t>(j)];
        zj = lin / root_d + (covariance ? quad / static_cast<double>(d) / 2.0 : 0.0);
        mx = std::max(mx, zj);
      }
      double total = 0.0;
      for (std::int64_t r = S; r < N; ++r) total += std::exp(z[static_cast<std::size_t>(order[static_cast<std::size_t>(r)])] - mx);
      for (std::int64_t r = S; r < N; ++r) {
        const auto j = static_cast<std::size_t>(order[static_cast<std::size_t>(r)]);
        score[j] += std::exp(z[j] - mx) / total / static_cast<double>(m.group);
      }
    }
    double best = -std::numeric_limits<double>::infinity();
    for (std::int64_t r = S; r < N; ++r) {
      const std::int64_t j = order[static_cast<std::size_t>(r)];
      double& s = score[static_cast<std::size_t>(j)];
      if (value_norm) {
        double v2 = 0.0;
        for (std::int64_t a = 0; a < d; ++a) v2 += static_cast<double>(values(j, a)) * values(j, a);
        s = (s + epsilon) * std::sqrt(v2);
      }
      best = std::max(best, static_cast<double>(static_cast<float>(s)));
    }
    const float sink = N > S ? static_cast<float>(best + 1.0) : 1.0f;  // kvpress: the sinks score max + 1
    for (std::int64_t r = 0; r < N; ++r) {
      const auto j = static_cast<std::size_t>(order[static_cast<std::size_t>(r)]);
      out[j] = r < S ? sink : static_cast<float>(score[j]);
    }
  }

 private:
  /// x ← R̄ x for the d components x[0], x[stride], …, x[(d-1)·stride] (a vector, or a column of a
  /// row-major [d, d] matrix): per pair (a, b), (c̄ x_a - s̄ x_b, s̄ x_a + c̄ x_b).
  void rotate_by_average(std::span<const double> cs, double* x, std::int64_t stride) const {
    const auto d = static_cast<std::int64_t>(cs.size());
    for (std::int64_t i = 0; i < d / 2; ++i) {
      const auto [a, b] = rope.pair(i, d);
      double& xa = x[a * stride];
      double& xb = x[b * stride];
      const double c = cs[static_cast<std::size_t>(2 * i)], s = cs[static_cast<std::size_t>(2 * i + 1)], pa = xa, pb = xb;
      xa = c * pa - s * pb;
      xb = s * pa + c * pb;
    }
  }
};

static_assert(RecordScorer<ExpectedAttention> && Scorer<ExpectedAttention>, "score::ExpectedAttention must model Scorer");

}  // namespace kvpolicy::score
