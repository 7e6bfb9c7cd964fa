/// \file
/// kvpolicy/cpu/attention.hpp — attention over a cache on the CPU (SPEC §6):
/// o = softmax(q K^T / sqrt(d)) V over exactly the cached entries a query may see (key position <=
/// query position: causal inside a prefill chunk, everything for a decode token), G = Hq / Hkv query
/// heads per kv head, fp32 accumulation whatever the storage dtype.
///   attend_dense  — the reference: two-pass softmax over dense fp32 K/V.
///   attend_paged  — the ragged paged path: one streaming pass over a kv head's pages shared by the
///                   G query heads of its group, online softmax (the CPU twin of the decode kernel).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvpolicy/core/dtype.hpp"
#include "kvpolicy/core/mask.hpp"
#include "kvpolicy/core/view.hpp"
#include "kvpolicy/memory/pool.hpp"

namespace kvpolicy::cpu {

/// q [T, d], keys/values [N, d], key_pos [N], q_pos [T] -> out [T, d]. A query that sees no key
/// gets zeros.
inline void attend_dense(View<const float, 2> q, View<const float, 2> keys, View<const float, 2> values,
                         std::span<const std::int32_t> key_pos, std::span<const std::int32_t> q_pos,
                         View<float, 2> out) {
  const std::int64_t T = q.dim(0), N = keys.dim(0), d = q.dim(1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> logits(static_cast<std::size_t>(N));
  for (std::int64_t t = 0; t < T; ++t) {
    float m = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = 0; j < N; ++j) {
      if (key_pos[j] > q_pos[t]) continue;
      float s = 0.0f;
      for (std::int64_t c = 0; c < d; ++c) s += q(t, c) * keys(j, c);
      logits[j] = s * scale;
      m = std::max(m, logits[j]);
    }
    for (std::int64_t c = 0; c < d; ++c) out(t, c) = 0.0f;
    if (m == -std::numeric_limits<float>::infinity()) continue;
    float denom = 0.0f;
    for (std::int64_t j = 0; j < N; ++j) {
      if (key_pos[j] > q_pos[t]) continue;
      const float w = std::exp(logits[j] - m);
      denom += w;
      for (std::int64_t c = 0; c < d; ++c) out(t, c) += w * values(j, c);
    }
    for (std::int64_t c = 0; c < d; ++c) out(t, c) /= denom;
  }
}

/// One kv head of the cache against the G query heads of its group: queries [Hq, T, d] (the
/// layer's), out the same shape; only query heads kv_head*G .. kv_head*G + G-1 are read and written.
/// Entries stream in blocks; each block costs one rescale of the running (max, sum, acc) state.
/// With key_mass (one float per entry of the head), a second pass adds to key_mass[i] the attention
/// probability entry i received from every (query head of the group, query token) row — the H2O
/// accumulation of SPEC §5, with no attention matrix: only the rows' final (max, sum) are kept.
/// `mask` adds WG-KV's vertical-slash rule to causality (SPEC §3).
template <class Storage>
void attend_paged(const memory::EntryPool<Storage>& pool, const memory::HeadLayout& head, int kv_head, int group,
                  View<const float, 3> queries, std::span<const std::int32_t> q_pos, View<float, 3> out,
                  std::span<float> key_mass = {}, AttentionMask mask = {}) {
  constexpr std::int64_t kBlock = 32;
  const std::int64_t T = queries.dim(1), d = queries.dim(2);
  const std::int64_t rows = std::int64_t{group} * T;  // (query head in group, query token)
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  std::vector<float> m(static_cast<std::size_t>(rows), kMasked);
  std::vector<float> l(static_cast<std::size_t>(rows), 0.0f);
  std::vector<float> acc(static_cast<std::size_t>(rows * d), 0.0f);
  std::vector<float> kt(static_cast<std::size_t>(d * kBlock)), vf(static_cast<std::size_t>(kBlock * d));
  std::vector<std::int32_t> kpos(kBlock);
  std::vector<float> kgate(static_cast<std::size_t>(kBlock)), s(static_cast<std::size_t>(kBlock));

  // Widens block [b0, b0 + nb) once, shared by the whole group (keys transposed: the logits loop
  // runs along j).
  const auto widen = [&](std::int64_t b0, std::int64_t nb, bool with_values) {
    for (std::int64_t j = 0; j < nb; ++j) {
      const std::int64_t slot = head.slot(b0 + j);
      const Storage* k = pool.key(slot);
      for (std::int64_t c = 0; c < d; ++c) kt[c * kBlock + j] = to_float(k[c]);
      if (with_values) {
        const Storage* v = pool.value(slot);
        for (std::int64_t c = 0; c < d; ++c) vf[j * d + c] = to_float(v[c]);
      }
      kpos[j] = pool.meta(slot).position;
      kgate[static_cast<std::size_t>(j)] = mask.gate_of(pool.meta(slot));
    }
  };
  // s[j] = q . k_j * scale for the row's visible keys, kMasked for the others; returns the max.
  const auto logits = [&](std::int64_t r, std::int64_t nb) {
    const std::int64_t g = r / T, t = r % T;
    const float* qv = &queries(std::int64_t{kv_head} * group + g, t, 0);
    std::fill(s.begin(), s.end(), 0.0f);
    for (std::int64_t c = 0; c < d; ++c) {  // accumulated along c so the j loop vectorizes
      const float qc = qv[c];
      const float* kc = &kt[c * kBlock];
      for (std::int64_t j = 0; j < kBlock; ++j) s[j] += qc * kc[j];
    }
    float block_max = kMasked;
    for (std::int64_t j = 0; j < nb; ++j) {
      s[j] = mask.visible(kpos[j], kgate[static_cast<std::size_t>(j)], q_pos[t]) ? s[j] * scale : kMasked;
      block_max = std::max(block_max, s[j]);
    }
    return block_max;
  };

  for (std::int64_t b0 = 0; b0 < head.length; b0 += kBlock) {
    const std::int64_t nb = std::min(kBlock, head.length - b0);
    widen(b0, nb, true);
    for (std::int64_t r = 0; r < rows; ++r) {
      const float block_max = logits(r, nb);
      if (block_max == kMasked) continue;
      const float m_new = std::max(m[r], block_max);
      const float correction = std::exp(m[r] - m_new);  // 0 on the first visible block
      float* a = &acc[r * d];
      l[r] *= correction;
      for (std::int64_t c = 0; c < d; ++c) a[c] *= correction;
      for (std::int64_t j = 0; j < nb; ++j) {
        if (s[j] == kMasked) continue;
        const float w = std::exp(s[j] - m_new);
        l[r] += w;
        for (std::int64_t c = 0; c < d; ++c) a[c] += w * vf[j * d + c];
      }
      m[r] = m_new;
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t g = r / T, t = r % T;
    float* o = &out(std::int64_t{kv_head} * group + g, t, 0);
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (std::int64_t c = 0; c < d; ++c) o[c] = acc[r * d + c] * inv;
  }
  if (key_mass.empty()) return;
  for (std::int64_t b0 = 0; b0 < head.length; b0 += kBlock) {  // p_rj = exp(s_rj - m_r) / l_r
    const std::int64_t nb = std::min(kBlock, head.length - b0);
    widen(b0, nb, false);
    for (std::int64_t r = 0; r < rows; ++r) {
      if (l[r] == 0.0f || logits(r, nb) == kMasked) continue;
      const float inv = 1.0f / l[r];
      for (std::int64_t j = 0; j < nb; ++j) {
        if (s[j] == kMasked) continue;
        const float p = std::exp(s[j] - m[r]) * inv;
        if (std::isfinite(p)) key_mass[static_cast<std::size_t>(b0 + j)] += p;  // a logit past fp32 adds nothing
      }
    }
  }
}

}  // namespace kvpolicy::cpu
