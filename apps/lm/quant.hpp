// kvpolicy-lm's quantized weights: the GGUF's ggml blocks (Q4_1, Q8_0) as kvpolicy-gguf-to-lm keeps
// them (model.quant.safetensors), for the products of a decode step. A decode step multiplies one
// row by every weight matrix, so it is bound by the bytes of weights it reads: 96 MB of blocks
// against 540 MB of F32 for SmolLM2-135M. A single activation row (a decode step) is dotted with
// the blocks directly on AVX2 (quant_product); otherwise, and for the tests, a row of blocks widens
// to fp32 exactly as gguf-py (and kvpolicy-gguf-to-lm's F32 file) dequantizes it:
//   Q4_1  block of 32: fp16 d, fp16 m, 16 bytes of nibbles (low nibble = element j, high = j + 16);
//         w = d * q + m
//   Q8_0  block of 32: fp16 d, 32 int8; w = d * q
// d * q is exact in fp32 (11 + 8 significant bits at most), so w has the F32 file's bits whether the
// sum is fused (the AVX2 path's FMA) or not (the portable one). The products differ from Eigen's
// over the F32 matrix only by fp32 rounding (the order of the additions, and d * sum(q x) + m * sum(x)
// in place of sum((d q + m) x) on the direct path).
//
// llama.cpp's arithmetic (quant_product_q8, the decode default): each activation row is first
// rounded to Q8 blocks of 32 (Q8Row: dx = max|x| / 127, qx = round(x / dx)), and a block's dot is an
// integer one, exact in int32:
//   Q4_1 · Q8:  d dx Σ q qx + m dx Σ qx      Q8_0 · Q8:  d dx Σ q qx
// which is Σ w x̂ with x̂ = dx qx, the rounded row, in both (llama.cpp's Q8_1 stores dx Σ qx for the m
// term). Σ x unrounded in the m term would not be closer: the error would become Σ (w - m)(x̂ - x),
// whose weights d q in [0, 15 d] do not center on 0 as w does (twice the error on SmolLM2's rows).
// A product differs from the exact one by the activations' rounding, at most dx / 2 per element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvpolicy/core/eigen.hpp"

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/error.hpp"

#if (defined(__AVX2__) || defined(__F16C__)) && (defined(__x86_64__) || defined(_M_X64))
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__) && (defined(__x86_64__) || defined(_M_X64))
#define KVPOLICY_LM_QUANT_AVX2 1
#else
#define KVPOLICY_LM_QUANT_AVX2 0
#endif
// AVX-512 VNNI's u8 x s8 dot product on 256-bit registers (one instruction for maddubs + madd)
#if KVPOLICY_LM_QUANT_AVX2 && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KVPOLICY_LM_QUANT_VNNI 1
#else
#define KVPOLICY_LM_QUANT_VNNI 0
#endif

namespace kvpolicy::lm {

namespace detail {
/// A block's little-endian fp16 scale as fp32 (exact either way: F16C where compiled in).
inline float half_bits_to_float(const std::uint8_t* p) {
#if defined(__F16C__) && (defined(__x86_64__) || defined(_M_X64))
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | (p[1] << 8)));
#else
  return dtype::half_to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
#endif
}
}  // namespace detail

enum class BlockFormat { q4_1, q8_0 };

inline const char* block_format_name(BlockFormat f) { return f == BlockFormat::q4_1 ? "Q4_1" : "Q8_0"; }

/// One weight matrix [rows, cols] as rows of ggml blocks of 32 weights.
struct QuantMatrix {
  static constexpr std::int64_t kBlock = 32;
  BlockFormat format = BlockFormat::q4_1;
  std::int64_t rows = 0, cols = 0;
  std::vector<std::uint8_t> blocks;  // [rows, row_bytes()]

  static std::int64_t block_bytes(BlockFormat f) { return f == BlockFormat::q4_1 ? 20 : 34; }
  std::int64_t row_bytes() const { return cols / kBlock * block_bytes(format); }
  bool empty() const { return blocks.empty(); }

  /// Checks the sizes (cols a multiple of 32, rows * row_bytes bytes); `what` names the tensor.
  void validate(const std::string& what) const {
    require(rows >= 1 && cols >= kBlock && cols % kBlock == 0, "kvpolicy-lm: ", what, ": ", block_format_name(format),
            " needs rows >= 1 and a multiple of ", kBlock, " columns, not [", rows, ", ", cols, "]");
    require(static_cast<std::int64_t>(blocks.size()) == rows * row_bytes(), "kvpolicy-lm: ", what, ": ", blocks.size(),
            " bytes of ", block_format_name(format), " blocks for [", rows, ", ", cols, "], want ", rows * row_bytes());
  }

  /// Row r as fp32 (out[cols]): the weights gguf-py's dequantize gives, bit for bit.
  void dequantize_row(std::int64_t r, float* out) const {
    const std::uint8_t* p = blocks.data() + r * row_bytes();
    const std::int64_t bb = block_bytes(format);
    for (std::int64_t b = 0; b < cols / kBlock; ++b, p += bb, out += kBlock) {
      if (format == BlockFormat::q4_1)
        dequantize_q4_1(p, out);
      else
        dequantize_q8_0(p, out);
    }
  }

 private:
  static void dequantize_q4_1(const std::uint8_t* p, float* out) {
    const float d = detail::half_bits_to_float(p), m = detail::half_bits_to_float(p + 2);
    const std::uint8_t* qs = p + 4;
#if KVPOLICY_LM_QUANT_AVX2
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    const auto put = [&](float* o, __m128i bytes8) {  // the low 8 bytes -> 8 weights
      _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes8)), vd, vm));
    };
    put(out, lo);
    put(out + 8, _mm_srli_si128(lo, 8));
    put(out + 16, hi);
    put(out + 24, _mm_srli_si128(hi, 8));
#else
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
      out[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
#endif
  }
  static void dequantize_q8_0(const std::uint8_t* p, float* out) {
    const float d = detail::half_bits_to_float(p);
    const std::uint8_t* qs = p + 2;
#if KVPOLICY_LM_QUANT_AVX2
    const __m256 vd = _mm256_set1_ps(d);
    for (int j = 0; j < 32; j += 8)
      _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                  _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + j)))),
                                              vd));
#else
    for (int j = 0; j < 32; ++j) {
      std::int8_t q;
      std::memcpy(&q, qs + j, 1);
      out[j] = d * static_cast<float>(q);
    }
#endif
  }
};

namespace detail {

#if KVPOLICY_LM_QUANT_AVX2
inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
inline __m256 widen8(__m128i low8_bytes_u8) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(low8_bytes_u8)); }

// dot(row, x) without widening the weights: per block, d * sum(q x) + m * sum(x), with sum(x) of
// each block in xsum (Q4_1; Q8_0 has no m). Fewer instructions than w = d q + m then w x, and the
// same sum up to fp32 rounding.
inline float dot_q4_1(const std::uint8_t* p, const float* x, const float* xsum, std::int64_t blocks) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float m_acc = 0.0f;
  for (std::int64_t b = 0; b < blocks; ++b, p += 20, x += 32) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    __m256 s = _mm256_mul_ps(widen8(lo), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(widen8(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), s);
    __m256 t = _mm256_mul_ps(widen8(hi), _mm256_loadu_ps(x + 16));
    t = _mm256_fmadd_ps(widen8(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), t);
    const __m256 d = _mm256_set1_ps(half_bits_to_float(p));
    acc0 = _mm256_fmadd_ps(d, s, acc0);
    acc1 = _mm256_fmadd_ps(d, t, acc1);
    m_acc += half_bits_to_float(p + 2) * xsum[b];
  }
  return hsum(_mm256_add_ps(acc0, acc1)) + m_acc;
}

inline float dot_q8_0(const std::uint8_t* p, const float* x, std::int64_t blocks) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const auto widen_s8 = [](const std::uint8_t* q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
  };
  for (std::int64_t b = 0; b < blocks; ++b, p += 34, x += 32) {
    __m256 s = _mm256_mul_ps(widen_s8(p + 2), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(widen_s8(p + 10), _mm256_loadu_ps(x + 8), s);
    __m256 t = _mm256_mul_ps(widen_s8(p + 18), _mm256_loadu_ps(x + 16));
    t = _mm256_fmadd_ps(widen_s8(p + 26), _mm256_loadu_ps(x + 24), t);
    const __m256 d = _mm256_set1_ps(half_bits_to_float(p));
    acc0 = _mm256_fmadd_ps(d, s, acc0);
    acc1 = _mm256_fmadd_ps(d, t, acc1);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}
#endif

}  // namespace detail

/// How a decode step's activation rows meet the blocks: rounded to Q8 blocks and dotted in integers
/// (llama.cpp's arithmetic), or kept in fp32 (the blocks' exact weights; differs from F32 weights by
/// fp32 rounding only).
enum class DecodeActivations { q8, f32 };

/// One activation row rounded to Q8 blocks of 32, as ggml's quantize_row_q8_1: per block b,
/// dx = max|x| / 127 and qx = round(x / dx) in [-127, 127] (0 for a block of zeros); scale[b] = dx
/// and sum[b] = dx Σ qx (Q4_1's m term), each rounded to fp16 as ggml stores them.
struct Q8Row {
  std::vector<std::int8_t> q;
  std::vector<float> scale, sum;

  void quantize(const float* x, std::int64_t cols) {
    const std::int64_t blocks = cols / QuantMatrix::kBlock;
    q.resize(static_cast<std::size_t>(cols));
    scale.resize(static_cast<std::size_t>(blocks));
    sum.resize(static_cast<std::size_t>(blocks));
    for (std::int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + b * QuantMatrix::kBlock;
      float amax = 0.0f;
      for (std::int64_t j = 0; j < QuantMatrix::kBlock; ++j) amax = std::max(amax, std::abs(xb[j]));
      const float dx = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      std::int32_t total = 0;
      for (std::int64_t j = 0; j < QuantMatrix::kBlock; ++j) {
        const auto qj = static_cast<std::int8_t>(std::nearbyint(xb[j] * inv));
        q[static_cast<std::size_t>(b * QuantMatrix::kBlock + j)] = qj;
        total += qj;
      }
      // kept as fp16, as ggml's block_q8_1 keeps them: the same x̂ as llama.cpp's, not only alike
      scale[static_cast<std::size_t>(b)] = dtype::half_to_float(dtype::float_to_half(dx));
      sum[static_cast<std::size_t>(b)] = dtype::half_to_float(dtype::float_to_half(dx * static_cast<float>(total)));
    }
  }
};

namespace detail {

#if KVPOLICY_LM_QUANT_AVX2
// Σ over 32 lanes of u8 w times s8 x, as 8 int32 partial sums (|w| <= 128, |x| <= 127: no int16
// pair overflows in maddubs).
inline __m256i dot_u8_s8(__m256i w, __m256i x) {
#if KVPOLICY_LM_QUANT_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

inline float dot_q4_1_q8(const std::uint8_t* p, const Q8Row& x, std::int64_t blocks) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float m_acc = 0.0f;
  const std::int8_t* xq = x.q.data();
  const auto block = [&](std::int64_t b, __m256& acc) {
    const std::uint8_t* pb = p + b * 20;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + 4));
    // low lane: the low nibbles (elements 0..15), high lane: the high ones (16..31)
    const __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), mask);
    const __m256i s = dot_u8_s8(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * 32)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(half_bits_to_float(pb) * x.scale[static_cast<std::size_t>(b)]), acc);
    m_acc += half_bits_to_float(pb + 2) * x.sum[static_cast<std::size_t>(b)];
  };
  std::int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    block(b, acc0);
    block(b + 1, acc1);
  }
  if (b < blocks) block(b, acc0);
  return hsum(_mm256_add_ps(acc0, acc1)) + m_acc;
}

inline float dot_q8_0_q8(const std::uint8_t* p, const Q8Row& x, std::int64_t blocks) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const std::int8_t* xq = x.q.data();
  const auto block = [&](std::int64_t b, __m256& acc) {
    const std::uint8_t* pb = p + b * 34;
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 2));
    const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * 32));
    // s8 x s8 as u8 x s8: |w| times x with w's sign
    const __m256i s = dot_u8_s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xb, w));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(half_bits_to_float(pb) * x.scale[static_cast<std::size_t>(b)]), acc);
  };
  std::int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    block(b, acc0);
    block(b + 1, acc1);
  }
  if (b < blocks) block(b, acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}
#endif

// The same sums in portable code: each block's integer dot exact, then the same fp32 terms.
inline float dot_q8_portable(const std::uint8_t* p, BlockFormat f, const Q8Row& x, std::int64_t blocks) {
  float acc = 0.0f;
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int8_t* xq = x.q.data() + b * 32;
    std::int32_t s = 0;
    if (f == BlockFormat::q4_1) {
      const std::uint8_t* pb = p + b * 20;
      for (int j = 0; j < 16; ++j) s += (pb[4 + j] & 0x0F) * xq[j] + (pb[4 + j] >> 4) * xq[j + 16];
      acc += half_bits_to_float(pb) * x.scale[static_cast<std::size_t>(b)] * static_cast<float>(s) +
             half_bits_to_float(pb + 2) * x.sum[static_cast<std::size_t>(b)];
    } else {
      const std::uint8_t* pb = p + b * 34;
      for (int j = 0; j < 32; ++j) {
        std::int8_t w;
        std::memcpy(&w, pb + 2 + j, 1);
        s += w * xq[j];
      }
      acc += half_bits_to_float(pb) * x.scale[static_cast<std::size_t>(b)] * static_cast<float>(s);
    }
  }
  return acc;
}

}  // namespace detail

/// quant_product in llama.cpp's arithmetic: each row of `a` rounded to Q8 blocks (into `x`), then
/// out[t, r] = (or +=) the integer-dot sum above with W row r, for rows [r0, r1) of W.
template <class RowMatrix>
void quant_product_q8(const RowMatrix& a, const QuantMatrix& W, RowMatrix& out, std::int64_t r0, std::int64_t r1,
                      bool accumulate, Q8Row& x) {
  const std::int64_t blocks = W.cols / QuantMatrix::kBlock;
  for (Eigen::Index t = 0; t < a.rows(); ++t) {
    x.quantize(a.row(t).data(), W.cols);
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::uint8_t* p = W.blocks.data() + r * W.row_bytes();
#if KVPOLICY_LM_QUANT_AVX2
      const float v = W.format == BlockFormat::q4_1 ? detail::dot_q4_1_q8(p, x, blocks) : detail::dot_q8_0_q8(p, x, blocks);
#else
      const float v = detail::dot_q8_portable(p, W.format, x, blocks);
#endif
      if (accumulate)
        out(t, r) += v;
      else
        out(t, r) = v;
    }
  }
}

/// out[t, r] = (or +=) dot(W row r, a row t) for rows [r0, r1) of W. One activation row (a decode
/// step) on AVX2: straight from the blocks (detail::dot_q4_1, dot_q8_0). Otherwise each row of
/// blocks is widened once into `row` (cols floats) and dotted with every row of a.
template <class RowMatrix>
void quant_product(const RowMatrix& a, const QuantMatrix& W, RowMatrix& out, std::int64_t r0, std::int64_t r1,
                   bool accumulate, Eigen::VectorXf& row) {
  const std::int64_t blocks = W.cols / QuantMatrix::kBlock;
#if KVPOLICY_LM_QUANT_AVX2
  if (a.rows() == 1) {
    const float* x = a.data();
    row.resize(blocks);  // sum(x) of each block (Q4_1's m term)
    for (std::int64_t b = 0; b < blocks; ++b) row(b) = Eigen::Map<const Eigen::VectorXf>(x + b * 32, 32).sum();
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::uint8_t* p = W.blocks.data() + r * W.row_bytes();
      const float v = W.format == BlockFormat::q4_1 ? detail::dot_q4_1(p, x, row.data(), blocks)
                                                    : detail::dot_q8_0(p, x, blocks);
      if (accumulate)
        out(0, r) += v;
      else
        out(0, r) = v;
    }
    return;
  }
#endif
  row.resize(W.cols);
  for (std::int64_t r = r0; r < r1; ++r) {
    W.dequantize_row(r, row.data());
    for (Eigen::Index t = 0; t < a.rows(); ++t) {
      const float v = a.row(t).dot(row.transpose());
      if (accumulate)
        out(t, r) += v;
      else
        out(t, r) = v;
    }
  }
}

}  // namespace kvpolicy::lm
