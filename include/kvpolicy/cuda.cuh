/// \file
/// kvpolicy/cuda.cuh — the CUDA path (docs/architecture.md, "Device path"): views over engine-owned device memory
/// and the kernels every policy step is made of — append, scoring, per-head and pooled top-K,
/// compaction, paged decode attention, the retention gates — and the Cache composition on the GPU
/// (Backend = cuda_backend: TrimKVCache<cuda_backend>, DBTrimKVCache<cuda_backend>). Every kernel entry
/// point in kvpolicy::gpu takes a cudaStream_t, sizes its scratch in two phases, never allocates or
/// synchronises, and checks every launch. Cache<cuda_backend> is the convenience layer above them: it
/// allocates its pool and scratch when constructed and synchronises its stream on each call
/// (cuda/backend.cuh). An engine whose buffers live on the device calls the kernels itself
/// (docs/integration.md (c), examples/engine_cuda.cu). Invalid host-side arguments of a kernel call
/// (null pointers, sizes, an unsupported head_dim or page_size) throw kvpolicy::Error before anything
/// is launched, as does a failed launch (naming the kernel, the CUDA error and the shapes). These
/// calls only enqueue work; the gate calls set the stream on the cuBLAS handle, so host threads that
/// call at the same time do not share one handle.
/// Needs nvcc (C++20) and links CUDA::cudart and CUDA::cublas (the CMake target kvpolicy::cuda).
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/cuda/kernels/append.cuh"
#include "kvpolicy/cuda/kernels/attention.cuh"
#include "kvpolicy/cuda/backend.cuh"
#include "kvpolicy/cuda/primitives/check.cuh"
#include "kvpolicy/cuda/kernels/compact.cuh"
#include "kvpolicy/cuda/primitives/dispatch.cuh"
#include "kvpolicy/cuda/primitives/dtype.cuh"
#include "kvpolicy/cuda/kernels/evict_step.cuh"
#include "kvpolicy/cuda/kernels/pooled_topk.cuh"
#include "kvpolicy/cuda/kernels/retention_gate.cuh"
#include "kvpolicy/cuda/kernels/score.cuh"
#include "kvpolicy/cuda/kernels/segmented_topk.cuh"
#include "kvpolicy/cuda/memory/views.cuh"
#include "kvpolicy/cuda/kernels/write_gate.cuh"
