/// \file
/// kvpolicy/core/parallel.hpp — the one place the library uses threads: a layer's kv heads (or a
/// decode step's ranges of their entries) attended in parallel (docs/concurrency.md). OpenMP, when the translation unit is compiled with it
/// (-fopenmp, or a target linked to OpenMP::OpenMP_CXX); serial otherwise. A backend opts in with
/// `static constexpr bool parallel_heads = true` (its attend() must be safe to run for different kv
/// heads at once); the threads are OpenMP's (OMP_NUM_THREADS, omp_set_num_threads). Inside an
/// enclosing parallel region (an engine that steps sequences from its own OpenMP threads) the loop
/// runs serially, as OpenMP's nested regions do by default.
#pragma once

#include <cstdint>
#include <exception>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace kvpolicy::detail {

/// Below this much work ((query rows) x (entries) over the layer) a thread costs more than it saves:
/// a parallel region costs microseconds, and a decode step's 2,048 row-entries (G = 3 rows over 680
/// fp16 entries of d = 64 in the layer) take about as long. At SmolLM2's 1K context (3 x 1,024 x 3 rows) a
/// decode step was 10% faster with this bound than with 2^15, under which its attention ran on one
/// thread (kvpolicy-lm, 2 threads, 2026-11-26).
inline constexpr std::int64_t kParallelAttentionWork = 1 << 11;

/// body(i) for i in [0, tasks): on OpenMP's threads when Backend opts in and `work` is worth them,
/// each task to whichever thread is free (tasks of unequal length: a head's ranges, its last one
/// shorter); in order on this thread otherwise. The first exception thrown is rethrown here.
template <class Backend, class Body>
void for_each_task(std::int64_t tasks, std::int64_t work, const Body& body) {
#ifdef _OPENMP
  if constexpr (requires { requires Backend::parallel_heads; }) {
    if (tasks > 1 && work >= kParallelAttentionWork && !omp_in_parallel() && omp_get_max_threads() > 1) {
      std::exception_ptr error;  // an exception may not leave a parallel region: the first is kept
#pragma omp parallel for schedule(dynamic)
      for (std::int64_t i = 0; i < tasks; ++i) {
        try {
          body(i);
        } catch (...) {
#pragma omp critical(kvpolicy_for_each_task)
          if (!error) error = std::current_exception();
        }
      }
      if (error) std::rethrow_exception(error);
      return;
    }
  }
#else
  (void)work;
#endif
  for (std::int64_t i = 0; i < tasks; ++i) body(i);
}

/// body(h) for every kv head h of a layer (for_each_task, one task a head).
template <class Backend, class Body>
void for_each_kv_head(int kv_heads, std::int64_t work, const Body& body) {
  for_each_task<Backend>(kv_heads, work, [&](std::int64_t h) { body(static_cast<int>(h)); });
}

}  // namespace kvpolicy::detail
