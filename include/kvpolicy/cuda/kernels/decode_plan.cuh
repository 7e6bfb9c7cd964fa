/// \file
/// kvpolicy/cuda/kernels/decode_plan.cuh — what one decode attention step is given (DecodeBatch), the kernels'
/// tuning, and how a head is split along the cache into chunks (flash-decoding's split-KV), shared by
/// the CUDA-core kernel (attention.cuh) and the tensor-core one (decode_mma.cuh) so both write the
/// same partials into the same workspace.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kvpolicy/core/mask.hpp"
#include "kvpolicy/cuda/tuning.cuh"

namespace kvpolicy::gpu {

/// Which kernel computes q·Kᵀ and p·V (docs/perf.md, "Decode kernels"). automatic: tensor_cores
/// where it applies (fp16 or bf16 storage, head_dim 64 or 128, no H2O mass, a device of compute
/// capability 8.0 or more), cuda_cores otherwise; naming one that does not apply is an error.
enum class DecodeKernel : std::uint8_t { automatic, cuda_cores, tensor_cores };

/// One decode step of one layer: queries [batch, Hq, d] fp32; sequence b's kv head h is segment
/// segment_base[b] + h; out [batch, Hq, d] fp32. A head with no entries gives zeros.
/// With query_position (device, [batch]) given, query b sees only the keys at positions <=
/// query_position[b] (causal, SPEC §6): the rows of a prefill chunk are a batch of such queries
/// over the same segments, each at its own position. Without it, a query sees every entry.
/// With mask.local > 0 (WG-KV, SPEC §3) a key is visible only under the vertical-slash rule
/// (core/mask.hpp), its g read from the pool's write_score (GateField::write_score); it needs
/// query_position.
/// With accumulate_mass (H2O, SPEC §5, the twin of cpu::attend_paged's key_mass) every visible
/// entry's attention_mass column (kv.fields[Field::attention_mass]) grows by the probability it received, summed over the G query
/// heads of its group; a query head that sees no entry adds nothing, nor does a probability that is
/// not finite (a logit past fp32).
struct DecodeBatch {
  const float* queries = nullptr;
  const std::int32_t* segment_base = nullptr;
  std::int32_t batch = 0;
  std::int32_t q_heads = 0;
  std::int32_t kv_heads = 0;
  float* out = nullptr;
  AttentionMask mask{};
  const std::int32_t* query_position = nullptr;
  bool accumulate_mass = false;
  DecodeKernel kernel = DecodeKernel::automatic;  ///< tests and benchmarks name one; engines leave it
  /// Chunks each head is split into (flash-decoding's split-KV), 1..1024; 0: the plan's
  /// (plan_decode). Benchmarks sweep it; an engine leaves it. More chunks than the longest head has
  /// pages are not made.
  std::int32_t splits = 0;
};

namespace detail {

inline constexpr float kLog2e = 1.4426950408889634f;

struct DecodePlan {
  int splits = 1;               // chunks a head is split into
  std::int64_t chunk = 0;       // entries per chunk (the last chunk takes whatever is beyond)
  int group_tiles = 1;          // blocks per kv head along its query group
};

/// The CUDA-core kernel's split: many small waves of blocks (DecodeTuning::waves_of_blocks per SM).
/// The tensor-core kernel's (tensor_cores = true): chunks of at least mma_min_chunk entries, in one
/// wave of blocks (mma_blocks_per_sm a multiprocessor) unless that makes chunks longer than
/// mma_max_chunk: its blocks stream a whole chunk through a pipeline whose start is a fixed cost,
/// and a head of one chunk needs no merge pass (docs/perf.md, "Decode against FlashInfer": the
/// split sweep this rule is read from). Neither has more splits than the CUDA-core plan, which sizes
/// the workspace. Preconditions (checked by the callers): kv_heads >= 1, q_heads a multiple of it,
/// page_size >= 1.
inline DecodePlan plan_decode(const DecodeBatch& a, std::int64_t max_length, int page_size, int sm_count,
                              bool tensor_cores = false) {
  DecodePlan p;
  const int group = a.q_heads / a.kv_heads;
  p.group_tiles = (group + DecodeTuning::group_tile - 1) / DecodeTuning::group_tile;
  const std::int64_t heads = std::max<std::int64_t>(1, std::int64_t{a.batch} * a.kv_heads * p.group_tiles);
  std::int64_t want =
      std::max<std::int64_t>(1, (DecodeTuning::waves_of_blocks * std::int64_t{sm_count} + heads - 1) / heads);
  if (tensor_cores) {
    p.group_tiles = (group + DecodeTuning::mma_heads - 1) / DecodeTuning::mma_heads;
    const std::int64_t mma_heads = std::max<std::int64_t>(1, std::int64_t{a.batch} * a.kv_heads * p.group_tiles);
    const std::int64_t one_wave = std::max<std::int64_t>(1, DecodeTuning::mma_blocks_per_sm * std::int64_t{sm_count} / mma_heads);
    const std::int64_t long_chunks = (max_length + DecodeTuning::mma_max_chunk - 1) / DecodeTuning::mma_max_chunk;
    want = std::min(want, std::max(one_wave, long_chunks));
  }
  const std::int64_t least = tensor_cores ? DecodeTuning::mma_min_chunk : DecodeTuning::min_chunk;
  const std::int64_t most = std::max<std::int64_t>(1, (max_length + least - 1) / least);
  p.splits = static_cast<int>(std::min<std::int64_t>({want, most, 1024}));
  if (a.splits > 0)  // named by the caller: whole pages a chunk, so at most one chunk a page
    p.splits = static_cast<int>(std::clamp<std::int64_t>(a.splits, 1, std::max<std::int64_t>(1, (max_length + page_size - 1) / page_size)));
  const std::int64_t per = (max_length + p.splits - 1) / p.splits;
  p.chunk = std::max<std::int64_t>(page_size, (per + page_size - 1) / page_size * page_size);
  return p;
}

/// n partial softmax states (base m(i), sum l(i), accumulator element acc(i)), each from its own base
/// in log2 units, brought to the largest base mx (from largest_base) and summed into sum and out;
/// both 0 when mx = -inf (no partial saw an entry). The warps' merge and the splits' merge.
template <class Base>
__device__ float largest_base(int n, Base m) {
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = fmaxf(mx, m(i));
  return mx;
}
template <class Base, class Sum, class Acc>
__device__ void merge_partials(float mx, int n, Base m, Sum l, Acc acc, float& sum, float& out) {
  sum = 0.0f;
  out = 0.0f;
  if (mx == -INFINITY) return;
  for (int i = 0; i < n; ++i) {
    const float f = exp2f(m(i) - mx);
    sum += l(i) * f;
    out += acc(i) * f;
  }
}

/// Where the blocks of one decode step leave their chunks' partial states, and the step's answer.
/// part_* are [batch * Hq][splits] (x head_dim for the accumulator), merged by decode_merge_kernel;
/// final_max/final_sum are each query head's base and sum over every chunk (H2O's mass pass reads
/// them); out is DecodeBatch::out.
struct DecodePartials {
  float* part_max = nullptr;
  float* part_sum = nullptr;
  float* part_acc = nullptr;
  float* final_max = nullptr;
  float* final_sum = nullptr;
  float* out = nullptr;
};

/// A query head's answer from its merged state: out = acc / sum (0 where no entry was seen), and its
/// final (base, sum) for the mass pass.
template <int HEAD_DIM>
__device__ void write_answer(const DecodePartials& p, std::int64_t qh, int c, float mx, float sum, float acc) {
  p.out[qh * HEAD_DIM + c] = sum > 0.0f ? acc / sum : 0.0f;
  if (c == 0) {
    p.final_max[qh] = mx;
    p.final_sum[qh] = sum;
  }
}

/// The block's partial of one chunk for its tile of query heads: the warps' (max, sum, acc) merged
/// (merge_partials), one thread per (query head, element), written where decode_merge_kernel reads
/// it; with one chunk a head it is the answer, written as decode_merge_kernel would (no merge pass
/// then). m_w and l_w are [WARPS][ROWS], acc_w [WARPS][ROWS][HEAD_DIM]; rows [0, heads) are real,
/// first_head is row 0's query head.
template <int WARPS, int ROWS, int HEAD_DIM>
__device__ void write_block_partial(const float* m_w, const float* l_w, const float* acc_w, int heads,
                                    std::int64_t first_head, int split, int splits, const DecodePartials& p) {
  for (int i = static_cast<int>(threadIdx.x); i < heads * HEAD_DIM; i += static_cast<int>(blockDim.x)) {
    const int g = i / HEAD_DIM, c = i % HEAD_DIM;
    const auto m = [&](int w) { return m_w[w * ROWS + g]; };
    const float mx = largest_base(WARPS, m);
    float sum, out;
    merge_partials(mx, WARPS, m, [&](int w) { return l_w[w * ROWS + g]; },
                   [&](int w) { return acc_w[(w * ROWS + g) * HEAD_DIM + c]; }, sum, out);
    if (splits == 1) {  // merging one state is the identity: 2^0 = 1, the same bits
      write_answer<HEAD_DIM>(p, first_head + g, c, mx, sum, out);
      continue;
    }
    const std::int64_t at = (first_head + g) * splits + split;
    p.part_acc[at * HEAD_DIM + c] = out;
    if (c == 0) {
      p.part_max[at] = mx;
      p.part_sum[at] = sum;
    }
  }
}

}  // namespace detail

}  // namespace kvpolicy::gpu
