/// \file
/// kvpolicy/cpu/tiled_attention.hpp — the fast CPU attention over one kv head of a cache (SPEC §6),
/// FlashAttention's scheme on Eigen: the head's G·T query rows (every query head of the group, every
/// token of the step) go in blocks of up to kRowBlock rows; each block streams the head's entries in
/// tiles of up to kTile, widened once per tile to fp32 (cpu/widen.hpp), and
///   S = (Q_block / sqrt(d)) · K_tileᵀ            an Eigen matrix product
///   S_rj = -inf where key j is not visible to row r (causal, WG-KV's vertical-slash mask, SPEC §3)
///   m' = max(m, rowmax S);  P = exp(S - m');  l = l·e^(m - m') + rowsum P
///   acc = acc·e^(m - m') + P · V_tile             an Eigen matrix product
/// and o = acc / l at the end (0 for a row that saw no key). A tile wholly after a block's last
/// query is skipped; a tile wholly before its first query, with no WG-KV mask, needs no mask at all.
/// The G query heads of a group share every pass over K/V, so a decode step reads each entry once.
/// With key_mass, a second pass adds each entry's probability from every row, P_rj = exp(S_rj - m_r)
/// / l_r (H2O's accumulation, SPEC §5), from the rows' final (m, l): no attention matrix is kept.
/// Same answers as attend_paged and attend_dense up to fp32 rounding (tests/test_attention.cpp).
///
/// Flash-decoding (attend_tiled_partial, merge_softmax_partials): a decode step's few rows over one
/// range of a head's entries leave their unnormalized state (m, l, acc) instead of o; the states of
/// the ranges that cover the head merge exactly as the tiles do,
///   M = max_c m_c;  o = Σ_c acc_c·e^(m_c - M) / Σ_c l_c·e^(m_c - M),
/// so the ranges of every head can run on different threads (cpu/executor.hpp). One range is the
/// whole head's answer bit for bit: e^0 = 1 leaves acc and l as they are.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "kvpolicy/core/eigen.hpp"

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/core/mask.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/cpu/decode_kernels.hpp"
#include "kvpolicy/cpu/softmax_partial.hpp"
#include "kvpolicy/cpu/widen.hpp"
#include "kvpolicy/memory/pool.hpp"

namespace kvpolicy::cpu {

/// Block sizes of attend_tiled: a tile of 64 fp32 keys and values of d = 128 is 64 KiB, which stays
/// in L2 while every row block of the step reads it.
struct TiledAttentionTuning {
  static constexpr std::int64_t kTile = 64;
  static constexpr std::int64_t kRowBlock = 64;
  /// Up to this many rows (a decode step: G query heads, T = 1) the logits and P·V are the decode
  /// kernels (cpu/decode_kernels.hpp), on each entry where it lies and in its storage dtype: no tile
  /// copy and no GEMM packing, whose cost a few rows would not amortize.
  static constexpr std::int64_t kFewRows = kDecodeMaxRows;
  /// Flash-decoding's range of entries per task: a decode step splits each head into ranges of this
  /// many entries (the last shorter), whatever the thread count, so the answer does not depend on it;
  /// 512 fp16 entries of d = 64 are 128 KiB of K and V, long enough that a range's merge (rows·d
  /// floats) costs little beside it.
  static constexpr std::int64_t kDecodeRange = 512;
};

namespace detail {

using RowMatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Scratch of one thread: reused across calls, so a decode step allocates nothing.
struct TiledScratch {
  RowMatrixF q, k, v, s, acc;
  Eigen::VectorXf m, l, correction;
  std::vector<std::int32_t> key_pos;
  std::vector<float> key_gate;
};

inline TiledScratch& tiled_scratch() {
  thread_local TiledScratch scratch;
  return scratch;
}

/// Where a tile's entries lie in the pool, for the decode kernels (one thread's, reused).
template <class Storage>
struct TileEntries {
  std::vector<const Storage*> key, value;              // this tile's
  std::vector<const Storage*> next_key, next_value;    // the next tile's, asked for ahead (DecodeAhead)
};

template <class Storage>
TileEntries<Storage>& tile_entries() {
  thread_local TileEntries<Storage> entries;
  return entries;
}

/// attend_tiled over the head's entries [first, last): writes o to `out`, or with `partial` (one row
/// block, no key_mass) leaves each row's unnormalized state there.
template <class Storage>
void attend_tiled_range(const memory::EntryPool<Storage>& pool, const memory::HeadLayout& head, int kv_head, int group,
                        View<const float, 3> queries, std::span<const std::int32_t> q_pos, View<float, 3> out,
                        std::span<float> key_mass, AttentionMask mask, std::int64_t first, std::int64_t last,
                        const SoftmaxPartial* partial) {
  using Tuning = TiledAttentionTuning;
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  const std::int64_t T = queries.dim(1), d = queries.dim(2), N = last;
  const std::int64_t rows = std::int64_t{group} * T;  // row r = (query head r / T of the group, token r % T)
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // The group's query heads are adjacent in [Hq, T, d]: its rows are one [G·T, d] block.
  const Eigen::Map<const detail::RowMatrixF> q_all(&queries(std::int64_t{kv_head} * group, 0, 0), rows, d);
  auto& w = detail::tiled_scratch();
  const std::int64_t row_block = std::min(rows, Tuning::kRowBlock);
  w.q.resize(row_block, d);
  w.acc.resize(row_block, d);
  w.s.resize(row_block, Tuning::kTile);
  w.k.resize(Tuning::kTile, d);
  w.v.resize(Tuning::kTile, d);
  w.key_pos.resize(Tuning::kTile);
  w.key_gate.resize(Tuning::kTile);
  auto& in_pool = detail::tile_entries<Storage>();
  in_pool.key.resize(Tuning::kTile);
  in_pool.value.resize(Tuning::kTile);
  in_pool.next_key.resize(Tuning::kTile);
  in_pool.next_value.resize(Tuning::kTile);
  const bool few_rows = row_block <= Tuning::kFewRows;
  w.m.resize(row_block);
  w.l.resize(row_block);
  w.correction.resize(row_block);
  const auto row_pos = [&](std::int64_t r) { return q_pos[static_cast<std::size_t>(r % T)]; };

  // Widens entries [b0, b0 + nb) into the tile (with few rows: points at them in the pool, where the
  // decode kernels read them); returns their (min, max) position.
  const auto load_tile = [&](std::int64_t b0, std::int64_t nb, bool with_values) {
    std::int32_t lo = std::numeric_limits<std::int32_t>::max(), hi = std::numeric_limits<std::int32_t>::min();
    for (std::int64_t j = 0; j < nb; ++j) {
      const std::int64_t slot = head.slot(b0 + j);
      const auto jj = static_cast<std::size_t>(j);
      if (few_rows) {
        in_pool.key[jj] = pool.key(slot);
        in_pool.value[jj] = pool.value(slot);
      } else {
        widen(pool.key(slot), w.k.row(j).data(), d);
        if (with_values) widen(pool.value(slot), w.v.row(j).data(), d);
      }
      const EntryMeta& meta = pool.meta(slot);
      w.key_pos[static_cast<std::size_t>(j)] = meta.position;
      w.key_gate[static_cast<std::size_t>(j)] = mask.gate_of(meta);
      lo = std::min(lo, meta.position);
      hi = std::max(hi, meta.position);
    }
    return std::pair{lo, hi};
  };
  // With few rows: where the tile after [b0, b0 + nb) lies, for the decode kernels to ask for ahead.
  const auto ahead = [&](std::int64_t b0, std::int64_t nb, bool with_values) {
    const std::int64_t next = std::min(Tuning::kTile, N - (b0 + nb));
    for (std::int64_t j = 0; j < next; ++j) {
      const std::int64_t slot = head.slot(b0 + nb + j);
      in_pool.next_key[static_cast<std::size_t>(j)] = pool.key(slot);
      in_pool.next_value[static_cast<std::size_t>(j)] = pool.value(slot);
    }
    const auto n = static_cast<std::size_t>(std::max<std::int64_t>(next, 0));
    return DecodeAhead<Storage>{std::span<const Storage* const>(in_pool.next_key.data(), n),
                                std::span<const Storage* const>(in_pool.next_value.data(), with_values ? n : 0)};
  };
  const auto visible = [&](std::int64_t r, std::int64_t j) {  // row r of the head, entry j of the tile
    return mask.visible(w.key_pos[static_cast<std::size_t>(j)], w.key_gate[static_cast<std::size_t>(j)], row_pos(r));
  };
  // S = Q_block · K_tileᵀ with the invisible keys at -inf. kSkip when no key of the tile is visible
  // to any row of the block (causality alone decides that), kMaskedTile when some S_rj is -inf.
  enum TileKind { kSkip, kVisibleTile, kMaskedTile };
  const auto logits = [&](std::int64_t r0, std::int64_t rb, std::int64_t b0, std::int64_t nb,
                          std::pair<std::int32_t, std::int32_t> span_pos, std::int32_t first_q, std::int32_t last_q,
                          bool with_values) {
    if (span_pos.first > last_q) return kSkip;
    auto s = w.s.topLeftCorner(rb, nb);
    if (few_rows)
      decode_logits(w.q.data(), rb, d, std::span<const Storage* const>(in_pool.key.data(), static_cast<std::size_t>(nb)),
                    w.s.data(), w.s.cols(), ahead(b0, nb, with_values));
    else
      s.noalias() = w.q.topRows(rb) * w.k.topRows(nb).transpose();
    if (mask.local == 0 && span_pos.second <= first_q) return kVisibleTile;
    for (std::int64_t r = 0; r < rb; ++r)
      for (std::int64_t j = 0; j < nb; ++j)
        if (!visible(r0 + r, j)) s(r, j) = kMasked;
    return kMaskedTile;
  };

  for (std::int64_t r0 = 0; r0 < rows; r0 += row_block) {
    const std::int64_t rb = std::min(row_block, rows - r0);
    std::int32_t first_q = std::numeric_limits<std::int32_t>::max(), last_q = std::numeric_limits<std::int32_t>::min();
    for (std::int64_t r = r0; r < r0 + rb; ++r) {
      first_q = std::min(first_q, row_pos(r));
      last_q = std::max(last_q, row_pos(r));
    }
    w.q.topRows(rb) = q_all.middleRows(r0, rb) * scale;
    w.acc.topRows(rb).setZero();
    w.m.head(rb).setConstant(kMasked);
    w.l.head(rb).setZero();
    for (std::int64_t b0 = first; b0 < N; b0 += Tuning::kTile) {
      const std::int64_t nb = std::min(Tuning::kTile, N - b0);
      const TileKind kind = logits(r0, rb, b0, nb, load_tile(b0, nb, true), first_q, last_q, true);
      if (kind == kSkip) continue;
      auto s = w.s.topLeftCorner(rb, nb);
      for (std::int64_t r = 0; r < rb; ++r) {
        const float m_new = std::max(w.m(r), s.row(r).maxCoeff());
        if (m_new == kMasked) {  // nothing visible to this row yet: P = 0, acc and l stay 0
          w.correction(r) = 1.0f;
          s.row(r).setZero();
          continue;
        }
        w.correction(r) = std::exp(w.m(r) - m_new);  // 0 on the row's first visible tile
        // One exp for every tile, so a masked tile's visible keys get the bits an unmasked tile's would.
        s.row(r) = (s.row(r).array() - m_new).exp().matrix();
        if (kind == kMaskedTile)  // a masked key adds exactly nothing (a vectorized exp(-inf) may not be 0)
          for (std::int64_t j = 0; j < nb; ++j)
            if (!visible(r0 + r, j)) s(r, j) = 0.0f;
        w.l(r) = w.l(r) * w.correction(r) + s.row(r).sum();
        w.m(r) = m_new;
      }
      w.acc.topRows(rb).array().colwise() *= w.correction.head(rb).array();
      if (few_rows)
        decode_accumulate(w.s.data(), w.s.cols(), rb, d,
                          std::span<const Storage* const>(in_pool.value.data(), static_cast<std::size_t>(nb)), w.acc.data());
      else
        w.acc.topRows(rb).noalias() += s * w.v.topRows(nb);
    }
    if (partial != nullptr) {  // one row block (the caller's check): its state, not yet divided
      std::copy_n(w.m.data(), rb, partial->m);
      std::copy_n(w.l.data(), rb, partial->l);
      Eigen::Map<RowMatrixF>(partial->acc, rb, d) = w.acc.topRows(rb);
      continue;
    }
    Eigen::Map<RowMatrixF> out_all(&out(std::int64_t{kv_head} * group, 0, 0), rows, d);
    for (std::int64_t r = 0; r < rb; ++r) {
      const float inv = w.l(r) > 0.0f ? 1.0f / w.l(r) : 0.0f;
      out_all.row(r0 + r) = w.acc.row(r) * inv;
    }
    if (key_mass.empty()) continue;
    for (std::int64_t b0 = first; b0 < N; b0 += Tuning::kTile) {  // P_rj = exp(S_rj - m_r) / l_r
      const std::int64_t nb = std::min(Tuning::kTile, N - b0);
      if (logits(r0, rb, b0, nb, load_tile(b0, nb, false), first_q, last_q, false) == kSkip) continue;
      for (std::int64_t r = 0; r < rb; ++r) {
        if (w.l(r) == 0.0f) continue;
        const float inv = 1.0f / w.l(r);
        for (std::int64_t j = 0; j < nb; ++j) {
          const float sj = w.s(r, j);
          if (sj == kMasked) continue;
          const float p = std::exp(sj - w.m(r)) * inv;
          if (std::isfinite(p)) key_mass[static_cast<std::size_t>(b0 + j)] += p;  // a logit past fp32 adds nothing
        }
      }
    }
  }
}

}  // namespace detail

template <class Storage>
void attend_tiled(const memory::EntryPool<Storage>& pool, const memory::HeadLayout& head, int kv_head, int group,
                  View<const float, 3> queries, std::span<const std::int32_t> q_pos, View<float, 3> out,
                  std::span<float> key_mass = {}, AttentionMask mask = {}) {
  detail::attend_tiled_range(pool, head, kv_head, group, queries, q_pos, out, key_mass, mask, 0, head.length, nullptr);
}

/// The most query rows (group·T) attend_tiled_partial takes: one row block of the decode kernels.
inline constexpr std::int64_t kPartialMaxRows = TiledAttentionTuning::kFewRows;

/// attend_tiled's state over the head's entries [first, last) only (0 <= first <= last <= length),
/// for group·T <= kPartialMaxRows rows: m, l and acc of row r (query head r / T of the group, token
/// r % T) into `partial`. merge_softmax_partials of the states of ranges that cover the head gives
/// attend_tiled's o. Throws kvpolicy::Error for more rows or a range outside the head.
template <class Storage>
void attend_tiled_partial(const memory::EntryPool<Storage>& pool, const memory::HeadLayout& head, int kv_head, int group,
                          View<const float, 3> queries, std::span<const std::int32_t> q_pos, std::int64_t first,
                          std::int64_t last, SoftmaxPartial partial, AttentionMask mask = {}) {
  require(std::int64_t{group} * queries.dim(1) <= kPartialMaxRows, "attend_tiled_partial: ", group * queries.dim(1),
          " query rows, more than ", kPartialMaxRows);
  require(0 <= first && first <= last && last <= head.length, "attend_tiled_partial: entries [", first, ", ", last,
          ") are not within the head's ", head.length);
  detail::attend_tiled_range(pool, head, kv_head, group, queries, q_pos, View<float, 3>{}, {}, mask, first, last, &partial);
}

/// out[rows, d] = the attention of `rows` query rows from the states of ranges that together cover
/// a head's entries once (in any grouping; the order of `parts` is the order of the sums). A row
/// that saw no key in any range gets 0, as attend_tiled gives it.
inline void merge_softmax_partials(std::span<const SoftmaxPartial> parts, std::int64_t rows, std::int64_t d, float* out) {
  using RowMatrixF = detail::RowMatrixF;
  Eigen::Map<RowMatrixF> o(out, rows, d);
  for (std::int64_t r = 0; r < rows; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    for (const SoftmaxPartial& p : parts) m = std::max(m, p.m[r]);
    if (m == -std::numeric_limits<float>::infinity()) {
      o.row(r).setZero();
      continue;
    }
    float l = 0.0f;
    o.row(r).setZero();
    for (const SoftmaxPartial& p : parts) {
      if (p.l[r] == 0.0f) continue;  // saw nothing: m = -inf, whose e^(m - M) is 0 anyway
      const float c = std::exp(p.m[r] - m);  // 1 for the range that holds the max
      l += p.l[r] * c;
      o.row(r) += Eigen::Map<const Eigen::RowVectorXf>(p.acc + r * d, d) * c;
    }
    o.row(r) *= 1.0f / l;
  }
}

// Compiling the kernel once instead of in every translation unit (it is most of a TU's compile time
// under the sanitizers): define KVPOLICY_EXTERN_TILED_ATTENTION in every TU of the program, and
// include kvpolicy/cpu/tiled_attention_instances.hpp in exactly one, built with the same flags.
#if defined(KVPOLICY_EXTERN_TILED_ATTENTION)
#define KVPOLICY_TILED_ATTENTION_INSTANCE(Storage)                                                                    \
  extern template void detail::attend_tiled_range<Storage>(                                                          \
      const memory::EntryPool<Storage>&, const memory::HeadLayout&, int, int, View<const float, 3>,                   \
      std::span<const std::int32_t>, View<float, 3>, std::span<float>, AttentionMask, std::int64_t, std::int64_t,     \
      const SoftmaxPartial*);
KVPOLICY_TILED_ATTENTION_INSTANCE(float)
KVPOLICY_TILED_ATTENTION_INSTANCE(half)
KVPOLICY_TILED_ATTENTION_INSTANCE(bfloat16)
#undef KVPOLICY_TILED_ATTENTION_INSTANCE
#endif

}  // namespace kvpolicy::cpu
