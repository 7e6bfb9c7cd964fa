/// \file
/// kvpolicy/parts/score/epiphany.hpp — EpiKV's importance signal from hidden states (SPEC §4), with no
/// attention matrix: per band layer l, g_l(t) = ||h_l(t) - h_l(t-1)||_2 (g_l(0) = 0), then over the
/// causal window of the last W = 64 tokens (t-W+1 .. t, t included)
///   EpiKV   score(t) = z_A(t) - z_B(t),  z_l(t) = (g_l(t) - mean_W(g_l)) / (std_W(g_l) + 1e-6)
///   HS-var  score(t) = mean_W(g_A)(t) - mean_W(g_B)(t)
/// with bands A = 10 and B = 21 by default. O(1) per token (O(D) for the difference itself). The
/// score is computed once, when the token is produced, and then frozen.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/math.hpp"
#include "kvpolicy/core/view.hpp"

namespace kvpolicy::epiphany {

/// Mean and standard deviation of the last `window` values pushed (fewer at the start: the window
/// is causal and holds min(t + 1, W) values). The standard deviation is the population one (divide
/// by the count; SPEC §4 does not say which, and this one is defined for a single value: 0).
/// Updated in Welford form (adding a value, or replacing the oldest one) on values shifted by the
/// window's mean at the last exact recomputation, which happens (two-pass) every `window` pushes:
/// no catastrophic cancellation when the values are large and nearly equal, and no rounding that
/// accumulates over a long sequence. O(1) amortized per value.
class RollingWindow {
 public:
  explicit RollingWindow(int window = 64) : window_(window) {
    require(window >= 1, "epiphany::RollingWindow: window W = ", window, " must be >= 1");
    values_.assign(static_cast<std::size_t>(window), 0.0);
  }

  void push(double x) {
    require(std::isfinite(x), "epiphany::RollingWindow: value ", x, " is not finite");
    const auto slot = static_cast<std::size_t>(next_);
    const double xs = x - shift_;  // statistics of values shifted by a recent mean: no large offsets
    if (count_ < window_) {
      ++count_;
      const double delta = xs - mean_;
      mean_ += delta / count_;
      m2_ += delta * (xs - mean_);
    } else {  // x replaces the oldest value y
      const double ys = values_[slot] - shift_;
      const double old_mean = mean_;
      mean_ += (xs - ys) / count_;
      m2_ += (xs - ys) * (xs - mean_ + ys - old_mean);
    }
    values_[slot] = x;
    next_ = (next_ + 1) % window_;
    if (++since_exact_ == window_) recompute();
  }

  int count() const { return count_; }
  int window() const { return window_; }
  double mean() const { return count_ == 0 ? 0.0 : shift_ + mean_; }
  double stddev() const { return count_ == 0 || m2_ <= 0.0 ? 0.0 : std::sqrt(m2_ / count_); }

 private:
  // Two passes over the window; the exact mean becomes the new shift.
  void recompute() {
    double sum = 0.0;
    for (int i = 0; i < count_; ++i) sum += values_[static_cast<std::size_t>(i)];
    shift_ = sum / count_;
    mean_ = 0.0;
    m2_ = 0.0;
    for (int i = 0; i < count_; ++i) {
      const double d = values_[static_cast<std::size_t>(i)] - shift_;
      mean_ += d;
      m2_ += d * d;
    }
    mean_ /= count_;
    m2_ -= count_ * mean_ * mean_;  // mean_ is the tiny residual of the first pass's rounding
    since_exact_ = 0;
  }

  int window_;
  int count_ = 0, next_ = 0, since_exact_ = 0;
  std::vector<double> values_;
  double shift_ = 0.0;            // values are accumulated as x - shift_
  double mean_ = 0.0, m2_ = 0.0;  // of the shifted values; m2_: sum of squared deviations
};

/// The two variants of SPEC §4's hidden-state score.
enum class Variant {
  epikv,  ///< z_A - z_B (the paper's primary method, detrended)
  hs_var  ///< mean_W(g_A) - mean_W(g_B) (raw rolling means)
};

/// The hidden-state signal's settings (SPEC §4): the two bands, the rolling window, the variant.
struct SignalConfig {
  int band_a = 10;  ///< layer index A into the engine's hidden states (HF output_hidden_states indexing)
  int band_b = 21;  ///< layer index B
  int window = 64;  ///< W
  Variant variant = Variant::epikv;
  static constexpr double epsilon = 1e-6;  ///< added to the standard deviation (SPEC §4)
};

/// One sequence's signal: feed the hidden states of bands A and B for each produced token, in
/// order, and get that token's frozen score. Used from one thread at a time, like its sequence.
/// The constructor throws for D < 1, a band below 0, or W < 1.
class Signal {
 public:
  Signal(SignalConfig config, int hidden) : config_(config), hidden_(hidden), a_(config.window), b_(config.window) {
    require(hidden >= 1, "epiphany::Signal: hidden size D = ", hidden, " must be >= 1");
    require(config.band_a >= 0 && config.band_b >= 0, "epiphany::Signal: bands A = ", config.band_a, ", B = ",
            config.band_b, " must be >= 0");
  }

  const SignalConfig& config() const { return config_; }
  std::int64_t tokens() const { return tokens_; }

  /// The engine's hidden states of a step, [L + 1, T, D] fp32 in HF output_hidden_states indexing
  /// (0 = embeddings): scores the T tokens from bands A and B, as push does. Also throws if there are
  /// too few layers for the bands.
  void push_hidden(View<const float, 3> hidden, std::span<float> out) {
    require(hidden.dim(0) > std::max(config_.band_a, config_.band_b), "epiphany::Signal: hidden states hold ",
            hidden.dim(0), " layers; bands A = ", config_.band_a, " and B = ", config_.band_b, " need more");
    const std::int64_t T = hidden.dim(1), D = hidden.dim(2);
    const auto band = [&](int l) { return View<const float, 2>{hidden.data + std::int64_t{l} * T * D, {T, D}}; };
    push(band(config_.band_a), band(config_.band_b), out);
  }

  /// Scores T tokens: h_a, h_b [T, D] are the hidden states of layers A and B for positions
  /// tokens() .. tokens() + T - 1; out [T] receives their scores. Validated before anything changes:
  /// throws for a shape mismatch, an out size other than T, or a hidden state that is not finite.
  void push(View<const float, 2> h_a, View<const float, 2> h_b, std::span<float> out) {
    const std::int64_t T = h_a.dim(0);
    require_shape(h_a, {T, hidden_}, "epiphany::Signal: h_A");
    require_shape(h_b, {T, hidden_}, "epiphany::Signal: h_B");
    require(static_cast<std::int64_t>(out.size()) == T, "epiphany::Signal: out holds ", out.size(), " scores for ",
            T, " tokens");
    require_finite(h_a, "epiphany::Signal: h_A");
    require_finite(h_b, "epiphany::Signal: h_B");
    for (std::int64_t t = 0; t < T; ++t) {
      const double ga = step(prev_a_, &h_a(t, 0));
      const double gb = step(prev_b_, &h_b(t, 0));
      a_.push(ga);
      b_.push(gb);
      out[static_cast<std::size_t>(t)] = math::saturate_to_float(
          config_.variant == Variant::epikv ? zscore(ga, a_) - zscore(gb, b_) : a_.mean() - b_.mean());
      ++tokens_;
    }
  }

 private:
  // g(t) = ||h(t) - h(t-1)||_2 in double; g(0) = 0. Remembers h(t).
  double step(std::vector<float>& prev, const float* h) const {
    double s = 0.0;
    if (!prev.empty())
      for (int i = 0; i < hidden_; ++i) {
        const double d = static_cast<double>(h[i]) - prev[static_cast<std::size_t>(i)];
        s += d * d;
      }
    prev.assign(h, h + hidden_);
    return std::sqrt(s);
  }
  static double zscore(double g, const RollingWindow& w) {
    return (g - w.mean()) / (w.stddev() + SignalConfig::epsilon);
  }

  SignalConfig config_;
  int hidden_;
  RollingWindow a_, b_;
  std::vector<float> prev_a_, prev_b_;
  std::int64_t tokens_ = 0;
};

}  // namespace kvpolicy::epiphany
