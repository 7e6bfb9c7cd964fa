/// \file
/// kvpolicy/memory/query_window.hpp — the last W queries a sequence attended with at one layer, for
/// scorers that rank by observed attention (SnapKV, SPEC §5). A ring over tokens: each attend()
/// pushes its T tokens' queries [Hq, T, d]; ordered() hands out one kv head's group, oldest first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvpolicy/core/entry.hpp"
#include "kvpolicy/core/view.hpp"

namespace kvpolicy::memory {

class QueryWindow {
 public:
  QueryWindow() = default;
  QueryWindow(std::int64_t window, int q_heads, int head_dim)
      : window_(window), q_heads_(q_heads), d_(head_dim),
        data_(static_cast<std::size_t>(window * q_heads * head_dim)), position_(static_cast<std::size_t>(window)) {}

  std::int64_t size() const { return count_; }

  /// queries [Hq, T, d] of tokens at positions first .. first + T - 1.
  void push(View<const float, 3> queries, std::int64_t first) {
    const std::int64_t T = queries.dim(1);
    for (std::int64_t t = std::max<std::int64_t>(0, T - window_); t < T; ++t) {
      const std::int64_t slot = next_;
      for (int h = 0; h < q_heads_; ++h)
        std::copy_n(&queries(h, t, 0), d_, &data_[static_cast<std::size_t>((h * window_ + slot) * d_)]);
      position_[static_cast<std::size_t>(slot)] = static_cast<std::int32_t>(first + t);
      next_ = (next_ + 1) % window_;
      count_ = std::min(count_ + 1, window_);
    }
  }

  /// The query heads kv_head*G .. kv_head*G + G-1, oldest token first, into `buffer` and `positions`.
  ObservedQueries ordered(int kv_head, int group, std::vector<float>& buffer, std::vector<std::int32_t>& positions) const {
    buffer.resize(static_cast<std::size_t>(group * count_ * d_));
    positions.resize(static_cast<std::size_t>(count_));
    const std::int64_t oldest = count_ < window_ ? 0 : next_;
    for (std::int64_t w = 0; w < count_; ++w) {
      const std::int64_t slot = (oldest + w) % window_;
      positions[static_cast<std::size_t>(w)] = position_[static_cast<std::size_t>(slot)];
      for (int g = 0; g < group; ++g) {
        const std::int64_t h = std::int64_t{kv_head} * group + g;
        std::copy_n(&data_[static_cast<std::size_t>((h * window_ + slot) * d_)], d_,
                    &buffer[static_cast<std::size_t>((g * count_ + w) * d_)]);
      }
    }
    return ObservedQueries{buffer.data(), group, count_, d_, positions};
  }

 private:
  std::int64_t window_ = 0;
  int q_heads_ = 0, d_ = 0;
  std::vector<float> data_;  // [Hq, W, d]
  std::vector<std::int32_t> position_;
  std::int64_t next_ = 0, count_ = 0;
};

}  // namespace kvpolicy::memory
