/// \file
/// kvpolicy/parts/score/observed_attention.hpp — SnapKV's score (SPEC §5): the attention the last W_obs
/// queries give each key, from the window of queries its record keeps per layer. Per query head g of
/// the kv head's group: softmax(q k^T / sqrt(d)) of each observed query over the keys it may see
/// (causal), summed over the queries; then pooled along positions (stride 1, same length) over the
/// keys outside the observation window (the SnapKV reference pools the prefix only): avg-pool with
/// zero padding counted (PyTorch's avg_pool1d, as SnapKV calls it) or max-pool; then reduced over
/// the group (GQA): the mean (kvpress) or the max. Defaults as the original SnapKV code: W_obs = 32,
/// avg-pool, kernel 5, GQA mean. Keys inside the window keep their unpooled score: the evictor
/// protects them. In double, then fp32.
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
#include "kvpolicy/memory/query_window.hpp"

namespace kvpolicy::score {

namespace detail {

/// Indices of a head's entries in position order.
inline std::vector<std::int64_t> by_position(std::span<const EntryMeta> meta) {
  std::vector<std::int64_t> order(meta.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return meta[a].position < meta[b].position; });
  return order;
}

/// The window's attention over the listed keys, as matrix products on tiles: for each window slot w,
/// f(w, p) with p [G, N] (row g = query head g of the group) = softmax over the keys row g's query
/// may see (causal) of q k^T / sqrt(d), 0 for the others and for a query that sees none. In double:
/// the keys are widened once into a dense [d, N] block (N contiguous), then each slot's G rows take
/// S = Q K^T as rank-1 updates along d, so every logit sums its d products in the same order (the
/// bits do not depend on where a key lies: equal keys give equal logits), and the key block is read
/// from cache by every slot instead of gathered per query.
template <class F>
void observed_attention_tiles(View<const float, 2> keys, std::span<const EntryMeta> meta, std::span<const std::int64_t> rows,
                              ObservedQueries q, F&& f) {
  const auto N = static_cast<std::int64_t>(rows.size());
  const std::int64_t d = keys.dim(1), G = q.group;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> kt(static_cast<std::size_t>(d * N)), s(static_cast<std::size_t>(G * N));
  std::vector<std::int32_t> pos(static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) {
    const std::int64_t j = rows[static_cast<std::size_t>(i)];
    pos[static_cast<std::size_t>(i)] = meta[static_cast<std::size_t>(j)].position;
    for (std::int64_t c = 0; c < d; ++c) kt[static_cast<std::size_t>(c * N + i)] = keys(j, c);
  }
  for (std::int64_t w = 0; w < q.window; ++w) {
    const std::int32_t q_pos = q.position[static_cast<std::size_t>(w)];
    std::fill(s.begin(), s.end(), 0.0);
    for (std::int64_t c = 0; c < d; ++c) {  // S[g, :] += q_g[c] K^T[c, :]
      const double* k = kt.data() + c * N;
      for (std::int64_t g = 0; g < G; ++g) {
        const double qc = q.query(g, w)[c];
        double* sg = s.data() + g * N;
        for (std::int64_t i = 0; i < N; ++i) sg[i] += qc * k[i];
      }
    }
    for (std::int64_t g = 0; g < G; ++g) {
      double* sg = s.data() + g * N;
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t i = 0; i < N; ++i)
        if (pos[static_cast<std::size_t>(i)] <= q_pos) mx = std::max(mx, sg[i] * scale);
      if (mx == -std::numeric_limits<double>::infinity()) {  // sees none of them
        std::fill(sg, sg + N, 0.0);
        continue;
      }
      double total = 0.0;
      for (std::int64_t i = 0; i < N; ++i)
        total += sg[i] = pos[static_cast<std::size_t>(i)] <= q_pos ? std::exp(sg[i] * scale - mx) : 0.0;
      for (std::int64_t i = 0; i < N; ++i) sg[i] /= total;
    }
    f(w, std::span<const double>(s));
  }
}

/// Avg-pool with stride 1 and zero padding counted (the length is kept): out[i] = sum v[i - k/2 ..
/// i + k/2] / k — torch.nn.functional.avg_pool1d(padding = k/2, count_include_pad = True).
inline std::vector<double> avg_pool(std::span<const double> v, int kernel) {
  const auto n = static_cast<std::int64_t>(v.size()), r = std::int64_t{kernel / 2};
  std::vector<double> out(v.size());
  for (std::int64_t i = 0; i < n; ++i) {
    double sum = 0.0;
    for (std::int64_t k = std::max<std::int64_t>(0, i - r); k <= std::min(n - 1, i + r); ++k) sum += v[static_cast<std::size_t>(k)];
    out[static_cast<std::size_t>(i)] = sum / kernel;
  }
  return out;
}

/// Max-pool with stride 1 and -inf padding (the length is kept): out[i] = max v[i - k/2 .. i + k/2].
inline std::vector<double> max_pool(std::span<const double> v, int kernel) {
  const auto n = static_cast<std::int64_t>(v.size()), r = std::int64_t{kernel / 2};
  std::vector<double> out(v.size());
  for (std::int64_t i = 0; i < n; ++i) {
    double m = v[static_cast<std::size_t>(i)];
    for (std::int64_t k = std::max<std::int64_t>(0, i - r); k <= std::min(n - 1, i + r); ++k) m = std::max(m, v[static_cast<std::size_t>(k)]);
    out[static_cast<std::size_t>(i)] = m;
  }
  return out;
}

}  // namespace detail

/// SnapKV's pooling along positions and its reduction over a GQA group (SPEC §5).
enum class Pooling : std::uint8_t { avg, max };
enum class GroupReduce : std::uint8_t { mean, max };

/// The observed-attention Scorer (SPEC §5): SnapKV's score from the last W_obs queries, pooled along
/// positions and reduced over the GQA group; TOVA's with one query and no pooling. It records each
/// layer's last W_obs queries (its Record) and scores a head from them and its keys; the device
/// scores it in its observed-attention kernel (cuda/kernels/observed_attention.cuh).
struct ObservedAttention {
  using Record = memory::LayerQueryWindows;
  static constexpr EntryData head_data{.keys = true};
  static constexpr DeviceScoring device_scoring = DeviceScoring::observed_attention;

  std::int64_t observation_window = 32;  ///< W_obs
  int pool_kernel = 5;                   ///< odd; 1 = no pooling
  Pooling pooling = Pooling::avg;
  GroupReduce group_reduce = GroupReduce::mean;

  void validate() const {
    require(observation_window >= 1 && observation_window <= (1 << 20), "score::ObservedAttention: W_obs = ",
            observation_window, " must be in [1, 2^20]");
    require(pool_kernel >= 1 && pool_kernel % 2 == 1, "score::ObservedAttention: pool kernel = ", pool_kernel,
            " must be odd and >= 1");
    require(pooling == Pooling::avg || pooling == Pooling::max, "score::ObservedAttention: pooling = ",
            static_cast<int>(pooling), " is neither avg nor max");
    require(group_reduce == GroupReduce::mean || group_reduce == GroupReduce::max,
            "score::ObservedAttention: group_reduce = ", static_cast<int>(group_reduce), " is neither mean nor max");
  }

  // the record's hooks (core/concepts.hpp, RecordingScorer)
  Record open_record(const CacheShape& shape, std::int64_t) const { return Record(shape, observation_window); }
  void record_queries(Record& r, int layer, View<const float, 3> queries, std::int64_t first) const {
    r.push(layer, queries, first);
  }
  void commit_record(Record& r) const { r.commit(); }
  void discard_record(Record& r, EntryFields) const { r.discard(); }
  void score_recorded(const Record& r, HeadEntries e, StepContext c, std::span<float> out) const {
    std::vector<float> queries;
    std::vector<std::int32_t> positions;
    score_window(e.keys, e.meta, c, r.ordered(e.layer, e.kv_head, e.group, queries, positions), out);
  }

  /// The scores of a head's entries (keys [N, d], meta [N]) from the window q of its query group.
  void score_window(View<const float, 2> keys, std::span<const EntryMeta> meta, StepContext, ObservedQueries q,
                    std::span<float> out) const {
    const auto order = detail::by_position(meta);
    const auto N = static_cast<std::int64_t>(order.size());
    const std::int64_t prefix = std::max<std::int64_t>(0, N - observation_window);
    const bool mean = group_reduce == GroupReduce::mean;
    std::vector<double> reduced(order.size(), mean ? 0.0 : -std::numeric_limits<double>::infinity());
    std::vector<double> sums(static_cast<std::size_t>(q.group) * order.size(), 0.0);  // [G, N], in position order
    detail::observed_attention_tiles(keys, meta, order, q, [&](std::int64_t, std::span<const double> p) {
      for (std::size_t i = 0; i < sums.size(); ++i) sums[i] += p[i];  // summed over the window, oldest first
    });
    for (std::int64_t g = 0; g < q.group; ++g) {  // pool the prefix of each query head's sums
      const auto sum = std::span<const double>(sums).subspan(static_cast<std::size_t>(g) * order.size(), order.size());
      const auto head_prefix = sum.first(static_cast<std::size_t>(prefix));
      const auto pooled = pooling == Pooling::avg ? detail::avg_pool(head_prefix, pool_kernel)
                                                  : detail::max_pool(head_prefix, pool_kernel);
      for (std::int64_t i = 0; i < N; ++i) {
        const double v = i < prefix ? pooled[static_cast<std::size_t>(i)] : sum[static_cast<std::size_t>(i)];
        double& r = reduced[static_cast<std::size_t>(i)];
        r = mean ? r + v : std::max(r, v);  // GQA: the mean or the max over the group
      }
    }
    for (std::int64_t i = 0; i < N; ++i) {
      const double r = reduced[static_cast<std::size_t>(i)];
      out[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] =
          q.group > 0 ? static_cast<float>(mean ? r / static_cast<double>(q.group) : r) : 0.0f;
    }
  }
};

/// WG-KV's admission with a hard budget (SPEC §3, appendix K as the authors' code runs it): the
/// entry's write_score is its write-gate value g. The head holds its W_local newest entries (the
/// ring, scored 0: the evictor protects them) and, older, its global cache: the entries with
/// g >= tau and the S oldest (sinks, SPEC §5); an older entry with neither scores -inf (a ring would
/// have dropped it already). While the sequence holds at most budget_entries entries, every global
/// entry scores 0 (no attention is computed: the global cache, a part of them, is then within it
/// too). Above it, over the head's global entries only (no ring key in the softmax):
/// S_j = MaxPool_5(sum over the last W_obs = 256 queries of the max over the kv head's query group
/// of softmax(q k^T / sqrt(d))_j), softmax and pooling along the global positions. In double, then fp32.
struct GatedObservedAttention {
  using Record = memory::LayerQueryWindows;  // each layer's last W_obs queries
  static constexpr EntryData head_data{.keys = true};
  static constexpr bool static_score = true;  // write_score is g, in [0, 1]
  double tau = 0.1;
  std::int64_t local = 256;               ///< W_local
  std::int64_t budget_entries = 0;        ///< L * Hkv * M_avg; 0 = no budget
  std::int64_t observation_window = 256;  ///< W_obs
  int pool_kernel = 5;
  std::int64_t sinks = 0;                 ///< S oldest entries kept whatever their g (SPEC §5)

  void validate() const {
    require(std::isfinite(tau) && tau > 0.0 && tau <= 1.0, "score::GatedObservedAttention: tau = ", tau,
            " must be in (0, 1]");
    require(local >= 1, "score::GatedObservedAttention: W_local = ", local, " must be >= 1");
    require(budget_entries >= 0, "score::GatedObservedAttention: budget = ", budget_entries, " must be >= 0");
    require(sinks >= 0, "score::GatedObservedAttention: sinks S = ", sinks, " must be >= 0");
    ObservedAttention{observation_window, pool_kernel, Pooling::max}.validate();
  }

  /// Whether this step's scores read the keys and the window's queries: only where the budget may
  /// bind (below); otherwise the metadata alone decides them, and the caller need not gather the rest
  /// (score_window then takes empty keys and queries).
  bool reads_window(StepContext c) const { return budget_entries > 0 && c.entries > budget_entries && c.budget_binds; }

  // the record's hooks (core/concepts.hpp, RecordingScorer): as ObservedAttention's; the keys and the
  // window are read only where reads_window(ctx)
  Record open_record(const CacheShape& shape, std::int64_t) const { return Record(shape, observation_window); }
  void record_queries(Record& r, int layer, View<const float, 3> queries, std::int64_t first) const {
    r.push(layer, queries, first);
  }
  void commit_record(Record& r) const { r.commit(); }
  void discard_record(Record& r, EntryFields) const { r.discard(); }
  bool reads_kv(StepContext c) const { return reads_window(c); }
  void score_recorded(const Record& r, HeadEntries e, StepContext c, std::span<float> out) const {
    std::vector<float> queries;
    std::vector<std::int32_t> positions;
    const ObservedQueries q = reads_window(c) ? r.ordered(e.layer, e.kv_head, e.group, queries, positions) : ObservedQueries{};
    score_window(e.keys, e.meta, c, q, out);
  }

  void score_window(View<const float, 2> keys, std::span<const EntryMeta> meta, StepContext c, ObservedQueries q,
                    std::span<float> out) const {
    const auto order = detail::by_position(meta);
    const auto N = static_cast<std::int64_t>(order.size());
    std::vector<std::int64_t> global;  // in position order: the global cache, outside the ring
    for (std::int64_t i = 0; i < N; ++i) {
      const std::int64_t j = order[static_cast<std::size_t>(i)];
      if (N - i <= local)
        out[static_cast<std::size_t>(j)] = 0.0f;  // the ring
      else if (meta[j].write_score >= static_cast<float>(tau) || i < sinks)
        global.push_back(j);
      else
        out[static_cast<std::size_t>(j)] = -std::numeric_limits<float>::infinity();
    }
    std::vector<double> raw(global.size(), 0.0);
    // c.entries >= the global total the evictor compares; and where the evictor has told that its
    // budget does not bind (StepContext::budget_binds), no global entry is dropped: 0 decides the same
    if (reads_window(c)) {
      const std::size_t n = global.size();
      detail::observed_attention_tiles(keys, meta, global, q, [&](std::int64_t, std::span<const double> p) {
        for (std::size_t i = 0; i < n; ++i) {
          double best = 0.0;  // the max over the group (a query that sees nothing gives 0)
          for (std::int64_t g = 0; g < q.group; ++g) best = std::max(best, p[static_cast<std::size_t>(g) * n + i]);
          raw[i] += best;  // summed over the window, oldest first
        }
      });
    }
    const auto pooled = detail::max_pool(raw, pool_kernel);  // along the global positions
    for (std::size_t i = 0; i < global.size(); ++i) out[static_cast<std::size_t>(global[i])] = static_cast<float>(pooled[i]);
  }
};

static_assert(Scorer<ObservedAttention>, "ObservedAttention must model kvpolicy::Scorer");
static_assert(Scorer<GatedObservedAttention>, "GatedObservedAttention must model kvpolicy::Scorer");

}  // namespace kvpolicy::score
