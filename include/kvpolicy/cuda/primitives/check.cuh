/// \file
/// kvpolicy/cuda/primitives/check.cuh — every CUDA call and every launch of the library is checked; a failure
/// throws kvpolicy::Error naming the call or kernel, the CUDA error and the shapes it ran on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "kvpolicy/core/error.hpp"

namespace kvpolicy::gpu {

/// Throws kvpolicy::Error("cuda: <what> failed: <error> (<context>)") unless status is cudaSuccess.
template <class... Context>
void check(cudaError_t status, const char* what, Context&&... context) {
  if (status == cudaSuccess) return;
  std::ostringstream where;
  (where << ... << std::forward<Context>(context));
  fail("cuda: ", what, " failed: ", cudaGetErrorName(status), ": ", cudaGetErrorString(status), " (", where.str(),
       ")");
}

/// After a <<<...>>> launch: reports a bad configuration or an earlier asynchronous fault.
template <class... Context>
void check_launch(const char* kernel, Context&&... context) {
  check(cudaGetLastError(), kernel, std::forward<Context>(context)...);
}

/// Whether a CUDA device is usable here (tests report SKIPPED without one); it never throws.
inline bool device_present() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

/// Blocks of `threads` that cover `n` items, as the int a launch takes; refuses a grid too large.
inline unsigned int blocks_for(std::int64_t n, int threads, const char* kernel) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  require(blocks <= std::int64_t{0x7fffffff}, "cuda: ", kernel, ": ", n, " items need ", blocks,
          " blocks, more than a grid holds");
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks);
}

}  // namespace kvpolicy::gpu

#define KVPOLICY_CUDA_CHECK(call, ...) ::kvpolicy::gpu::check((call), #call, ##__VA_ARGS__)
