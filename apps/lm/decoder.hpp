// kvpolicy-lm's forward pass: a LLaMA-family decoder on the CPU whose K/V live in a kvpolicy Cache.
// One call runs one step of one sequence (a prefill chunk of T tokens, or one decode token):
//   per layer: h = RMSNorm(x); q, k, v = h W^T; RoPE on q, k; the policy's metadata for the new
//   entries (a gate, statistics, or nothing); cache.append -> cache.attend (GQA inside the cache);
//   x += o Wo^T; x += W_down (SiLU(W_gate h') * W_up h') with h' = RMSNorm(x);
// then cache.commit() (the policy's trigger and eviction, never between layers), and the logits of
// the rows asked for from the final RMSNorm and the output head.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kvpolicy/core/view.hpp"
#include "kvpolicy/epikv.hpp"
#include "kvpolicy/inputs/producer.hpp"
#include "model.hpp"

namespace kvpolicy::lm {

/// What a policy needs of a layer's new entries of sequence `seq`, besides K and V: fills out [Hkv, T] (log_beta, a
/// frozen score or WG-KV's g). h [T, D] is the layer's normed input, keys_pre/keys/values [Hkv, T, d]
/// (keys before and after RoPE). Empty: zeros (policies that ignore it).
using LayerMetadata = std::function<void(std::int64_t seq, int layer, const Matrix& h, const std::vector<float>& keys_pre,
                                         const std::vector<float>& keys, const std::vector<float>& values,
                                         std::int64_t T, float* out)>;

/// EpiKV's score (SPEC §4): one frozen score per token from the hidden states of bands A and B, in
/// HF output_hidden_states indexing (0 = the embeddings, l = the residual stream after layer l - 1,
/// L = the final RMSNorm's output). Band B exists only after layer B - 1, long after layer 0 has
/// appended its entries, so the step appends them with a placeholder and sets every layer's scores
/// (Cache::set_step_scores) before commit, where the eviction reads them. score(seq, h_a, h_b, out)
/// fills out [T] from h_a, h_b [T, D].
struct HiddenStateScore {
  int band_a = -1, band_b = -1;
  std::function<void(std::int64_t seq, const Matrix& h_a, const Matrix& h_b, float* out)> score;
  explicit operator bool() const { return static_cast<bool>(score); }
};

/// Everything a policy takes from the forward pass: per-layer metadata, or the hidden-state score.
struct EntryMetadata {
  LayerMetadata layer;
  HiddenStateScore hidden;
  /// The probe the policy runs after the prompt (SPEC §10: KVzip's repetition), or none.
  std::optional<inputs::ReconstructionProbe> reconstruction;
};

/// Sums a partial product over the ranks of a split model, in place (tensor_parallel.hpp); empty
/// for a model on one rank.
using PartialSum = std::function<void(Matrix&)>;

class Decoder {
 public:
  /// reduce: the all-reduce of a rank's share of the model (o's and down's partial products);
  /// empty for the whole model. activations: how a decode step's rows meet the GGUF's blocks
  /// (quant.hpp: rounded to Q8 and dotted in integers, as llama.cpp, or in fp32).
  explicit Decoder(const Model& m, PartialSum reduce = {}, DecodeActivations activations = DecodeActivations::q8)
      : m_(m), c_(m.config), reduce_(std::move(reduce)), activations_(activations) {
    // RoPE's inverse frequencies base^(-2i / rope_dim), i < rope_dim / 2, in double then rounded once
    for (int i = 0; i < c_.rope_dim / 2; ++i)
      inv_freq_.push_back(std::pow(c_.rope_base, -2.0 * i / static_cast<double>(c_.rope_dim)));
  }

  const Config& config() const { return m_.config; }

  /// Runs tokens[0, T) of `seq` (positions cache.tokens(seq) ...) as one step and commits it. With
  /// `logits` non-null, writes the output head's logits of the last `logit_rows` tokens
  /// ([logit_rows, V]; 0 = every token). Returns the commit's report.
  template <class CacheT>
  auto step(CacheT& cache, std::int64_t seq, std::span<const int> tokens, const EntryMetadata& metadata, Matrix* logits,
            std::int64_t logit_rows = 0) {
    const std::int64_t T = static_cast<std::int64_t>(tokens.size()), D = c_.hidden, d = c_.head_dim;
    const int Hq = c_.q_heads, Hkv = c_.kv_heads;
    const std::int64_t pos0 = cache.tokens(seq);
    require(T >= 1, "kvpolicy-lm: a step needs at least one token");
    Matrix x(T, D);
    for (std::int64_t t = 0; t < T; ++t) {
      const int id = tokens[static_cast<std::size_t>(t)];
      require(id >= 0 && id < c_.vocab, "kvpolicy-lm: token id ", id, " is not in [0, ", c_.vocab, ")");
      x.row(t) = m_.embed.dense.row(id);
    }
    Matrix h, q, k, v, o, gate, up, part;
    std::vector<float> qh(static_cast<std::size_t>(Hq * T * d)), kh_pre(static_cast<std::size_t>(Hkv * T * d)),
        kh(kh_pre.size()), vh(kh_pre.size()), oh(qh.size()), meta(static_cast<std::size_t>(Hkv * T));
    const HiddenStateScore& hidden = metadata.hidden;
    Matrix band_a, band_b;  // EpiKV's hidden states of this step's tokens
    for (int l = 0; l < c_.layers; ++l) {
      if (hidden && l == hidden.band_a) band_a = x;
      if (hidden && l == hidden.band_b) band_b = x;
      const LayerWeights& w = m_.layers[static_cast<std::size_t>(l)];
      rms_norm(x, w.attn_norm, h);
      project(h, w.wq, q);
      project(h, w.wk, k);
      project(h, w.wv, v);
      to_heads(k, Hkv, kh_pre);
      rope(q, pos0);
      rope(k, pos0);
      to_heads(q, Hq, qh);
      to_heads(k, Hkv, kh);
      to_heads(v, Hkv, vh);
      std::fill(meta.begin(), meta.end(), 0.0f);
      if (metadata.layer) metadata.layer(seq, l, h, kh_pre, kh, vh, T, meta.data());
      cache.append(seq, l, View<const float, 3>(kh.data(), {Hkv, T, d}), View<const float, 3>(vh.data(), {Hkv, T, d}),
                   View<const float, 2>(meta.data(), {Hkv, T}));
      cache.attend(seq, l, View<const float, 3>(qh.data(), {Hq, T, d}), View<float, 3>(oh.data(), {Hq, T, d}));
      from_heads(oh, Hq, T, o);
      add_product(o, w.wo, x, part);
      rms_norm(x, w.ffn_norm, h);
      project(h, w.w_gate, gate);
      project(h, w.w_up, up);
      gate = gate.unaryExpr([](float g) { return g / (1.0f + std::exp(-g)); }).cwiseProduct(up);
      add_product(gate, w.w_down, x, part);
    }
    if (hidden) set_hidden_scores(cache, seq, x, T, band_a, band_b, hidden);
    auto report = cache.commit(seq);
    if (logits != nullptr) {
      const std::int64_t rows = logit_rows <= 0 ? T : std::min(logit_rows, T);
      Matrix last = x.bottomRows(rows);
      rms_norm(last, m_.output_norm, h);
      project(h, m_.head(), *logits);
    }
    return report;
  }

 private:
  // SPEC §4: the step's T scores from bands A and B, the same in every layer and kv head.
  template <class CacheT>
  void set_hidden_scores(CacheT& cache, std::int64_t seq, const Matrix& x, std::int64_t T, Matrix& band_a, Matrix& band_b,
                         const HiddenStateScore& hidden) const {
    if constexpr (requires { cache.set_step_scores(seq, 0, View<const float, 2>{}); }) {
      if (hidden.band_a == c_.layers) rms_norm(x, m_.output_norm, band_a);  // HF's last hidden state is normed
      if (hidden.band_b == c_.layers) rms_norm(x, m_.output_norm, band_b);
      std::vector<float> token_scores(static_cast<std::size_t>(T)), scores(static_cast<std::size_t>(c_.layers * c_.kv_heads * T));
      hidden.score(seq, band_a, band_b, token_scores.data());
      const CacheShape shape = c_.cache_shape();
      broadcast_token_scores(shape, token_scores, View<float, 3>(scores.data(), {c_.layers, c_.kv_heads, T}));
      for (int l = 0; l < c_.layers; ++l)
        cache.set_step_scores(seq, l, View<const float, 2>(scores.data() + std::int64_t{l} * c_.kv_heads * T, {c_.kv_heads, T}));
    } else {
      fail("kvpolicy-lm: a hidden-state score needs a cache with a frozen-score Scorer (EpiKVCache)");
    }
  }

  // out = a W^T (or out += a W^T), W [out, in] row-major. Eigen spreads matrix-matrix products over
  // OpenMP's threads but runs a matrix-vector product on one, so a decode step (a few rows) splits
  // W's rows over the threads here: each thread streams its own slice of the weights. A few rows
  // read the GGUF's blocks where the model has them (quant.hpp: a fifth of F32's bytes), with the
  // activations rounded to Q8 or not (activations_); otherwise every output is the same dot product
  // either way, and with one thread this is Eigen's product.
  void project(const Matrix& a, const Weight& W, Matrix& out, bool accumulate = false) const {
    const Eigen::Index n = W.dense.rows();
    const bool few = a.rows() < kFewRows, blocks = few && !W.blocks.empty();
    const auto rows = [&](Eigen::Index r0, Eigen::Index r1) {
      if (blocks && activations_ == DecodeActivations::q8) {
        thread_local Q8Row x;  // each thread rounds the row itself: a few hundred values, not worth a barrier
        quant_product_q8(a, W.blocks, out, r0, r1, accumulate, x);
      } else if (blocks) {
        thread_local Eigen::VectorXf row;  // quant_product's scratch: a widened row, or the blocks' sums of x
        quant_product(a, W.blocks, out, r0, r1, accumulate, row);
      } else if (accumulate) {
        out.middleCols(r0, r1 - r0).noalias() += a * W.dense.middleRows(r0, r1 - r0).transpose();
      } else {
        out.middleCols(r0, r1 - r0).noalias() = a * W.dense.middleRows(r0, r1 - r0).transpose();
      }
    };
    if (!accumulate) out.resize(a.rows(), n);
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
    if (few && threads > 1 && !omp_in_parallel()) {
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int t = 0; t < threads; ++t) rows(n * t / threads, n * (t + 1) / threads);
      return;
    }
#endif
    if (blocks) return rows(0, n);
    if (accumulate)
      out.noalias() += a * W.dense.transpose();
    else
      out.noalias() = a * W.dense.transpose();
  }
  static constexpr Eigen::Index kFewRows = 8;  // below this, a product is a few matrix-vector ones

  // x += a W^T; on a rank of a split model, a W^T is a partial sum over the ranks (W's columns are
  // split), summed by reduce_ before it is added, so every rank's x stays the same.
  void add_product(const Matrix& a, const Weight& W, Matrix& x, Matrix& part) const {
    if (!reduce_) return project(a, W, x, /*accumulate=*/true);
    project(a, W, part);
    reduce_(part);
    x += part;
  }

  // y = x / sqrt(mean(x^2) + eps) * w per row (the sum of squares in double, as ggml's rms_norm)
  void rms_norm(const Matrix& x, const Vector& w, Matrix& y) const {
    y.resize(x.rows(), x.cols());
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      double ss = 0.0;
      for (Eigen::Index i = 0; i < x.cols(); ++i) ss += static_cast<double>(x(t, i)) * x(t, i);
      const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(x.cols())) + c_.rms_eps);
      y.row(t) = (x.row(t) * scale).cwiseProduct(w.transpose());
    }
  }

  // RoPE on adjacent pairs (2i, 2i+1) of every head of a [T, H*d] row block, angle pos * inv_freq[i].
  void rope(Matrix& a, std::int64_t pos0) const {
    const int d = c_.head_dim, heads = static_cast<int>(a.cols()) / d;
    for (Eigen::Index t = 0; t < a.rows(); ++t) {
      const double pos = static_cast<double>(pos0 + t);
      for (int i = 0; i < c_.rope_dim / 2; ++i) {
        const double theta = pos * inv_freq_[static_cast<std::size_t>(i)];
        const float cs = static_cast<float>(std::cos(theta)), sn = static_cast<float>(std::sin(theta));
        for (int hh = 0; hh < heads; ++hh) {
          float& x0 = a(t, hh * d + 2 * i);
          float& x1 = a(t, hh * d + 2 * i + 1);
          const float a0 = x0, a1 = x1;
          x0 = a0 * cs - a1 * sn;
          x1 = a0 * sn + a1 * cs;
        }
      }
    }
  }

  // [T, H*d] -> [H, T, d] and back
  void to_heads(const Matrix& a, int heads, std::vector<float>& out) const {
    const std::int64_t T = a.rows(), d = c_.head_dim;
    for (int hh = 0; hh < heads; ++hh)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t c = 0; c < d; ++c) out[static_cast<std::size_t>((hh * T + t) * d + c)] = a(t, hh * d + c);
  }
  void from_heads(const std::vector<float>& in, int heads, std::int64_t T, Matrix& a) const {
    const std::int64_t d = c_.head_dim;
    a.resize(T, heads * d);
    for (int hh = 0; hh < heads; ++hh)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t c = 0; c < d; ++c) a(t, hh * d + c) = in[static_cast<std::size_t>((hh * T + t) * d + c)];
  }

  const Model& m_;
  const Config& c_;
  PartialSum reduce_;
  DecodeActivations activations_;
  std::vector<double> inv_freq_;
};

}  // namespace kvpolicy::lm
