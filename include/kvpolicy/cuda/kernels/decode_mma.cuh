/// \file
/// kvpolicy/cuda/kernels/decode_mma.cuh — decode attention on tensor cores (sm_80+, fp16 or bf16 storage,
/// head_dim 64 or 128): the same partials as attention.cuh's decode_partial_kernel, for the same
/// merge pass, from a kernel built the way the flash decoders are (docs/perf.md, "Decode kernels").
///
/// - The query heads of a GQA group are the rows of one m16n8k16 product: S = Q·Kᵀ for 16 heads x
///   16 entries per warp and tile, then O += P·V. One pass over the keys serves every head of the
///   group at a few instructions per 16 entries, where the CUDA-core kernel spends one FMA per
///   element per head and a shuffle tree per logit (its ncu profile: latency-bound, 38% of issue
///   slots, 29% of DRAM bandwidth, docs/perf.md).
/// - Each warp streams its own tiles through a `stages`-deep ring in shared memory filled by
///   cp.async, so two tiles are in flight while it computes on a third; no block barrier in the
///   loop. A tile is 16 entries of one page (page sizes are multiples of 16), so its keys and
///   values are two contiguous runs, and one block-table read places it.
/// - Near fp32 precision: the query and the probabilities are each split into a 16-bit high part
///   and the rounding left over (mma.cuh, split_pack), two products each, accumulated in fp32, so
///   each operand carries about twice its type's bits. The query rows are scaled by a power of two
///   into fp16's range first, and the logits back.
/// - The rest is the CUDA-core kernel's semantics: logits in base 2, lazy rescaling by
///   DecodeTuning::rescale_slack, SPEC §3's vertical-slash mask and the causal position from
///   query_position, entries past the chunk or masked out weigh nothing (zero-filled, logit -inf).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvpolicy/cuda/kernels/decode_plan.cuh"
#include "kvpolicy/cuda/memory/views.cuh"
#include "kvpolicy/cuda/primitives/dtype.cuh"
#include "kvpolicy/cuda/primitives/mma.cuh"
#include "kvpolicy/cuda/tuning.cuh"

namespace kvpolicy::gpu::detail {

/// Byte offset of row r's 16-byte chunk c in a [rows][D] array of 16-bit elements, swizzled (chunk c
/// of row r stored at c ^ (r % 8)) so the eight rows one ldmatrix reads fall in distinct banks.
template <int D>
__device__ __forceinline__ std::uint32_t swizzled(int r, int c) {
  return static_cast<std::uint32_t>(r * D * 2 + ((c ^ (r & 7)) << 4));
}

/// grid (splits, kv_heads * ceil(group / 16), batch), DecodeMmaTuning::warps * 32 threads,
/// DecodeMmaTuning::shared_bytes<HEAD_DIM>() of dynamic shared memory. Writes the chunk's
/// (max, sum, acc) per query head (with one chunk, the answer), as decode_partial_kernel does.
template <class T, int HEAD_DIM, int PAGE_SIZE>
__global__ void __launch_bounds__(DecodeMmaTuning::warps * 32, DecodeMmaTuning::blocks_per_sm)
    decode_mma_kernel(PagedKV<T> kv, BlockTableView t, DecodeBatch a, std::int64_t chunk, int group_tiles,
                      DecodePartials parts) {
#if KVPOLICY_HAS_MMA
  using Tu = DecodeMmaTuning;
  constexpr int D = HEAD_DIM, W = Tu::warps, M = Tu::heads, TILE = Tu::tile, S = Tu::stages;
  constexpr int CHUNKS = D / 8;                    // 16-byte chunks of a row
  constexpr int ROW_BYTES = TILE * D * 2;          // a tile's keys (or values)
  constexpr int STAGE_BYTES = 2 * ROW_BYTES;
  static_assert(PAGE_SIZE % TILE == 0 && D % 16 == 0 && (TILE * CHUNKS) % 32 == 0);
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* q_hi = smem;
  unsigned char* q_lo = smem + M * D * 2;
  auto* visible_s = reinterpret_cast<std::uint32_t*>(smem + 2 * M * D * 2);  // [W][S]
  auto* row_scale_s = reinterpret_cast<float*>(visible_s + W * S);           // [M], then [M] maxima
  unsigned char* rings = smem + 2 * M * D * 2 + Tu::header_bytes;

  const int split = static_cast<int>(blockIdx.x), splits = static_cast<int>(gridDim.x);
  const int h = static_cast<int>(blockIdx.y) / group_tiles, g_tile = static_cast<int>(blockIdx.y) % group_tiles;
  const int b = static_cast<int>(blockIdx.z);
  const int group = a.q_heads / a.kv_heads;
  const int g0 = g_tile * M;
  const int gn = min(M, group - g0);
  const int seg = a.segment_base[b] + h;
  const std::int64_t n = t.length[seg];
  const std::int64_t begin = std::int64_t{split} * chunk;
  const std::int64_t end = split == splits - 1 ? n : min(n, begin + chunk);
  const float scale = rsqrtf(static_cast<float>(D)) * kLog2e;  // logits in base 2, as the CUDA-core kernel
  const std::int64_t first_head = std::int64_t{b} * a.q_heads + std::int64_t{h} * group + g0;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;

  // The query rows, scaled by a power of two 2^-k into [2^13, 2^14) (fp16 holds them whatever the
  // query's magnitude; exact, undone on the logits), split into high and low 16-bit parts. Each
  // thread holds PAIRS pairs of elements; a warp's 32 pairs of a round lie in one row, so a row's
  // largest magnitude is a warp reduction and an atomic max on its bits (non-negative floats order
  // as their bits).
  constexpr int PAIRS = M * D / 2 / (W * 32);
  static_assert((D / 2) % 32 == 0, "a warp's pairs of one round share a row");
  auto* row_most_s = reinterpret_cast<unsigned int*>(row_scale_s + M);  // [M]
  if (tid < M) row_most_s[tid] = 0u;
  __syncthreads();
  float qx[PAIRS], qy[PAIRS];
#pragma unroll
  for (int j = 0; j < PAIRS; ++j) {
    const int i = j * W * 32 + tid, r = i / (D / 2), c = (i % (D / 2)) * 2;
    qx[j] = r < gn ? a.queries[(first_head + r) * D + c] * scale : 0.0f;
    qy[j] = r < gn ? a.queries[(first_head + r) * D + c + 1] * scale : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < PAIRS; ++j) {
    float most = fmaxf(fabsf(qx[j]), fabsf(qy[j]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, o));
    if (lane == 0) atomicMax(&row_most_s[(j * W * 32 + tid) / (D / 2)], __float_as_uint(most));
  }
  __syncthreads();
  if (tid < M) {
    const float most = __uint_as_float(row_most_s[tid]);
    const int k = most > 0.0f && isfinite(most) ? max(-100, min(100, ilogbf(most) - 13)) : 0;
    row_scale_s[tid] = ldexpf(1.0f, k);
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < PAIRS; ++j) {
    const int i = j * W * 32 + tid, r = i / (D / 2), c = (i % (D / 2)) * 2;
    const float unscale = 1.0f / row_scale_s[r];
    std::uint32_t hi, lo;
    split_pack<T>(qx[j] * unscale, qy[j] * unscale, hi, lo);
    const std::uint32_t at = swizzled<D>(r, c / 8) + (c % 8) * 2;
    *reinterpret_cast<std::uint32_t*>(q_hi + at) = hi;
    *reinterpret_cast<std::uint32_t*>(q_lo + at) = lo;
  }
  __syncthreads();
  // A fragments of Q for every 16 columns: matrix j covers rows 8 (j % 2).., columns 8 (j / 2)..
  std::uint32_t qa_hi[D / 16][4], qa_lo[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const std::uint32_t at = swizzled<D>(((lane / 8) % 2) * 8 + lane % 8, 2 * kk + lane / 16);
    ldmatrix_x4<false>(qa_hi[kk], shared_address(q_hi + at));
    ldmatrix_x4<false>(qa_lo[kk], shared_address(q_lo + at));
  }
  const int r0 = lane / 4;  // this lane's rows of S and O: r0 and r0 + 8
  const float row_mul0 = row_scale_s[r0], row_mul1 = row_scale_s[r0 + 8];

  const std::int64_t tiles = end > begin ? (end - begin + TILE - 1) / TILE : 0;
  const int my_tiles = tiles > warp ? static_cast<int>((tiles - warp + W - 1) / W) : 0;
  unsigned char* ring = rings + warp * S * STAGE_BYTES;
  const bool causal = a.query_position != nullptr;
  const std::int32_t q_pos = causal ? a.query_position[b] : 0;
  auto first_entry = [&](int j) { return begin + (std::int64_t{warp} + std::int64_t{W} * j) * TILE; };
  auto page_of = [&](int j) -> std::int64_t {
    return j < my_tiles ? t.table[std::int64_t{seg} * t.max_pages + first_entry(j) / PAGE_SIZE] : 0;
  };
  // Tile j into ring stage `stage`: its visible entries' keys and values, zeros for the others.
  auto issue = [&](int j, int stage, std::int64_t page) {
    if (j >= my_tiles) return;
    const std::int64_t e0 = first_entry(j);
    const std::int64_t slot0 = page * PAGE_SIZE + e0 % PAGE_SIZE;
    const int mine = lane % TILE;  // the entry this lane judges
    bool visible = e0 + mine < end;
    if (visible && causal) visible = a.mask.visible(kv.position[slot0 + mine], kv.write_score[slot0 + mine], q_pos);
    const std::uint32_t bits = __ballot_sync(0xffffffffu, visible) & ((1u << TILE) - 1);
    if (lane == 0) visible_s[warp * S + stage] = bits;
    const std::uint32_t dst = shared_address(ring + stage * STAGE_BYTES);
    const T* k_row = kv.keys + slot0 * D;
    const T* v_row = kv.values + slot0 * D;
#pragma unroll
    for (int i = 0; i < TILE * CHUNKS / 32; ++i) {
      const int e = (i * 32 + lane) / CHUNKS, c = (i * 32 + lane) % CHUNKS;
      const bool read = (bits >> e) & 1u;
      const std::uint32_t at = swizzled<D>(e, c);
      cp_async_16(dst + at, read ? k_row + e * D + c * 8 : kv.keys, read ? 16 : 0);
      cp_async_16(dst + ROW_BYTES + at, read ? v_row + e * D + c * 8 : kv.values, read ? 16 : 0);
    }
  };

  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  // the ring's first S - 1 tiles; then each step issues tile it + S - 1 (its page read a step ahead)
  std::int64_t page_next = page_of(0);
#pragma unroll
  for (int j = 0; j < S - 1; ++j) {
    const std::int64_t page = page_next;
    page_next = page_of(j + 1);
    issue(j, j, page);
    cp_async_commit();
  }
  for (int it = 0; it < my_tiles; ++it) {
    const std::int64_t page = page_next;
    page_next = page_of(it + S);
    issue(it + S - 1, (it + S - 1) % S, page);
    cp_async_commit();  // a group every step, empty or not: the wait below counts them
    cp_async_wait<S - 1>();
    __syncwarp();
    const int stage = it % S;
    const unsigned char* keys_s = ring + stage * STAGE_BYTES;
    const unsigned char* values_s = keys_s + ROW_BYTES;
    const std::uint32_t bits = visible_s[warp * S + stage];

    // S = Q·Kᵀ: n-tile 0 holds entries 0..7, n-tile 1 entries 8..15; high and low parts of Q in
    // separate accumulators (two shorter dependency chains)
    float s_hi[2][4] = {}, s_lo[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t kb[4];  // matrix j: entries 8 (j / 2).., columns 8 (2 kk + j % 2)..
      ldmatrix_x4<false>(kb, shared_address(keys_s + swizzled<D>((lane / 16) * 8 + lane % 8, 2 * kk + (lane / 8) % 2)));
      mma_16816<T>(s_hi[0], qa_hi[kk], kb[0], kb[1]);
      mma_16816<T>(s_hi[1], qa_hi[kk], kb[2], kb[3]);
      mma_16816<T>(s_lo[0], qa_lo[kk], kb[0], kb[1]);
      mma_16816<T>(s_lo[1], qa_lo[kk], kb[2], kb[3]);
    }
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int entry = nt * 8 + 2 * (lane % 4) + (j & 1);
        const float v = (s_hi[nt][j] + s_lo[nt][j]) * (j < 2 ? row_mul0 : row_mul1);
        s[nt][j] = (bits >> entry) & 1u ? v : -INFINITY;
      }
    // online softmax per row; the four lanes of a quad hold a row's 16 entries
    float t0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    float t1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
    t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 1));
    t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 2));
    t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 1));
    t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 2));
    if (t0 > m0 + DecodeTuning::rescale_slack) {  // the base moves (always on a row's first visible entry)
      const float corr = exp2f(m0 - t0);           // 0 when m0 = -inf
      l0 *= corr;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) o[nt][0] *= corr, o[nt][1] *= corr;
      m0 = t0;
    }
    if (t1 > m1 + DecodeTuning::rescale_slack) {
      const float corr = exp2f(m1 - t1);
      l1 *= corr;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt) o[nt][2] *= corr, o[nt][3] *= corr;
      m1 = t1;
    }
    // a row that has seen no visible entry has m = -inf and only -inf logits: p = 0
    const float base0 = m0 == -INFINITY ? 0.0f : m0, base1 = m1 == -INFINITY ? 0.0f : m1;
    float p[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) p[nt][j] = exp2f(s[nt][j] - (j < 2 ? base0 : base1));  // <= 2^rescale_slack
    l0 += (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);
    l1 += (p[0][2] + p[0][3]) + (p[1][2] + p[1][3]);
    // P as the A fragment of P·V: S's accumulator layout is the A layout of the next product
    std::uint32_t pa_hi[4], pa_lo[4];
    split_pack<T>(p[0][0], p[0][1], pa_hi[0], pa_lo[0]);
    split_pack<T>(p[0][2], p[0][3], pa_hi[1], pa_lo[1]);
    split_pack<T>(p[1][0], p[1][1], pa_hi[2], pa_lo[2]);
    split_pack<T>(p[1][2], p[1][3], pa_hi[3], pa_lo[3]);
    // O += P·V, 16 columns of V per ldmatrix: matrix j covers entries 8 (j % 2).., columns 8 (2 nd + j / 2)..
#pragma unroll
    for (int nd = 0; nd < D / 16; ++nd) {
      std::uint32_t vb[4];
      ldmatrix_x4<true>(vb, shared_address(values_s + swizzled<D>(((lane / 8) % 2) * 8 + lane % 8, 2 * nd + lane / 16)));
      mma_16816<T>(o[2 * nd], pa_hi, vb[0], vb[1]);
      mma_16816<T>(o[2 * nd + 1], pa_hi, vb[2], vb[3]);
      mma_16816<T>(o[2 * nd], pa_lo, vb[0], vb[1]);
      mma_16816<T>(o[2 * nd + 1], pa_lo, vb[2], vb[3]);
    }
    __syncwarp();  // every lane is done with this stage before the next step refills it
  }
  cp_async_wait<0>();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

  __syncthreads();  // every warp is done with its ring: the rings become the warps' partials
  auto* acc_w = reinterpret_cast<float*>(rings);  // [W][M][D]
  float* m_w = acc_w + W * M * D;                  // [W][M]
  float* l_w = m_w + W * M;                        // [W][M]
  if (lane % 4 == 0) {
    m_w[warp * M + r0] = m0;
    m_w[warp * M + r0 + 8] = m1;
    l_w[warp * M + r0] = l0;
    l_w[warp * M + r0 + 8] = l1;
  }
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    const int c = nt * 8 + 2 * (lane % 4);
    acc_w[(warp * M + r0) * D + c] = o[nt][0];
    acc_w[(warp * M + r0) * D + c + 1] = o[nt][1];
    acc_w[(warp * M + r0 + 8) * D + c] = o[nt][2];
    acc_w[(warp * M + r0 + 8) * D + c + 1] = o[nt][3];
  }
  __syncthreads();
  write_block_partial<W, M, D>(m_w, l_w, acc_w, gn, first_head, split, splits, parts);
#else
  __trap();
#endif
}

}  // namespace kvpolicy::gpu::detail
