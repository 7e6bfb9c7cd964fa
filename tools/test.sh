#!/usr/bin/env bash
# Builds kvpolicy and passes every test. Each phase prints its time, and the run ends with a table of
# them (docs/developing.md says what each phase checks):
#   deps        the Debian packages (tools/install-deps.sh)
#   llama.cpp   llama.cpp's static libraries from a pinned source release (tools/fetch-llama-cpp.sh),
#               for kvpolicy-llama
#   build       the Release build: library, tests, examples, benchmarks (and the CUDA path when nvcc
#               is found, compiled for sm_90)
#   ctest       the Release suite: unit, oracle and state-machine tests, the installed-package
#               consumer build, the vcpkg port's install tree, the replay CLI, a benchmark smoke run,
#               a 10^5-step soak, 30 s of libFuzzer per parser, the real model, Python, training
#   gpusim      the CUDA tests and engine_cuda under GPGPU-Sim, where it is installed
#               (/opt/kvpolicy-gpusim; docs/gpusim.md)
#   conan       `conan create` offline with its test_package
#   tsan        the concurrency test under ThreadSanitizer
#   asan        the unit and replay tests again under AddressSanitizer + UBSan (build, then ctest)
# and then with the counts of ctest entries passed, failed and skipped, each skipped one named with
# its reason (tools/test_results.py, from the JUnit files under build/test-results; a phase that
# could not run is listed there too). Without PyPI the entries that need it report SKIPPED and the
# run still passes; .ci/run fails on any skip but a GPU's absence.
#
#   tools/test.sh           everything (what CI runs: .ci/run)
#   tools/test.sh --quick   in about ten minutes: the library, the unit, oracle and state-machine
#                           tests (one process) and one real-model test (kvpolicy-lm against
#                           llama.cpp's logits), CPU only, in build/quick
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: tools/test.sh [--quick]" >&2; exit 2 ;;
esac

start=$(date +%s)
results=$PWD/build/test-results
rm -rf "$results"
mkdir -p "$results"
phases=()
phase() {  # name, command...: runs the command, prints and records its time
  local name=$1 t0 seconds
  shift
  t0=$(date +%s)
  echo "== test.sh: $name"
  "$@"
  seconds=$(( $(date +%s) - t0 ))
  phases+=("$name $seconds")
  echo "== test.sh: $name took ${seconds} s"
}
summary() {
  echo "== test.sh: phase times"
  local p
  for p in "${phases[@]}"; do printf '   %-10s %6s s\n' ${p}; done
  printf '   %-10s %6s s\n' total $(( $(date +%s) - start ))
  python3 tools/test_results.py "$results" || true
}
trap summary EXIT
skipped_phase() {  # name, reason: a phase that could not run, listed with the skipped entries
  echo "$1: SKIPPED ($2)"
  printf '%s\t%s\n' "$1" "$2" >>"$results/phases.tsv"
}
configure_build() {  # preset
  cmake --preset "$1"
  cmake --build --preset "$1"
}

phase deps tools/install-deps.sh
if [ $quick = 1 ]; then
  phase build configure_build quick
  phase unit build/quick/tests/kvpolicy_tests
  phase model ctest --test-dir build/quick -R '^lm_golden_llama_cpp$' --output-on-failure --no-tests=error \
    --output-junit "$results/quick.xml"
  exit 0
fi
# A set-up phase that exits 77 could not reach PyPI: listed as skipped, the run goes on (tools/pypi.sh).
or_skipped() {  # name, command...
  local name=$1 rc=0
  shift
  "$@" || rc=$?
  if [ $rc -eq 77 ]; then skipped_phase "$name" "PyPI cannot be reached"; return 0; fi
  return $rc
}
# llama.cpp from its pinned source release, for kvpolicy-llama; without it lm_llama_cpp_engine
# reports SKIPPED
phase llama.cpp or_skipped llama.cpp tools/fetch-llama-cpp.sh
phase build configure_build default
phase ctest ctest --preset default --output-junit "$results/default.xml"
# The CUDA path under GPGPU-Sim's functional mode, where the simulator is installed (docs/gpusim.md).
if ! command -v nvcc >/dev/null 2>&1; then
  skipped_phase gpusim "no nvcc: the CUDA path is not compiled"
elif [ ! -f /opt/kvpolicy-gpusim/env.sh ]; then
  skipped_phase gpusim "no GPU simulator installed at /opt/kvpolicy-gpusim (docs/gpusim.md)"
else
  phase gpusim tools/gpusim-check.sh /opt/kvpolicy-gpusim
fi
phase conan or_skipped conan tools/conan-test.sh
# The concurrency contract under ThreadSanitizer: threads stepping different sequences of one cache.
phase tsan sh -c 'cmake --preset tsan && cmake --build --preset tsan && ctest --preset tsan --output-junit "$1"' \
  tsan "$results/tsan.xml"
phase asan-build configure_build asan
phase asan-ctest ctest --preset asan --output-junit "$results/asan.xml"
