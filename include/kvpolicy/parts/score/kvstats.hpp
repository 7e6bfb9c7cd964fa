/// \file
/// kvpolicy/parts/score/kvstats.hpp — EpiKV's KV-statistics family (SPEC §4), scored from the keys
/// and values the engine appends, per (layer, kv head), with no attention and no hidden states:
///   kv-key  score(t) = mean over the causal window of W = 64 tokens of var_d(k(t))
///   kv-val  the same on values
///   lag-kv  kv-key + kv-val of keys and values first normalised per channel by the min–max range
///           of the previous chunk of W tokens (chunk c = position / W; chunk 0, which has no
///           previous chunk, uses the range of its own tokens so far: causal)
/// var_d is the population variance of the vector's d components. Scores are computed once, when
/// the token is appended, then frozen: they go to the cache as its static score (score::Frozen),
/// with evict::Generated's budget and protection.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/math.hpp"
#include "kvpolicy/core/shape.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/parts/score/epiphany.hpp"

namespace kvpolicy::kvstats {

enum class Statistic {
  key,    ///< kv-key
  value,  ///< kv-val
  lag     ///< lag-kv
};

/// The KV statistics' settings (SPEC §4): which statistic and its rolling window.
struct Config {
  Statistic statistic = Statistic::key;
  int window = 64;  ///< W: the rolling mean, and lag-kv's chunk
  /// lag-kv divides by (max - min) + range_epsilon, so a constant channel normalises to 0 instead
  /// of dividing by zero (SPEC §4 does not say; the value matters only for such channels).
  static constexpr double range_epsilon = 1e-6;
};

/// Population variance of x[0..d) in double (two passes).
inline double component_variance(const float* x, int d) {
  double mean = 0.0;
  for (int i = 0; i < d; ++i) mean += x[i];
  mean /= d;
  double m2 = 0.0;
  for (int i = 0; i < d; ++i) m2 += (x[i] - mean) * (x[i] - mean);
  return m2 / d;
}

/// Per-channel min and max of a set of vectors.
struct ChannelRange {
  std::vector<double> lo, hi;
  void reset(int d) {
    lo.assign(static_cast<std::size_t>(d), std::numeric_limits<double>::infinity());
    hi.assign(static_cast<std::size_t>(d), -std::numeric_limits<double>::infinity());
  }
  void add(const float* x) {
    for (std::size_t i = 0; i < lo.size(); ++i) {
      lo[i] = std::min(lo[i], static_cast<double>(x[i]));
      hi[i] = std::max(hi[i], static_cast<double>(x[i]));
    }
  }
  /// Population variance over the channels of (x - lo) / (hi - lo + eps).
  double normalised_variance(const float* x) const {
    const auto d = lo.size();
    std::vector<double> y(d);
    double mean = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      y[i] = (x[i] - lo[i]) / (hi[i] - lo[i] + Config::range_epsilon);
      mean += y[i];
    }
    mean /= static_cast<double>(d);
    double m2 = 0.0;
    for (const double v : y) m2 += (v - mean) * (v - mean);
    return m2 / static_cast<double>(d);
  }
};

/// One sequence's KV-statistics scores. Call push() once per layer per step, with the keys and
/// values the step appends to that layer (the same T for every layer of a step). Used from one
/// thread at a time, like its sequence. The constructor throws for an invalid shape or W < 1.
class Tracker {
 public:
  Tracker(CacheShape shape, Config config = {}) : shape_(shape), config_(config) {
    shape_.validate();
    require(config.window >= 1, "kvstats::Tracker: window W = ", config.window, " must be >= 1");
    heads_.reserve(static_cast<std::size_t>(shape_.heads_total()));
    for (std::int64_t i = 0; i < shape_.heads_total(); ++i) heads_.emplace_back(config_.window, shape_.head_dim);
  }

  const Config& config() const { return config_; }
  /// Tokens scored so far at `layer`.
  std::int64_t tokens(int layer) const {
    require(layer >= 0 && layer < shape_.layers, "kvstats::Tracker: layer ", layer, " out of range [0, ",
            shape_.layers, ")");
    return heads_[static_cast<std::size_t>(head_index(shape_, layer, 0))].tokens;
  }

  /// keys, values [Hkv, T, d] for the next T positions of `layer` -> out [Hkv, T] (the log_beta
  /// layout of Cache::append), all fp32. Validated before anything changes: throws for a layer out of
  /// range, T < 1, a shape mismatch, or keys or values that are not finite.
  void push(int layer, View<const float, 3> keys, View<const float, 3> values, View<float, 2> out) {
    require(layer >= 0 && layer < shape_.layers, "kvstats::Tracker: layer ", layer, " out of range [0, ",
            shape_.layers, ")");
    const std::int64_t T = keys.dim(1);
    require(T >= 1, "kvstats::Tracker: a step has T = ", T, " tokens; T must be >= 1");
    require_shape(keys, {shape_.kv_heads, T, shape_.head_dim}, "kvstats::Tracker: keys");
    require_shape(values, {shape_.kv_heads, T, shape_.head_dim}, "kvstats::Tracker: values");
    require_shape(View<const float, 2>(out), {shape_.kv_heads, T}, "kvstats::Tracker: out");
    require_finite(keys, "kvstats::Tracker: keys");
    require_finite(values, "kvstats::Tracker: values");
    const int d = shape_.head_dim;
    for (int h = 0; h < shape_.kv_heads; ++h) {
      Head& head = heads_[static_cast<std::size_t>(head_index(shape_, layer, h))];
      for (std::int64_t t = 0; t < T; ++t) out(h, t) = math::saturate_to_float(head.push(config_, &keys(h, t, 0), &values(h, t, 0), d));
    }
  }

 private:
  struct Head {
    Head(int window, int d) : key_var(window), value_var(window) {
      for (ChannelRange* r : {&key_prev, &value_prev, &key_chunk, &value_chunk}) r->reset(d);
    }
    epiphany::RollingWindow key_var, value_var;
    ChannelRange key_prev, value_prev, key_chunk, value_chunk;  // lag-kv: previous and current chunk
    std::int64_t tokens = 0;

    double push(const Config& c, const float* k, const float* v, int d) {
      double score = 0.0;
      if (c.statistic == Statistic::lag) {
        if (tokens % c.window == 0 && tokens > 0) {  // a chunk is complete: it is the new reference
          key_prev = key_chunk;
          value_prev = value_chunk;
          key_chunk.reset(d);
          value_chunk.reset(d);
        }
        key_chunk.add(k);
        value_chunk.add(v);
        const bool first_chunk = tokens < c.window;
        key_var.push((first_chunk ? key_chunk : key_prev).normalised_variance(k));
        value_var.push((first_chunk ? value_chunk : value_prev).normalised_variance(v));
        score = key_var.mean() + value_var.mean();
      } else if (c.statistic == Statistic::key) {
        key_var.push(component_variance(k, d));
        score = key_var.mean();
      } else {
        value_var.push(component_variance(v, d));
        score = value_var.mean();
      }
      ++tokens;
      return score;
    }
  };

  CacheShape shape_;
  Config config_;
  std::vector<Head> heads_;
};

}  // namespace kvpolicy::kvstats
