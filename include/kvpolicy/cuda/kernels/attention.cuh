/// \file
/// kvpolicy/cuda/kernels/attention.cuh — paged ragged decode attention (SPEC §6; docs/architecture.md, "Device path"), the
/// CUDA twin of cpu::attend_paged for one decode token per sequence:
///   o = softmax(q K^T / sqrt(d)) V over every entry of the head (a decode query sees them all).
/// kv heads are folded into the grid with the batch; the G query heads of a group share one pass
/// over their kv head's pages (GQA); a long head is split along the cache into chunks whose partial
/// (max, sum, acc) a merge pass combines (flash-decoding); online softmax in fp32 whatever the
/// storage dtype. A group of EntryLanes lanes reads one entry, each lane 16 bytes of its key and of
/// its value in one load; a warp holds 32 / lanes entries at once and loads its next ones while it
/// computes on these (decode attention is bound by memory: every byte is read once). Logits are in
/// base 2 (log2 e folded into the query's scale, so each probability is one exp2), and a running
/// max moves, rescaling the accumulator, only when a logit passes it by more than DecodeTuning::rescale_slack
/// (FlashAttention-4's lazy rescaling): every merge below works from whatever base a partial
/// carries, so the result is the same softmax.
/// Optionally (H2O, SPEC §5) a third pass adds each entry's attention probability to the pool's
/// attention_mass, from the final (max, sum) of every query head: no attention matrix is formed.
/// The chunks' partials come from one of two kernels (DecodeBatch::kernel): the CUDA-core one below,
/// for every dtype and head_dim, or the tensor-core one (decode_mma.cuh) where it applies; the merge
/// pass and the mass pass are the same for both.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kvpolicy/core/mask.hpp"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/kernels/decode_mma.cuh"
#include "kvpolicy/cuda/kernels/decode_plan.cuh"
#include "kvpolicy/cuda/primitives/dispatch.cuh"
#include "kvpolicy/cuda/primitives/dtype.cuh"
#include "kvpolicy/cuda/memory/views.cuh"

namespace kvpolicy::gpu {

namespace detail {

/// How the lanes of a warp share entries: each lane of a group of `lanes` reads `elems` contiguous
/// elements (16 bytes, or 32 for fp32 at HEAD_DIM 256) of one entry's key and value, so a warp
/// reads 32 / lanes entries at once.
template <class T, int HEAD_DIM>
struct EntryLanes {
  static constexpr int lanes = HEAD_DIM * int(sizeof(T)) / 16 < 32 ? HEAD_DIM * int(sizeof(T)) / 16 : 32;
  static constexpr int elems = HEAD_DIM / lanes;
  static constexpr int per_warp = 32 / lanes;
  static_assert(lanes >= 1 && 32 % lanes == 0 && elems * lanes == HEAD_DIM && elems * sizeof(T) % 16 == 0);
};

/// One lane's `ELEMS` elements of a key or value row, in 16-byte loads, widened to fp32.
template <class T, int ELEMS>
__device__ __forceinline__ void load_row(const T* p, float (&x)[ELEMS]) {
  constexpr int kLoads = ELEMS * int(sizeof(T)) / 16;
  uint4 raw[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) raw[i] = __ldg(reinterpret_cast<const uint4*>(p) + i);
  const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int i = 0; i < ELEMS; ++i) x[i] = to_float(e[i]);
}

/// The logit of one entry for one query head, in every lane of the entry's group: the lanes'
/// partial dot products of the pre-scaled query (q_lane = its elements lane * ELEMS ..) with the
/// key's ELEMS elements, reduced across the `LANES` lanes (all 32 lanes of the warp execute it).
/// The partial pass and the mass pass both call it, so their logits agree bit for bit.
template <int LANES, int ELEMS>
__device__ __forceinline__ float entry_logit(const float* q_lane, const float (&k)[ELEMS]) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < ELEMS; ++i) s += q_lane[i] * k[i];
#pragma unroll
  for (int o = LANES / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

/// The entry a lane group reads: its slot, or -1 past the chunk's end or masked out (past the
/// query's position, or by SPEC §3's vertical-slash rule); its key and value rows when it is read.
template <class T, int HEAD_DIM, int PAGE_SIZE, int ELEMS>
__device__ __forceinline__ std::int64_t fetch_entry(const PagedKV<T>& kv, const BlockTableView& t, const DecodeBatch& a,
                                                    int seg, std::int64_t e, std::int64_t end, std::int32_t q_pos,
                                                    int sub_lane, float (&k)[ELEMS], float (&v)[ELEMS],
                                                    bool with_values) {
  std::int64_t slot = -1;
  if (e < end) {
    slot = t.slot(seg, e, PAGE_SIZE);
    if (a.query_position != nullptr && !a.mask.visible(kv.position[slot], kv.write_score[slot], q_pos)) slot = -1;
  }
  if (slot >= 0) {
    load_row<T, ELEMS>(kv.keys + slot * HEAD_DIM + sub_lane * ELEMS, k);
    if (with_values) load_row<T, ELEMS>(kv.values + slot * HEAD_DIM + sub_lane * ELEMS, v);
  } else {
#pragma unroll
    for (int i = 0; i < ELEMS; ++i) k[i] = v[i] = 0.0f;
  }
  return slot;
}

/// grid (splits, kv_heads * group_tiles, batch). Writes the chunk's (max, sum, acc) per query head
/// (with one chunk, the answer: write_block_partial).
template <class T, int HEAD_DIM, int PAGE_SIZE>
__global__ void __launch_bounds__(DecodeTuning::warps * 32, DecodeTuning::partial_blocks_per_sm)
    decode_partial_kernel(PagedKV<T> kv, BlockTableView t, DecodeBatch a, std::int64_t chunk, int group_tiles,
                          DecodePartials parts) {
  using Lanes = EntryLanes<T, HEAD_DIM>;
  constexpr int LANES = Lanes::lanes, ELEMS = Lanes::elems, PER_WARP = Lanes::per_warp;
  __shared__ float q_s[DecodeTuning::group_tile][HEAD_DIM];
  __shared__ float m_w[DecodeTuning::warps][DecodeTuning::group_tile], l_w[DecodeTuning::warps][DecodeTuning::group_tile];
  __shared__ float acc_w[DecodeTuning::warps][DecodeTuning::group_tile][HEAD_DIM];

  const int split = static_cast<int>(blockIdx.x), splits = static_cast<int>(gridDim.x);
  const int h = static_cast<int>(blockIdx.y) / group_tiles, tile = static_cast<int>(blockIdx.y) % group_tiles;
  const int b = static_cast<int>(blockIdx.z);
  const int group = a.q_heads / a.kv_heads;
  const int g0 = tile * DecodeTuning::group_tile;
  const int gn = min(DecodeTuning::group_tile, group - g0);
  const int seg = a.segment_base[b] + h;
  const std::int64_t n = t.length[seg];
  const std::int64_t begin = std::int64_t{split} * chunk;
  const std::int64_t end = split == splits - 1 ? n : min(n, begin + chunk);
  const float scale = rsqrtf(static_cast<float>(HEAD_DIM)) * kLog2e;  // logits in base 2

  for (int i = threadIdx.x; i < DecodeTuning::group_tile * HEAD_DIM; i += blockDim.x) {
    const int g = i / HEAD_DIM, c = i % HEAD_DIM;
    q_s[g][c] = g < gn ? a.queries[(std::int64_t{b} * a.q_heads + h * group + g0 + g) * HEAD_DIM + c] * scale : 0.0f;
  }
  __syncthreads();

  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int sub = lane / LANES, sub_lane = lane % LANES;  // which entry of the warp's, which part of it
  float m[DecodeTuning::group_tile], l[DecodeTuning::group_tile], acc[DecodeTuning::group_tile][ELEMS];
#pragma unroll
  for (int g = 0; g < DecodeTuning::group_tile; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < ELEMS; ++i) acc[g][i] = 0.0f;
  }
  const std::int32_t q_pos = a.query_position != nullptr ? a.query_position[b] : 0;
  constexpr int kStride = DecodeTuning::warps * PER_WARP;  // entries the block reads per round
  float k[ELEMS], v[ELEMS];
  std::int64_t e = begin + warp * PER_WARP + sub;
  std::int64_t slot = fetch_entry<T, HEAD_DIM, PAGE_SIZE, ELEMS>(kv, t, a, seg, e, end, q_pos, sub_lane, k, v, true);
  // Every lane runs every round (the logit's shuffles span the warp); a group whose entry is past
  // the end or masked out computes on zeros and changes nothing.
  for (std::int64_t round = begin + warp * PER_WARP; round < end; round += kStride) {
    float k_next[ELEMS], v_next[ELEMS];
    const std::int64_t slot_next = fetch_entry<T, HEAD_DIM, PAGE_SIZE, ELEMS>(kv, t, a, seg, e + kStride, end, q_pos,
                                                                              sub_lane, k_next, v_next, true);
#pragma unroll
    for (int g = 0; g < DecodeTuning::group_tile; ++g) {
      if (g >= gn) break;
      const float s = entry_logit<LANES, ELEMS>(&q_s[g][sub_lane * ELEMS], k);
      if (slot < 0) continue;
      if (s > m[g] + DecodeTuning::rescale_slack) {  // the base moves: always on the first entry (m = -inf)
        const float corr = exp2f(m[g] - s);  // 0 when m = -inf
        l[g] *= corr;
#pragma unroll
        for (int i = 0; i < ELEMS; ++i) acc[g][i] *= corr;
        m[g] = s;
      }
      const float p = exp2f(s - m[g]);  // <= 2^DecodeTuning::rescale_slack
      l[g] += p;
#pragma unroll
      for (int i = 0; i < ELEMS; ++i) acc[g][i] += p * v[i];
    }
#pragma unroll
    for (int i = 0; i < ELEMS; ++i) {
      k[i] = k_next[i];
      v[i] = v_next[i];
    }
    slot = slot_next;
    e += kStride;
  }
  // combine the warp's lane groups (lane, lane ^ LANES, ...: the same elements of other entries)
#pragma unroll
  for (int o = LANES; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < DecodeTuning::group_tile; ++g) {
      const float m_o = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float l_o = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float mx = fmaxf(m[g], m_o);
      const float f = mx == -INFINITY ? 0.0f : exp2f(m[g] - mx);
      const float f_o = mx == -INFINITY ? 0.0f : exp2f(m_o - mx);
      l[g] = l[g] * f + l_o * f_o;
#pragma unroll
      for (int i = 0; i < ELEMS; ++i) acc[g][i] = acc[g][i] * f + __shfl_xor_sync(0xffffffffu, acc[g][i], o) * f_o;
      m[g] = mx;
    }
  }
  if (sub == 0) {
#pragma unroll
    for (int g = 0; g < DecodeTuning::group_tile; ++g) {
      if (lane == 0) {
        m_w[warp][g] = m[g];
        l_w[warp][g] = l[g];
      }
#pragma unroll
      for (int i = 0; i < ELEMS; ++i) acc_w[warp][g][sub_lane * ELEMS + i] = acc[g][i];
    }
  }
  __syncthreads();
  write_block_partial<DecodeTuning::warps, DecodeTuning::group_tile, HEAD_DIM>(
      &m_w[0][0], &l_w[0][0], &acc_w[0][0][0], gn, std::int64_t{b} * a.q_heads + h * group + g0, split, splits, parts);
}

/// grid (batch * Hq): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s (bases in log2 units);
/// the query head's final (base M, sum) go to final_max/final_sum for the mass pass. Launched when
/// a head has more than one chunk.
template <int HEAD_DIM>
__global__ void decode_merge_kernel(int splits, DecodePartials p) {
  const std::int64_t qh = blockIdx.x;
  const auto m = [&](int s) { return p.part_max[qh * splits + s]; };
  const float mx = largest_base(splits, m);
  for (int c = threadIdx.x; c < HEAD_DIM; c += blockDim.x) {
    float sum, out;
    merge_partials(mx, splits, m, [&](int s) { return p.part_sum[qh * splits + s]; },
                   [&](int s) { return p.part_acc[(qh * splits + s) * HEAD_DIM + c]; }, sum, out);
    write_answer<HEAD_DIM>(p, qh, c, mx, sum, out);
  }
}

/// Dynamic shared memory of decode_mass_kernel: the group's scaled queries, then per query head its
/// final max and 1 / sum.
inline std::size_t decode_mass_shared_bytes(int group, int head_dim) {
  return (std::size_t(group) * head_dim + 2 * std::size_t(group)) * sizeof(float);
}

/// grid (splits, kv_heads, batch), the partial pass's chunks: H2O's mass (SPEC §5). The lanes share
/// entries as in decode_partial_kernel, with the same logit (entry_logit); p = 2^(s - M) / sum of
/// each query head of the group, summed over them and added to the entry's attention_mass by the
/// one lane group that owns the entry.
template <class T, int HEAD_DIM, int PAGE_SIZE>
__global__ void __launch_bounds__(DecodeTuning::warps * 32)
    decode_mass_kernel(PagedKV<T> kv, BlockTableView t, DecodeBatch a, std::int64_t chunk, const float* final_max,
                       const float* final_sum) {
  using Lanes = EntryLanes<T, HEAD_DIM>;
  constexpr int LANES = Lanes::lanes, ELEMS = Lanes::elems, PER_WARP = Lanes::per_warp;
  extern __shared__ float mass_smem[];
  const int group = a.q_heads / a.kv_heads;
  float* q_s = mass_smem;             // [group][HEAD_DIM]
  float* m_s = q_s + group * HEAD_DIM;  // [group]
  float* inv_s = m_s + group;          // [group]; 0 for a query head that saw no entry
  const int split = static_cast<int>(blockIdx.x), splits = static_cast<int>(gridDim.x);
  const int h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const int seg = a.segment_base[b] + h;
  const std::int64_t n = t.length[seg];
  const std::int64_t begin = std::int64_t{split} * chunk;
  const std::int64_t end = split == splits - 1 ? n : min(n, begin + chunk);
  const float scale = rsqrtf(static_cast<float>(HEAD_DIM)) * kLog2e;  // as the partial pass: base 2
  const std::int64_t q0 = std::int64_t{b} * a.q_heads + std::int64_t{h} * group;  // the group's first query head
  for (int i = threadIdx.x; i < group * HEAD_DIM; i += blockDim.x) q_s[i] = a.queries[q0 * HEAD_DIM + i] * scale;
  for (int g = threadIdx.x; g < group; g += blockDim.x) {
    m_s[g] = final_max[q0 + g];
    const float sum = final_sum[q0 + g];
    inv_s[g] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  __syncthreads();

  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int sub = lane / LANES, sub_lane = lane % LANES;
  const std::int32_t q_pos = a.query_position != nullptr ? a.query_position[b] : 0;
  constexpr int kStride = DecodeTuning::warps * PER_WARP;
  for (std::int64_t round = begin + warp * PER_WARP; round < end; round += kStride) {
    float k[ELEMS], unused[ELEMS];
    const std::int64_t slot = fetch_entry<T, HEAD_DIM, PAGE_SIZE, ELEMS>(kv, t, a, seg, round + sub, end, q_pos,
                                                                         sub_lane, k, unused, false);
    float mass = 0.0f;
    for (int g = 0; g < group; ++g) {
      if (inv_s[g] == 0.0f) continue;  // the same for the whole warp
      const float s = entry_logit<LANES, ELEMS>(&q_s[g * HEAD_DIM + sub_lane * ELEMS], k);
      const float p = exp2f(s - m_s[g]) * inv_s[g];
      if (isfinite(p)) mass += p;
    }
    // one lane group per entry; atomic should a batch repeat a segment
    if (sub_lane == 0 && slot >= 0) atomicAdd(&kv.fields[Field::attention_mass][slot], mass);
  }
}

/// Why the tensor-core kernel does not apply to this call (nullptr: it does), for
/// DecodeKernel::automatic's choice and DecodeKernel::tensor_cores's error.
template <class T>
const char* why_not_tensor_cores(const DecodeBatch& a, int head_dim) {
  if constexpr (std::is_same_v<T, float>) return "fp32 storage has no 16-bit tensor-core product";
  if (head_dim != 64 && head_dim != 128) return "it serves head_dim 64 and 128";
  if (a.accumulate_mass) return "H2O's mass is the CUDA-core kernel's third pass";
  int device = 0, major = 0;
  KVPOLICY_CUDA_CHECK(cudaGetDevice(&device), "querying the current device");
  KVPOLICY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "device ", device);
  if (major < 8) return "the device's compute capability is below 8.0 (no cp.async, no m16n8k16)";
  if constexpr (!std::is_same_v<T, float>) {
    // the code the device runs was built for sm_80+ (not JIT-compiled from an older target's PTX,
    // where the kernel's body is a trap)
    cudaFuncAttributes f{};
    KVPOLICY_CUDA_CHECK(cudaFuncGetAttributes(&f, decode_mma_kernel<T, 64, 16>), "decode_mma_kernel's attributes");
    if (f.ptxVersion < 80) return "this build has no sm_80+ code for it (CMAKE_CUDA_ARCHITECTURES)";
  }
  return nullptr;
}

inline int sm_count_of_current_device() {
  int device = 0, sms = 0;
  KVPOLICY_CUDA_CHECK(cudaGetDevice(&device), "querying the current device");
  KVPOLICY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "device ", device);
  return sms;
}

}  // namespace detail

inline void validate_decode(const DecodeBatch& a, std::int64_t max_length, int page_size, const char* who) {
  require(a.batch >= 0, who, ": batch = ", a.batch, " must be >= 0");
  require(a.kv_heads >= 1 && a.q_heads >= a.kv_heads && a.q_heads % a.kv_heads == 0, who, ": q_heads = ", a.q_heads,
          " must be a positive multiple of kv_heads = ", a.kv_heads);
  require(max_length >= 0, who, ": max_length = ", max_length, " must be >= 0");
  require(a.splits >= 0 && a.splits <= 1024, who, ": splits = ", a.splits, " must be in [0, 1024] (0: the plan's)");
  dispatch_page_size(page_size, who, [](auto) {});
}

/// Workspace for decode_attention with these shapes: the partials of every split.
/// max_length (the longest head, or a bound such as M + B) only balances the split; any length is
/// attended. sm_count: the device's multiprocessors (0: ask the current device).
inline std::size_t decode_attention_workspace_bytes(const DecodeBatch& a, std::int64_t max_length, int page_size,
                                                    int sm_count = 0) {
  validate_decode(a, max_length, page_size, "gpu::decode_attention_workspace_bytes");
  if (sm_count <= 0) sm_count = detail::sm_count_of_current_device();
  const detail::DecodePlan p = detail::plan_decode(a, max_length, page_size, sm_count);
  WorkspaceLayout layout;
  const std::int64_t rows = std::int64_t{a.batch} * a.q_heads * p.splits;
  layout.take<float>(nullptr, rows);
  layout.take<float>(nullptr, rows);
  layout.take<float>(nullptr, rows * 256);  // the largest HEAD_DIM
  layout.take<float>(nullptr, std::int64_t{a.batch} * a.q_heads);  // final max and sum, per query head
  layout.take<float>(nullptr, std::int64_t{a.batch} * a.q_heads);
  return layout.bytes();
}

/// Decode attention of one layer over the paged cache. Two-phase: with workspace == nullptr sets
/// workspace_bytes and returns. Asynchronous on `stream`; no allocation. Throws for a head_dim other
/// than 64, 128 or 256, a page_size other than 16, 32 or 64, Hq not a multiple of Hkv, splits outside
/// [0, 1024], K/V not 16-byte aligned, a mask without query_position or with gate_field =
/// GateField::gate, accumulate_mass without an attention_mass column, and kernel = tensor_cores where
/// it does not apply (naming why: it also needs a build with sm_80+ code). Both kernels give the same
/// softmax within the dtype's tolerance (docs/perf.md, "Decode kernels").
template <class T>
void decode_attention(void* workspace, std::size_t& workspace_bytes, const PagedKV<T>& kv, const BlockTableView& t,
                      const DecodeBatch& a, std::int64_t max_length, cudaStream_t stream, int sm_count = 0) {
  static_assert(is_device_storage_v<T>, "gpu::decode_attention: K/V storage must be float, __half or __nv_bfloat16");
  constexpr const char* who = "gpu::decode_attention";
  kv.validate(who);
  dispatch_head_dim(kv.head_dim, who, [](auto) {});
  validate_decode(a, max_length, kv.page_size, who);
  if (a.accumulate_mass) {
    require(kv.fields[Field::attention_mass] != nullptr, who, ": accumulate_mass needs the pool's attention_mass array");
    const std::size_t shared = detail::decode_mass_shared_bytes(a.q_heads / a.kv_heads, kv.head_dim);
    require(shared <= detail::DecodeTuning::mass_shared_limit, who, ": accumulate_mass with a group of ", a.q_heads / a.kv_heads,
            " query heads at head_dim = ", kv.head_dim, " needs ", shared, " bytes of shared memory, over ",
            detail::DecodeTuning::mass_shared_limit);
  }
  if (sm_count <= 0) sm_count = detail::sm_count_of_current_device();
  if (size_query(workspace, workspace_bytes, decode_attention_workspace_bytes(a, max_length, kv.page_size, sm_count),
                 who))
    return;
  t.validate(who);
  if (a.batch == 0) return;
  require(a.queries && a.segment_base && a.out, who, ": queries, segment_base and out must be device pointers");
  require(reinterpret_cast<std::uintptr_t>(kv.keys) % 16 == 0 && reinterpret_cast<std::uintptr_t>(kv.values) % 16 == 0,
          who, ": keys and values must be 16-byte aligned (the kernel reads rows in 16-byte loads)");
  require(a.mask.local == 0 || a.query_position, who, ": a masked batch needs query_position");
  require(a.mask.gate_field == GateField::write_score, who,
          ": the device mask reads g from the pool's write_score (WG-KV's own cache); a mask that reads "
          "EntryMeta::gate has no device twin");
  const detail::DecodePlan sizing = detail::plan_decode(a, max_length, kv.page_size, sm_count);
  WorkspaceLayout layout;
  const std::int64_t rows = std::int64_t{a.batch} * a.q_heads * sizing.splits;
  detail::DecodePartials parts;
  parts.part_max = layout.take<float>(workspace, rows);
  parts.part_sum = layout.take<float>(workspace, rows);
  parts.part_acc = layout.take<float>(workspace, rows * 256);
  parts.final_max = layout.take<float>(workspace, std::int64_t{a.batch} * a.q_heads);
  parts.final_sum = layout.take<float>(workspace, std::int64_t{a.batch} * a.q_heads);
  parts.out = a.out;
  const std::string shapes = "batch = " + std::to_string(a.batch) + ", q_heads = " + std::to_string(a.q_heads) +
                             ", kv_heads = " + std::to_string(a.kv_heads) + ", head_dim = " + std::to_string(kv.head_dim) +
                             ", page_size = " + std::to_string(kv.page_size) + ", dtype = " + dtype_name<T> +
                             ", splits = " + std::to_string(sizing.splits);
  require(a.batch <= 65535 && std::int64_t{a.kv_heads} * sizing.group_tiles <= 65535, who, ": grid too large (", shapes, ")");
  bool tensor_cores = false;
  if (a.kernel != DecodeKernel::cuda_cores) {
    const char* why_not = detail::why_not_tensor_cores<T>(a, kv.head_dim);
    require(a.kernel == DecodeKernel::automatic || why_not == nullptr, who,
            ": kernel = tensor_cores does not apply: ", why_not == nullptr ? "" : why_not, " (", shapes, ")");
    tensor_cores = why_not == nullptr;
  }
  const detail::DecodePlan p = detail::plan_decode(a, max_length, kv.page_size, sm_count, tensor_cores);
  dispatch_head_dim(kv.head_dim, who, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    dispatch_page_size(kv.page_size, who, [&](auto page) {
      constexpr int P = decltype(page)::value;
      if constexpr (!std::is_same_v<T, float> && D <= 128) {
        if (tensor_cores) {
          constexpr std::size_t shared = detail::DecodeMmaTuning::shared_bytes<D>();
          auto* kernel = detail::decode_mma_kernel<T, D, P>;
          KVPOLICY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)),
                              "decode_mma_kernel: ", shared, " bytes of shared memory (", shapes, ")");
          const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(a.kv_heads * p.group_tiles),
                          static_cast<unsigned>(a.batch));
          kernel<<<grid, detail::DecodeMmaTuning::warps * 32, shared, stream>>>(kv, t, a, p.chunk, p.group_tiles, parts);
          check_launch("decode_mma_kernel", shapes);
          return;
        }
      }
      const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(a.kv_heads * p.group_tiles),
                      static_cast<unsigned>(a.batch));
      detail::decode_partial_kernel<T, D, P><<<grid, detail::DecodeTuning::warps * 32, 0, stream>>>(
          kv, t, a, p.chunk, p.group_tiles, parts);
      check_launch("decode_partial_kernel", shapes);
    });
    if (p.splits > 1) {
      detail::decode_merge_kernel<D><<<static_cast<unsigned>(std::int64_t{a.batch} * a.q_heads), 128, 0, stream>>>(
          p.splits, parts);
      check_launch("decode_merge_kernel", shapes);
    }
    if (!a.accumulate_mass) return;
    dispatch_page_size(kv.page_size, who, [&](auto page) {
      constexpr int P = decltype(page)::value;
      const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(a.batch));
      detail::decode_mass_kernel<T, D, P>
          <<<grid, detail::DecodeTuning::warps * 32, detail::decode_mass_shared_bytes(a.q_heads / a.kv_heads, D), stream>>>(
              kv, t, a, p.chunk, parts.final_max, parts.final_sum);
      check_launch("decode_mass_kernel", shapes);
    });
  });
}

}  // namespace kvpolicy::gpu
