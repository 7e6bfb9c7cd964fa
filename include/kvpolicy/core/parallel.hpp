/// \file
/// kvpolicy/core/parallel.hpp — the one place the library uses threads: a layer's kv heads attended
/// in parallel (docs/concurrency.md). OpenMP, when the translation unit is compiled with it
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

/// Below this much work ((query rows) x (entries) over the layer) a thread costs more than it saves.
inline constexpr std::int64_t kParallelAttentionWork = 1 << 15;

template <class Backend, class Body>
void for_each_kv_head(int kv_heads, std::int64_t work, const Body& body) {
#ifdef _OPENMP
  if constexpr (requires { requires Backend::parallel_heads; }) {
    if (kv_heads > 1 && work >= kParallelAttentionWork && !omp_in_parallel() && omp_get_max_threads() > 1) {
      std::exception_ptr error;  // an exception may not leave a parallel region: the first is kept
#pragma omp parallel for schedule(static)
      for (int h = 0; h < kv_heads; ++h) {
        try {
          body(h);
        } catch (...) {
#pragma omp critical(kvpolicy_for_each_kv_head)
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
  for (int h = 0; h < kv_heads; ++h) body(h);
}

}  // namespace kvpolicy::detail
