/// \file
/// kvpolicy/memory/query_window.hpp — the last W queries a sequence attended with at one layer, for
/// scorers that rank by observed attention (SnapKV, SPEC §5; WG-KV's budget, SPEC §3). A ring over
/// tokens, plus the open step's tokens: attend() pushes its T tokens' queries [Hq, T, d] as
/// pending, the commit folds them into the ring, an aborted step discards them — so the window is
/// exactly as it was when a step is taken back. ordered() hands out one kv head's group, oldest
/// first, the pending tokens included.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"

namespace kvpolicy::memory {

/// One layer's last W queries of a sequence (this file's comment), as the observed-attention scorers read
/// them.
class QueryWindow {
 public:
  QueryWindow() = default;
  QueryWindow(std::int64_t window, int q_heads, int head_dim)
      : window_(window), q_heads_(q_heads), d_(head_dim),
        data_(static_cast<std::size_t>(window * q_heads * head_dim)), position_(static_cast<std::size_t>(window)) {}

  /// Tokens in the window, the pending ones included (at most W).
  std::int64_t size() const { return std::min(window_, count_ + pending_count()); }

  /// queries [Hq, T, d] of the open step's tokens at positions first .. first + T - 1.
  void push(View<const float, 3> queries, std::int64_t first) {
    const std::int64_t T = queries.dim(1);
    for (std::int64_t t = std::max<std::int64_t>(0, T - window_); t < T; ++t) {
      for (int h = 0; h < q_heads_; ++h) pending_.insert(pending_.end(), &queries(h, t, 0), &queries(h, t, 0) + d_);
      pending_position_.push_back(static_cast<std::int32_t>(first + t));
    }
  }

  /// The open step closes: its tokens join the ring.
  void commit() {
    for (std::int64_t p = 0; p < pending_count(); ++p) {
      for (int h = 0; h < q_heads_; ++h)
        std::copy_n(pending_row(p, h), d_, &data_[static_cast<std::size_t>((h * window_ + next_) * d_)]);
      position_[static_cast<std::size_t>(next_)] = pending_position_[static_cast<std::size_t>(p)];
      next_ = (next_ + 1) % window_;
      count_ = std::min(count_ + 1, window_);
    }
    discard();
  }
  /// The open step is taken back.
  void discard() {
    pending_.clear();
    pending_position_.clear();
  }

  /// The query heads kv_head*G .. kv_head*G + G-1, oldest token first, into `buffer` and `positions`.
  ObservedQueries ordered(int kv_head, int group, std::vector<float>& buffer, std::vector<std::int32_t>& positions) const {
    const std::int64_t n = size(), from_pending = std::min(n, pending_count()), from_ring = n - from_pending;
    buffer.resize(static_cast<std::size_t>(group * n * d_));
    positions.resize(static_cast<std::size_t>(n));
    const std::int64_t oldest = count_ < window_ ? 0 : next_;  // the ring's oldest slot
    for (std::int64_t w = 0; w < n; ++w) {
      const bool ring = w < from_ring;
      const std::int64_t slot = (oldest + (count_ - from_ring) + w) % window_;       // the newest from_ring of the ring
      const std::int64_t p = pending_count() - from_pending + (w - from_ring);        // then the last from_pending pending
      positions[static_cast<std::size_t>(w)] = ring ? position_[static_cast<std::size_t>(slot)] : pending_position_[static_cast<std::size_t>(p)];
      for (int g = 0; g < group; ++g) {
        const int h = kv_head * group + g;
        const float* src = ring ? &data_[static_cast<std::size_t>((h * window_ + slot) * d_)] : pending_row(p, h);
        std::copy_n(src, d_, &buffer[static_cast<std::size_t>((g * n + w) * d_)]);
      }
    }
    return ObservedQueries{buffer.data(), group, n, d_, positions};
  }

 private:
  std::int64_t pending_count() const { return static_cast<std::int64_t>(pending_position_.size()); }
  const float* pending_row(std::int64_t p, int h) const {
    return &pending_[static_cast<std::size_t>((p * q_heads_ + h) * d_)];
  }

  std::int64_t window_ = 0;
  int q_heads_ = 0, d_ = 0;
  std::vector<float> data_;  // [Hq, W, d]
  std::vector<std::int32_t> position_;
  std::int64_t next_ = 0, count_ = 0;
  std::vector<float> pending_;  // [pending tokens, Hq, d]
  std::vector<std::int32_t> pending_position_;
};

/// A sequence's QueryWindow at every layer: the record of a Scorer that ranks by the last W queries
/// (score::ObservedAttention, score::GatedObservedAttention; core/concepts.hpp, RecordingScorer).
class LayerQueryWindows {
 public:
  LayerQueryWindows() = default;
  LayerQueryWindows(const CacheShape& shape, std::int64_t window)
      : layers_(static_cast<std::size_t>(shape.layers), QueryWindow(window, shape.q_heads, shape.head_dim)) {}

  void push(int layer, View<const float, 3> queries, std::int64_t first) {
    layers_[static_cast<std::size_t>(layer)].push(queries, first);
  }
  void commit() {
    for (auto& w : layers_) w.commit();
  }
  void discard() {
    for (auto& w : layers_) w.discard();
  }
  /// One layer's window of a kv head's query group (QueryWindow::ordered).
  ObservedQueries ordered(int layer, int kv_head, int group, std::vector<float>& buffer,
                          std::vector<std::int32_t>& positions) const {
    return layers_[static_cast<std::size_t>(layer)].ordered(kv_head, group, buffer, positions);
  }

 private:
  std::vector<QueryWindow> layers_;
};

}  // namespace kvpolicy::memory
