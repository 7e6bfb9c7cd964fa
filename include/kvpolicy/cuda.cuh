/// \file
/// kvpolicy/cuda.cuh — the CUDA path (docs/architecture.md, "Device path"): views over engine-owned device memory
/// and the kernels every policy step is made of — append, scoring, per-head and pooled top-K,
/// compaction, paged decode attention, the retention gates — and the Cache composition on the GPU
/// (Backend = cuda_backend: TrimKVCache<cuda_backend>, DBTrimKVCache<cuda_backend>). Every kernel entry
/// point in kvpolicy::gpu takes a cudaStream_t, sizes its scratch in two phases, never allocates or
/// synchronises, and checks every launch. Cache<cuda_backend> is the convenience layer above them: it
/// allocates its pool and scratch when constructed and synchronises its stream on each call
/// (cuda/cache.cuh).
/// Needs nvcc (C++20) and links CUDA::cudart and CUDA::cublas (the CMake target kvpolicy::cuda).
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/cuda/append.cuh"
#include "kvpolicy/cuda/attention.cuh"
#include "kvpolicy/cuda/cache.cuh"
#include "kvpolicy/cuda/check.cuh"
#include "kvpolicy/cuda/compact.cuh"
#include "kvpolicy/cuda/dispatch.cuh"
#include "kvpolicy/cuda/dtype.cuh"
#include "kvpolicy/cuda/evict_step.cuh"
#include "kvpolicy/cuda/pooled_topk.cuh"
#include "kvpolicy/cuda/retention_gate.cuh"
#include "kvpolicy/cuda/score.cuh"
#include "kvpolicy/cuda/segmented_topk.cuh"
#include "kvpolicy/cuda/views.cuh"
#include "kvpolicy/cuda/write_gate.cuh"
