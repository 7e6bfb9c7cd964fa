/// \file
/// kvpolicy/cuda/backend.cuh — cuda_backend, the Backend that puts a Cache on the GPU:
/// `Cache<Scorer, admit::All, Evictor, memory::Paged<P, Storage>, cuda_backend>` (so
/// `TrimKVCache<cuda_backend>`, `DBTrimKVCache<cuda_backend>`, …) is the one Cache class template of
/// cache.hpp, with its entries in device memory and its steps on the CUDA kernels
/// (cuda/executor.cuh). Its API is the Cache's — host fp32 views in and out, the same validation
/// and errors as with cpu_backend — so an engine switches backends with one template argument and
/// the differential tests drive both with the same calls.
#pragma once

#include <cuda_runtime.h>

#include "kvpolicy/cache.hpp"
#include "kvpolicy/cuda/executor.cuh"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
#include "kvpolicy/parts/evict/evictors.hpp"

namespace kvpolicy {

/// The CUDA Backend (this file's comment): the entries, the attention and the eviction on the device.
/// H2O, KeyDiff, WGKVBudgetCache and WGKVRetentionCache fail to compile on it with a one-line reason
/// (cuda/device_parts.hpp); H2O runs on the raw kernels instead (DecodeBatch::accumulate_mass,
/// docs/integration.md). Constructing the Cache throws, besides the CPU Cache's checks, for a
/// head_dim other than 64, 128 or 256 and for a CUDA failure (the message names the call). Beside
/// the CPU Cache: append checks gate but the device keeps no gate (it admits every token), and there
/// is no allocator() (use pages_free() and pages_total()) and no set_step_scores.
/// tests/cuda/test_cache.cu runs the CPU Cache's state-machine test (tests/state_machine.hpp) on it.
struct cuda_backend {
  static constexpr const char* name = "cuda";
  static constexpr bool emits_attention_mass = false;
  /// The stream every call of the Cache runs on (default: the legacy default stream).
  using Options = cudaStream_t;
  /// How a Cache's steps run here: on the device (cuda/executor.cuh).
  template <Scorer S, Admitter A, Evictor E, Allocator Alloc>
  using Executor = gpu::Executor<S, A, E, Alloc>;
};

}  // namespace kvpolicy
