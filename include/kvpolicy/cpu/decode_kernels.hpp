/// \file
/// kvpolicy/cpu/decode_kernels.hpp — the two inner loops of a decode step's attention (SPEC §6) for a
/// few query rows (the G query heads of a group, T small) over entries that lie wherever the pool put
/// them, read in their storage dtype:
///   decode_logits:     s_rj = q_r · k_j                      (q already scaled by 1/sqrt(d))
///   decode_accumulate: acc_r += Σ_j p_rj · v_j
/// A decode step reads each entry once and does 2·rows·d flops on it, so these loops decide whether
/// the step runs at the memory's speed. The packet kernels (Eigen's 8-lane AVX packets: x86-64 built
/// with -mavx or -march=native; FMA where compiled in) keep every row's partial sums in registers:
/// the logits of several entries at once, each k_j loaded and widened (cpu/widen.hpp: fp16 by F16C,
/// bf16 by a 16-bit shift) once for all rows; the values in blocks of entries with acc's columns held
/// in registers across the block, so acc is loaded and stored once per block, not once per entry.
/// Elsewhere, or for a head dimension that is not a multiple of 8, the portable kernels: each entry
/// widened to fp32 and one Eigen matrix-vector product or rank-1 update. Both orders of summation are
/// fp32; they differ from each other and from the dense reference only by rounding
/// (tests/test_decode_kernels.cpp). attend_tiled calls them; an engine with its own softmax can too.
/// keys[j] and values[j] point at d values in Storage (float, half, bfloat16), e.g. pool.key(slot);
/// an entry may appear more than once. They check nothing and throw nothing: 1 <= rows <=
/// kDecodeMaxRows and the sizes are the caller's to keep. Each call uses only its arguments, so
/// threads may call them at once on different outputs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>

#include "kvpolicy/core/eigen.hpp"

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/cpu/widen.hpp"

#define KVPOLICY_DECODE_PACKET8 KVPOLICY_WIDEN_PACKET8

namespace kvpolicy::cpu {

/// The most query rows the decode kernels take at once (TiledAttentionTuning::kFewRows).
inline constexpr std::int64_t kDecodeMaxRows = 8;

/// The entries a caller reads next (its next tile): while decode_logits reads keys[j] it asks the
/// memory for ahead.key[j] and ahead.value[j] (a software prefetch, only a hint), so that they are
/// on their way while this tile computes; the stream alone does not keep enough reads in flight.
template <class Storage>
struct DecodeAhead {
  std::span<const Storage* const> key, value;
};

namespace detail {

/// Entry j widened to fp32: in place for float storage, else into `buf` (d floats).
template <class Storage>
const float* entry_as_float(const Storage* entry, float* buf, std::int64_t d) {
  if constexpr (std::is_same_v<Storage, float>) {
    (void)buf, (void)d;
    return entry;
  } else {
    widen(entry, buf, d);
    return buf;
  }
}

}  // namespace detail

/// Portable decode_logits: s[r·ld + j] = q[r·d, d) · keys[j] for r < rows, j < keys.size().
template <class Storage>
void decode_logits_portable(const float* q, std::int64_t rows, std::int64_t d, std::span<const Storage* const> keys,
                            float* s, std::int64_t ld) {
  using RowMatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMatrixF> qm(q, rows, d);
  Eigen::Map<RowMatrixF, 0, Eigen::OuterStride<>> sm(s, rows, static_cast<std::int64_t>(keys.size()), Eigen::OuterStride<>(ld));
  Eigen::VectorXf buf(d);
  for (std::size_t j = 0; j < keys.size(); ++j)
    sm.col(static_cast<std::int64_t>(j)).noalias() =
        qm * Eigen::Map<const Eigen::VectorXf>(detail::entry_as_float(keys[j], buf.data(), d), d);
}

/// Portable decode_accumulate: acc[r·d, d) += Σ_j p[r·ld + j] · values[j] for r < rows.
template <class Storage>
void decode_accumulate_portable(const float* p, std::int64_t ld, std::int64_t rows, std::int64_t d,
                                std::span<const Storage* const> values, float* acc) {
  using RowMatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMatrixF, 0, Eigen::OuterStride<>> pm(p, rows, static_cast<std::int64_t>(values.size()),
                                                                  Eigen::OuterStride<>(ld));
  Eigen::Map<RowMatrixF> am(acc, rows, d);
  Eigen::RowVectorXf buf(d);
  for (std::size_t j = 0; j < values.size(); ++j)
    am.noalias() += pm.col(static_cast<std::int64_t>(j)) *
                    Eigen::Map<const Eigen::RowVectorXf>(detail::entry_as_float(values[j], buf.data(), d), d);
}

#if KVPOLICY_DECODE_PACKET8
namespace detail::packet8 {

namespace ei = Eigen::internal;

/// The eight lane sums of a0..a7 as one packet, lane i = the sum of a_i's lanes (one 8×8 transpose,
/// then seven adds).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // __m256's alignment attribute in a template argument, as Eigen's own
#endif
inline Packet8f sum_lanes8(Packet8f a0, Packet8f a1, Packet8f a2, Packet8f a3, Packet8f a4, Packet8f a5, Packet8f a6,
                           Packet8f a7) {
  ei::PacketBlock<Packet8f, 8> t;
  t.packet[0] = a0, t.packet[1] = a1, t.packet[2] = a2, t.packet[3] = a3;
  t.packet[4] = a4, t.packet[5] = a5, t.packet[6] = a6, t.packet[7] = a7;
  ei::ptranspose(t);
  return ei::padd(ei::padd(ei::padd(t.packet[0], t.packet[1]), ei::padd(t.packet[2], t.packet[3])),
                  ei::padd(ei::padd(t.packet[4], t.packet[5]), ei::padd(t.packet[6], t.packet[7])));
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/// Asks for the cache lines of one row of d values (a hint: never faults, never changes a result).
template <class Storage>
void prefetch_row(const Storage* row, std::int64_t d) {
  const auto* bytes = reinterpret_cast<const char*>(row);
  for (std::int64_t o = 0; o < d * static_cast<std::int64_t>(sizeof(Storage)); o += 64) ei::prefetch(bytes + o);
}

/// The I-th of up to eight packets (a compile-time choice).
template <int I>
Packet8f pick(Packet8f x0, Packet8f x1, Packet8f x2, Packet8f x3, Packet8f x4 = ei::pzero(Packet8f()),
              Packet8f x5 = ei::pzero(Packet8f()), Packet8f x6 = ei::pzero(Packet8f()), Packet8f x7 = ei::pzero(Packet8f())) {
  static_assert(I >= 0 && I < 8);
  if constexpr (I == 0) return x0;
  else if constexpr (I == 1) return x1;
  else if constexpr (I == 2) return x2;
  else if constexpr (I == 3) return x3;
  else if constexpr (I == 4) return x4;
  else if constexpr (I == 5) return x5;
  else if constexpr (I == 6) return x6;
  else return x7;
}

// The kernels keep their accumulators in eight named variables a0..a7, not in an array: GCC keeps
// an array of vectors on the stack and stores it on every iteration, which halves the speed.
#define KVPOLICY_DECODE_EACH8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/// Logits of R rows against the E entries keys[0, E): accumulator i holds (row i / E, entry i % E);
/// each key chunk is loaded and widened once for every row. Needs R·E ≤ 8 and d % 8 == 0.
template <int R, int E, class Storage>
KVPOLICY_PACKET_KERNEL void logits_block(const float* q, std::int64_t d, const Storage* const* keys, float* s, std::int64_t ld) {
  static_assert(R * E <= 8);
  const Packet8f zero = ei::pzero(Packet8f());
#define KVPOLICY_DECODE_ZERO(i) Packet8f a##i = zero;
  KVPOLICY_DECODE_EACH8(KVPOLICY_DECODE_ZERO)
#undef KVPOLICY_DECODE_ZERO
  for (std::int64_t c = 0; c < d; c += 8) {
#define KVPOLICY_DECODE_KEY(i) const Packet8f k##i = i < E ? widen8(keys[i < E ? i : 0] + c) : zero;
    KVPOLICY_DECODE_EACH8(KVPOLICY_DECODE_KEY)
#undef KVPOLICY_DECODE_KEY
#define KVPOLICY_DECODE_FMA(i)                                                                                   \
  if constexpr (i < R * E)                                                                                       \
    a##i = ei::pmadd(ei::ploadu<Packet8f>(q + (i / E) * d + c), pick<i % E>(k0, k1, k2, k3, k4, k5, k6, k7), a##i);
    KVPOLICY_DECODE_EACH8(KVPOLICY_DECODE_FMA)
#undef KVPOLICY_DECODE_FMA
  }
  alignas(32) float sums[8];
  ei::pstore(sums, sum_lanes8(a0, a1, a2, a3, a4, a5, a6, a7));
  for (int i = 0; i < R * E; ++i) s[(i / E) * ld + i % E] = sums[i];
}

template <int R, class Storage>
void logits(const float* q, std::int64_t d, std::span<const Storage* const> keys, float* s, std::int64_t ld,
            DecodeAhead<Storage> ahead) {
  constexpr int E = R >= 8 ? 1 : 8 / R;
  const auto n = static_cast<std::int64_t>(keys.size());
  const auto ahead_key = static_cast<std::int64_t>(ahead.key.size()), ahead_value = static_cast<std::int64_t>(ahead.value.size());
  const auto prefetch = [&](std::int64_t j0, std::int64_t j1) {
    for (std::int64_t j = j0; j < j1; ++j) {
      if (j < ahead_key) prefetch_row(ahead.key[static_cast<std::size_t>(j)], d);
      if (j < ahead_value) prefetch_row(ahead.value[static_cast<std::size_t>(j)], d);
    }
  };
  std::int64_t j = 0;
  for (; j + E <= n; j += E) {
    prefetch(j, j + E);
    logits_block<R, E>(q, d, keys.data() + j, s + j, ld);
  }
  for (; j < n; ++j) {
    prefetch(j, j + 1);
    logits_block<R, 1>(q, d, keys.data() + j, s + j, ld);
  }
  prefetch(n, std::max(ahead_key, ahead_value));  // a shorter tile still asks for all of the next
}

/// acc[R, d) columns [c0, c0 + 8·W) += P[R, nb) · V[nb, those columns): accumulator i holds (row i / W,
/// columns c0 + 8·(i % W) ...) in a register while the nb entries stream through, so acc is read and
/// written once per block of entries, not once per entry. Needs R·W ≤ 8.
template <int R, int W, class Storage>
KVPOLICY_PACKET_KERNEL void accumulate_columns(const float* p, std::int64_t ld, std::int64_t d, std::int64_t c0, const Storage* const* values,
                        std::int64_t nb, float* acc) {
  static_assert(R * W <= 8 && W <= 4);
  const Packet8f zero = ei::pzero(Packet8f());
#define KVPOLICY_DECODE_LOAD(i) Packet8f a##i = i < R * W ? ei::ploadu<Packet8f>(acc + (i / W) * d + c0 + 8 * (i % W)) : zero;
  KVPOLICY_DECODE_EACH8(KVPOLICY_DECODE_LOAD)
#undef KVPOLICY_DECODE_LOAD
  for (std::int64_t j = 0; j < nb; ++j) {
    const Storage* v = values[j] + c0;
    const Packet8f v0 = widen8(v), v1 = W > 1 ? widen8(v + 8) : zero, v2 = W > 2 ? widen8(v + 16) : zero,
                   v3 = W > 3 ? widen8(v + 24) : zero;
#define KVPOLICY_DECODE_FMA(i) \
  if constexpr (i < R * W) a##i = ei::pmadd(ei::pload1<Packet8f>(p + (i / W) * ld + j), pick<i % W>(v0, v1, v2, v3), a##i);
    KVPOLICY_DECODE_EACH8(KVPOLICY_DECODE_FMA)
#undef KVPOLICY_DECODE_FMA
  }
#define KVPOLICY_DECODE_STORE(i) \
  if constexpr (i < R * W) ei::pstoreu(acc + (i / W) * d + c0 + 8 * (i % W), a##i);
  KVPOLICY_DECODE_EACH8(KVPOLICY_DECODE_STORE)
#undef KVPOLICY_DECODE_STORE
}
#undef KVPOLICY_DECODE_EACH8

template <int R, class Storage>
void accumulate(const float* p, std::int64_t ld, std::int64_t d, std::span<const Storage* const> values, float* acc) {
  constexpr int W = R <= 2 ? 4 : R <= 4 ? 2 : 1;  // R·W ≤ 8 accumulators, with v and the broadcast: ≤ 16 registers
  constexpr std::int64_t kBlock = 16;  // entries per pass: 16 rows of K/V of a page, acc touched once per block
  const auto n = static_cast<std::int64_t>(values.size());
  for (std::int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const std::int64_t nb = std::min(kBlock, n - j0);
    std::int64_t c = 0;
    for (; c + 8 * W <= d; c += 8 * W) accumulate_columns<R, W>(p + j0, ld, d, c, values.data() + j0, nb, acc);
    for (; c < d; c += 8) accumulate_columns<R, 1>(p + j0, ld, d, c, values.data() + j0, nb, acc);
  }
}

}  // namespace detail::packet8

/// The packet decode_logits (needs d % 8 == 0 and 1 ≤ rows ≤ kDecodeMaxRows).
template <class Storage>
void decode_logits_packet8(const float* q, std::int64_t rows, std::int64_t d, std::span<const Storage* const> keys, float* s,
                           std::int64_t ld, DecodeAhead<Storage> ahead = {}) {
  switch (rows) {
    case 1: return detail::packet8::logits<1>(q, d, keys, s, ld, ahead);
    case 2: return detail::packet8::logits<2>(q, d, keys, s, ld, ahead);
    case 3: return detail::packet8::logits<3>(q, d, keys, s, ld, ahead);
    case 4: return detail::packet8::logits<4>(q, d, keys, s, ld, ahead);
    case 5: return detail::packet8::logits<5>(q, d, keys, s, ld, ahead);
    case 6: return detail::packet8::logits<6>(q, d, keys, s, ld, ahead);
    case 7: return detail::packet8::logits<7>(q, d, keys, s, ld, ahead);
    default: return detail::packet8::logits<8>(q, d, keys, s, ld, ahead);
  }
}

/// The packet decode_accumulate (needs d % 8 == 0 and 1 ≤ rows ≤ kDecodeMaxRows).
template <class Storage>
void decode_accumulate_packet8(const float* p, std::int64_t ld, std::int64_t rows, std::int64_t d,
                               std::span<const Storage* const> values, float* acc) {
  switch (rows) {
    case 1: return detail::packet8::accumulate<1>(p, ld, d, values, acc);
    case 2: return detail::packet8::accumulate<2>(p, ld, d, values, acc);
    case 3: return detail::packet8::accumulate<3>(p, ld, d, values, acc);
    case 4: return detail::packet8::accumulate<4>(p, ld, d, values, acc);
    case 5: return detail::packet8::accumulate<5>(p, ld, d, values, acc);
    case 6: return detail::packet8::accumulate<6>(p, ld, d, values, acc);
    case 7: return detail::packet8::accumulate<7>(p, ld, d, values, acc);
    default: return detail::packet8::accumulate<8>(p, ld, d, values, acc);
  }
}
#endif

/// s[r·ld + j] = q[r·d, d) · keys[j] (fp32 sums) for r < rows ≤ kDecodeMaxRows, j < keys.size();
/// `ahead` names the entries the caller reads next (DecodeAhead), or none. q is [rows, d] fp32
/// row-major, s has row stride ld >= keys.size(); the result is the same bits with or without `ahead`.
template <class Storage>
void decode_logits(const float* q, std::int64_t rows, std::int64_t d, std::span<const Storage* const> keys, float* s,
                   std::int64_t ld, DecodeAhead<Storage> ahead = {}) {
#if KVPOLICY_DECODE_PACKET8
  if (d % 8 == 0 && rows >= 1 && rows <= kDecodeMaxRows) return decode_logits_packet8(q, rows, d, keys, s, ld, ahead);
#endif
  (void)ahead;
  decode_logits_portable(q, rows, d, keys, s, ld);
}

/// acc[r·d, d) += Σ_j p[r·ld + j] · values[j] (fp32) for r < rows ≤ kDecodeMaxRows: p has row
/// stride ld, acc is [rows, d] fp32 row-major.
template <class Storage>
void decode_accumulate(const float* p, std::int64_t ld, std::int64_t rows, std::int64_t d,
                       std::span<const Storage* const> values, float* acc) {
#if KVPOLICY_DECODE_PACKET8
  if (d % 8 == 0 && rows >= 1 && rows <= kDecodeMaxRows) return decode_accumulate_packet8(p, ld, rows, d, values, acc);
#endif
  decode_accumulate_portable(p, ld, rows, d, values, acc);
}

}  // namespace kvpolicy::cpu
