/// \file
/// kvpolicy/cpu.hpp — the CPU backend (cpu_backend: Eigen's and OpenMP's attention, the host
/// planner) with the Cache it completes, the allocators and the Admitter every policy but WG-KV
/// uses, for a program that composes its own parts
/// (docs/architecture.md); a family's header (trimkv.hpp, baselines.hpp, …) is this and its policy
/// files. A device program includes kvpolicy/cuda.cuh instead.
///
///   kvpolicy::Cache<MyScorer, kvpolicy::admit::All, MyEvictor, kvpolicy::memory::Paged<16>,
///                   kvpolicy::cpu_backend> cache(shape, kvpolicy::memory::Paged<16>(pages));
#pragma once

#include "kvpolicy/core/cxx20.hpp"  // first: names a missing -std=c++20

#include "kvpolicy/cache.hpp"
#include "kvpolicy/cpu/backend.hpp"
#include "kvpolicy/memory/contiguous.hpp"
#include "kvpolicy/memory/paged.hpp"
#include "kvpolicy/parts/admit/all.hpp"
