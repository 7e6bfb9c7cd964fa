/// \file
/// kvpolicy/cuda/tuning.cuh — every device kernel family's tuning, as data, in one place (CUB's way:
/// one policy struct per kernel family): the selection kernels' block and tiles, the decode
/// attention's split and blocks, the tensor-core decode kernel's tiles and ring, the observed
/// attention's block. The kernels read these and nothing else; retuning for a device is an edit
/// here, measured as docs/perf.md says.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvpolicy::gpu::detail {

/// The selection family's tuning, as data (CUB's way: one policy struct per kernel family): the
/// block of the radix select and its collectives (and of every kernel that uses them), the tile a
/// segmented top-K keys into shared memory, the chunk a pooled pass histograms per block.
struct SelectTuning {
  static constexpr int threads = 256;      // one thread per digit of an 8-bit pass
  static constexpr int radix_bins = 256;
  static constexpr int tile = 2048;        // entries keyed into shared memory (16 KiB of keys)
  static constexpr int pool_chunk = 4096;  // entries one block histograms per pass
};

/// The decode attention's tuning, as data (CUB's way: one policy struct per kernel family). The
/// kernels and the split plan read these and nothing else.
struct DecodeTuning {
  static constexpr int warps = 4;                // per block
  static constexpr int group_tile = 8;           // query heads of a group one block serves
  static constexpr int mma_heads = 16;           // ... in the tensor-core kernel (DecodeMmaTuning::heads)
  static constexpr int mma_blocks_per_sm = 2;    // its blocks an SM holds: its split aims at one wave of them
  static constexpr std::int64_t mma_min_chunk = 512;   // entries: below, a block's start and its partial's
                                                       // merge cost more than the stream it adds
  static constexpr std::int64_t mma_max_chunk = 8192;  // entries: above, more (shorter) chunks than one wave
                                                       // holds balance the multiprocessors better
  static constexpr int waves_of_blocks = 32;     // blocks per multiprocessor the split aims at: many
                                                 // small waves, so the last one's idle tail stays small
  static constexpr std::int64_t min_chunk = 128;   // entries; below, a split's partials cost more than it saves
  static constexpr float rescale_slack = 8.0f;    // log2 units: probabilities against a stale base stay <= 2^8
  static constexpr std::size_t mass_shared_limit = 48 * 1024;  // the mass pass's shared memory, without opting in
  // Blocks of the partial kernel an SM must hold (launch bounds): 4 on sm_80+ (at most 128
  // registers a thread, measured on an H100: bytes in flight need blocks); no bound below, where
  // the cap would spill (and GPGPU-Sim, which runs sm_75 builds, cannot parse ptxas's report of a
  // stack frame).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static constexpr int partial_blocks_per_sm = 4;
#else
  static constexpr int partial_blocks_per_sm = 1;
#endif
};

/// The tensor-core decode kernel's tuning (kernels/decode_mma.cuh).
struct DecodeMmaTuning {
  static constexpr int warps = 4;          // per block, each with its own tiles and ring
  static constexpr int heads = DecodeTuning::mma_heads;  // query heads of a group one block serves: the product's M
  static constexpr int tile = 16;          // entries of a tile: S's N, and P·V's K
  static constexpr int stages = 3;         // a warp's ring: tiles in flight and the one in hand
  static constexpr int blocks_per_sm = 2;  // 104 KB of shared memory each at head_dim 128
  static constexpr int header_bytes = 256; // the rings' visibility words, the query rows' scales and maxima
  static_assert(heads == 16 && DecodeTuning::mma_blocks_per_sm == blocks_per_sm);

  /// Shared memory of one block: the query's high and low parts [heads][D], the header, and each
  /// warp's ring of (keys, values) [tile][D], all 16-bit. After the loop the rings hold the warps'
  /// partials for write_block_partial.
  template <int D>
  static constexpr std::size_t shared_bytes() {
    return 2 * std::size_t(heads) * D * 2 + header_bytes + std::size_t(warps) * stages * 2 * tile * D * 2;
  }
};

/// The observed-attention scoring kernel's block (kernels/observed_attention.cuh).
struct ObservedTuning {
  static constexpr int threads = 256;
};

}  // namespace kvpolicy::gpu::detail
