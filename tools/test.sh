#!/usr/bin/env bash
# Builds kvpolicy and passes every test: the Release suite (with the installed-package consumer
# build, the vcpkg port's install tree, the replay CLI, a benchmark smoke run, the state-machine
# test, a 10^5-step soak and 30 s of libFuzzer per parser), then `conan create` offline with its
# test_package, the concurrency test under ThreadSanitizer, then the unit and replay tests again
# under AddressSanitizer + UBSan. Where GPGPU-Sim
# is installed (/opt/kvpolicy-gpusim), the CUDA tests and engine_cuda also run under it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset default
cmake --build --preset default
ctest --preset default
# The CUDA path under GPGPU-Sim's functional mode, where the simulator is installed (docs/gpusim.md).
if [ -f /opt/kvpolicy-gpusim/env.sh ] && command -v nvcc >/dev/null 2>&1; then
  tools/gpusim-check.sh /opt/kvpolicy-gpusim
else
  echo "gpusim: SKIPPED (no simulator installed at /opt/kvpolicy-gpusim, or no nvcc; docs/gpusim.md)"
fi
tools/conan-test.sh
# The concurrency contract under ThreadSanitizer: threads stepping different sequences of one cache.
cmake --preset tsan
cmake --build --preset tsan
ctest --preset tsan
cmake --preset asan
cmake --build --preset asan
ctest --preset asan
