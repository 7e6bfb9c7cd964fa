/// \file
/// kvpolicy/memory/query_statistics.hpp — the running first and second moments of the queries a
/// sequence attended with at one layer, rotated back to before RoPE, for scorers that rank by the
/// attention future queries are expected to pay (Expected Attention, docs/policies.md). Queries at positions
/// below `from` are left out (kvpress drops the sink tokens' hidden states, which hold outliers).
/// The open step's queries are pending: the commit adds them, an aborted step discards them, so the
/// moments are exactly as they were when a step is taken back. moments() hands out one kv head's
/// group, the pending queries included. In double.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/rope.hpp"
#include "kvpolicy/core/view.hpp"

namespace kvpolicy::memory {

/// One layer's running query moments for a sequence (this file's comment), as score::ExpectedAttention reads
/// them.
class QueryStatistics {
 public:
  QueryStatistics() = default;
  QueryStatistics(int q_heads, int head_dim, Rope rope, std::int64_t from, std::int64_t until)
      : q_heads_(q_heads), d_(head_dim), rope_(rope), from_(from), until_(until) {
    rope_.validate(head_dim);
  }

  /// queries [Hq, T, d] of the open step's tokens at positions first .. first + T - 1, after RoPE.
  void push(View<const float, 3> queries, std::int64_t first) {
    const std::int64_t T = std::min(queries.dim(1), until_ - first);  // until_ < 0 (no prompt): none
    std::vector<double> x(static_cast<std::size_t>(d_));
    for (std::int64_t t = std::max<std::int64_t>(0, from_ - first); t < T; ++t) {
      pending_.allocate(q_heads_, d_);
      for (int h = 0; h < q_heads_; ++h) {
        for (std::int64_t c = 0; c < d_; ++c) x[static_cast<std::size_t>(c)] = queries(h, t, c);
        rope_.unrotate(x, first + t);
        pending_.add(h, x);
      }
      ++pending_.count;
      pending_.next_position = std::max(pending_.next_position, first + t + 1);
    }
  }

  /// The open step closes: its queries join the moments. Once the prompt's last query has joined
  /// (the step whose plan scored with them is closing), nothing reads them again: they are freed.
  void commit() {
    committed_.merge(pending_, q_heads_, d_);
    discard();
    if (until_ >= 0 && committed_.next_position >= until_) committed_ = Sums{};
  }
  /// The open step is taken back.
  void discard() {
    if (pending_.count > 0) pending_.clear();
  }

  /// The moments of query heads kv_head*G .. kv_head*G + G-1, the pending queries included, into `buffer`.
  QueryMoments moments(int kv_head, int group, std::vector<double>& buffer) const {
    const std::size_t dd = static_cast<std::size_t>(d_ * d_), d = static_cast<std::size_t>(d_);
    buffer.assign(static_cast<std::size_t>(group) * (d + dd), 0.0);
    double* sum = buffer.data();
    double* outer = sum + static_cast<std::size_t>(group) * d;
    for (const Sums* part : {&committed_, &pending_}) {
      if (part->sum.empty()) continue;
      for (int g = 0; g < group; ++g) {
        const auto h = static_cast<std::size_t>(kv_head * group + g);
        for (std::size_t c = 0; c < d; ++c) sum[g * d + c] += part->sum[h * d + c];
        for (std::size_t c = 0; c < dd; ++c) outer[g * dd + c] += part->outer[h * dd + c];
      }
    }
    return QueryMoments{sum, outer, group, d_, committed_.count + pending_.count,
                        std::max(committed_.next_position, pending_.next_position)};
  }

 private:
  /// Sums over some queries: allocated by the first query summed ([Hq, d] and [Hq, d, d]).
  struct Sums {
    std::vector<double> sum, outer;
    std::int64_t count = 0, next_position = 0;
    void allocate(int heads, std::int64_t d) {
      if (!sum.empty()) return;
      sum.assign(static_cast<std::size_t>(heads * d), 0.0);
      outer.assign(static_cast<std::size_t>(heads * d * d), 0.0);
    }
    void add(int h, std::span<const double> x) {
      const auto d = static_cast<std::int64_t>(x.size());
      double* s = &sum[static_cast<std::size_t>(h * d)];
      double* o = &outer[static_cast<std::size_t>(h * d * d)];
      for (std::int64_t a = 0; a < d; ++a) {
        const double xa = x[static_cast<std::size_t>(a)];
        s[a] += xa;
        for (std::int64_t b = 0; b < d; ++b) o[a * d + b] += xa * x[static_cast<std::size_t>(b)];
      }
    }
    void merge(const Sums& o, int heads, std::int64_t d) {
      if (!o.sum.empty()) {
        allocate(heads, d);
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += o.sum[i];
        for (std::size_t i = 0; i < outer.size(); ++i) outer[i] += o.outer[i];
      }
      count += o.count;
      next_position = std::max(next_position, o.next_position);
    }
    void clear() {
      std::fill(sum.begin(), sum.end(), 0.0);
      std::fill(outer.begin(), outer.end(), 0.0);
      count = next_position = 0;
    }
  };

  int q_heads_ = 0;
  std::int64_t d_ = 0;
  Rope rope_{};
  std::int64_t from_ = 0, until_ = -1;
  Sums committed_, pending_;
};

}  // namespace kvpolicy::memory
