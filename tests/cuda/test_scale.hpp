// How much of each GPU test runs. On a GPU, all of it. Under a GPU simulator, which runs kernels
// thousands of times slower, KVPOLICY_CUDA_TEST_SCALE=N (tools/gpusim-check.sh sets 8) keeps 1/N of
// the random seeds and shortens the long heads N-fold; the sweeps over dtype, HEAD_DIM and page
// size are never thinned, so every kernel instantiation a GPU run covers still runs. What each case
// asserts does not change.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace cudatest {

inline std::int64_t test_scale() {
  static const std::int64_t scale = [] {
    const char* text = std::getenv("KVPOLICY_CUDA_TEST_SCALE");
    if (!text || !*text) return std::int64_t{1};
    char* end = nullptr;
    const long long n = std::strtoll(text, &end, 10);
    if (*end != '\0' || n < 1 || n > 1000000)
      throw std::invalid_argument(std::string("KVPOLICY_CUDA_TEST_SCALE = '") + text +
                                  "' must be an integer in [1, 1000000]");
    return static_cast<std::int64_t>(n);
  }();
  return scale;
}

/// Random seeds a case draws: n on a GPU, n / scale (at least 1) under a simulator.
inline std::uint64_t seeds(std::uint64_t n) {
  return std::max<std::uint64_t>(1, n / static_cast<std::uint64_t>(test_scale()));
}

/// Steps of a stepped case (append, evict, compare): n on a GPU, n / scale (at least `least`, enough
/// for every rule of the case to trigger) under a simulator, where each launch costs ~0.4 s.
inline int steps(int n, int least) { return static_cast<int>(std::max<std::int64_t>(least, n / test_scale())); }

/// A head length or length bound: n on a GPU, n / scale (at least `least`) under a simulator.
inline std::int64_t length(std::int64_t n, std::int64_t least = 1) { return std::max(least, n / test_scale()); }

}  // namespace cudatest
