/// \file
/// kvpolicy/cuda/primitives/block_select.cuh — the block-level building blocks of every selection kernel
/// (docs/architecture.md, "Device path"): radix select of the k-th largest key by 8-bit
/// histogram passes, the choice of a pass's digit with cub::BlockScan, and a block-wide running
/// exclusive scan in index order (deterministic tie resolution, page assignment).
/// Every kernel using these runs with exactly SelectTuning::threads threads.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "kvpolicy/cuda/tuning.cuh"

namespace kvpolicy::gpu::detail {

using BlockScanI64 = cub::BlockScan<long long, SelectTuning::threads>;
using BlockReduceI64 = cub::BlockReduce<long long, SelectTuning::threads>;

/// The digit of a pass: given counts[b] of the still-matching keys whose current digit is b, and
/// k >= 1 (the rank wanted among them, largest first), finds the digit d holding the k-th largest
/// and the rank it has among the keys with digit d. Result in *digit and *k_in_digit.
template <class Count>
__device__ void pick_digit(const Count* counts, long long k, typename BlockScanI64::TempStorage& scan, int* digit,
                           long long* k_in_digit) {
  const int t = static_cast<int>(threadIdx.x);
  const int d = SelectTuning::radix_bins - 1 - t;  // thread 0 holds the largest digit
  const long long c = static_cast<long long>(counts[d]);
  long long above = 0;
  BlockScanI64(scan).ExclusiveSum(c, above);  // keys with a larger digit
  if (above < k && k <= above + c) {
    *digit = d;
    *k_in_digit = k - above;
  }
  __syncthreads();
}

struct SelectShared {
  unsigned int hist[SelectTuning::radix_bins];
  typename BlockScanI64::TempStorage scan;
  int digit;
  long long k;
  unsigned long long found;  // the one key under a prefix (block_radix_select's early exit)
};

/// The k-th largest (1 <= k <= n) of n keys get(0..n-1) — ties counted: the result T has fewer
/// than k keys above it and at least k at or above it. On return sh.k is k minus the keys above T:
/// how many of the keys equal to T the top k takes. All threads of the block call it.
/// A pass whose chosen digit holds one key ends the passes: that key is T (sh.k = 1), read in one
/// more pass over the keys. Keys that carry a unique position never tie, so on scores that differ
/// in their high bits two or three passes decide instead of sizeof(Key) of them.
template <class Key, class Get>
__device__ Key block_radix_select(Get get, long long n, long long k, SelectShared& sh) {
  Key prefix = 0, mask = 0;
  for (int shift = static_cast<int>(sizeof(Key) * 8) - 8; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < SelectTuning::radix_bins; b += blockDim.x) sh.hist[b] = 0;
    __syncthreads();
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
      const Key key = get(i);
      if ((key & mask) == prefix) atomicAdd(&sh.hist[static_cast<int>((key >> shift) & 0xff)], 1u);
    }
    __syncthreads();
    pick_digit(sh.hist, k, sh.scan, &sh.digit, &sh.k);
    const unsigned int alone = sh.hist[sh.digit];  // keys under the longer prefix
    prefix |= static_cast<Key>(sh.digit) << shift;
    mask |= static_cast<Key>(0xff) << shift;
    k = sh.k;
    __syncthreads();
    if (alone == 1 && shift > 0) {  // T is the one key under the prefix (and sh.k = 1)
      for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        const Key key = get(i);
        if ((key & mask) == prefix) sh.found = static_cast<unsigned long long>(key);
      }
      __syncthreads();
      const Key found = static_cast<Key>(sh.found);
      __syncthreads();
      return found;
    }
  }
  return prefix;
}

/// Calls body(i, rank) for every i in [0, n) with flag(i) true, rank = how many flagged indices
/// precede i; returns the total. In index order, so the outcome never depends on scheduling.
template <class Flag, class Body>
__device__ long long block_enumerate(long long n, Flag flag, Body body, typename BlockScanI64::TempStorage& scan) {
  long long running = 0;
  for (long long base = 0; base < n; base += blockDim.x) {
    const long long i = base + threadIdx.x;
    const long long f = (i < n && flag(i)) ? 1 : 0;
    long long rank = 0, total = 0;
    BlockScanI64(scan).ExclusiveSum(f, rank, total);
    if (f) body(i, running + rank);
    running += total;
    __syncthreads();
  }
  return running;
}

/// Block-wide running exclusive scan of value(i), i in [0, n): body(i, prefix, value) in index
/// order; returns the total.
template <class Value, class Body>
__device__ long long block_exclusive_scan(long long n, Value value, Body body,
                                          typename BlockScanI64::TempStorage& scan) {
  long long running = 0;
  for (long long base = 0; base < n; base += blockDim.x) {
    const long long i = base + threadIdx.x;
    const long long v = i < n ? static_cast<long long>(value(i)) : 0;
    long long prefix = 0, total = 0;
    BlockScanI64(scan).ExclusiveSum(v, prefix, total);
    if (i < n) body(i, running + prefix, v);
    running += total;
    __syncthreads();
  }
  return running;
}

}  // namespace kvpolicy::gpu::detail
