#!/usr/bin/env bash
# Runs the CUDA path without a GPU: builds the CUDA tests, engine_cuda, the fault probes and
# sim_ratios for GPGPU-Sim (the `gpusim` preset: sm_75, shared CUDA runtime, the gates' products
# without cuBLAS) and runs the probes, the tests and engine_cuda under the simulator's functional
# mode, a few test cases per simulator process (as many at once as there are cores), with
# the tests scaled down (KVPOLICY_CUDA_TEST_SCALE, default 8 here: fewer random seeds, shorter
# heads; every kernel, dtype and HEAD_DIM instantiation still runs). Fails on any failing case and
# on any PTX syntax error in the simulator's log (after one, the simulator carries on and crashes
# later). The simulator is found, never built, here: docs/gpusim.md says how to install it.
#   tools/gpusim-check.sh [PREFIX]     (default /opt/kvpolicy-gpusim; OUT=dir keeps the logs there;
#                                        KVPOLICY_GPUSIM_CASES=regex runs only the matching cases;
#                                        KVPOLICY_GPUSIM_JOBS=n simulators at once, default every core;
#                                        KVPOLICY_GPUSIM_BATCH=n cases a simulator process, default 8)
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-/opt/kvpolicy-gpusim}
if [ ! -f "$prefix/env.sh" ]; then
  echo "gpusim: no simulator at $prefix (docs/gpusim.md installs one)" >&2
  exit 2
fi
root=$PWD
out=${OUT:-build/gpusim/logs}
mkdir -p "$out"
export KVPOLICY_CUDA_TEST_SCALE=${KVPOLICY_CUDA_TEST_SCALE:-8}
cmake --preset gpusim >"$out/configure.log"
cmake --build --preset gpusim >"$out/build.log"
# the sharded device Cache's test exists where OpenMPI was found (tools/install-deps.sh installs it)
sharded=build/gpusim/tests/kvpolicy_dist_sharded_cache_cuda
if cmake --build build/gpusim --target help | grep -q kvpolicy_dist_sharded_cache_cuda; then
  cmake --build build/gpusim --target kvpolicy_dist_sharded_cache_cuda >>"$out/build.log"
fi
tests=build/gpusim/tests/cuda/kvpolicy_cuda_tests

# One simulator process per test case: a case's log stays its own, and a crash names its case.
# Each run has a scratch directory of its own (tools/gpusim-run.sh).
# run_sim_with: any command that starts tools/gpusim-run.sh (an mpirun of simulated ranks).
run_sim() {  # log, program, args...
  local log=$1; shift
  run_sim_with "$log" "$root/tools/gpusim-run.sh" "$prefix" "$@"
}
run_sim_with() {  # log, command...
  local log=$1; shift
  local rc=0
  "$@" >"$log" 2>&1 || rc=$?
  if grep -q "Syntax error" "$log"; then
    echo "gpusim: PTX syntax error in the simulator's log ($log):" >&2
    grep -m3 -A3 "Syntax error" "$log" >&2
    return 3
  fi
  # a passing run's log (about 10 MB of the simulator's launch notes) keeps only the cases' times
  # (doctest's --duration lines) and its last lines
  if [ $rc -eq 0 ]; then { grep -aE '^[0-9.]+ s: ' "$log" || true; tail -n 40 "$log"; } >"$log.tail" && mv "$log.tail" "$log"; fi
  return $rc
}

failed=0
# The probes of the simulator faults the project works around (docs/gpusim.md); each writes its
# line to probe_<name>.result. async_pageable probes a fault the project does not work around:
# async copies from pageable host memory on a created stream (probes/async_pageable.cu).
# engine_cuda uploads that way, so while the probe shows the fault, engine_cuda's failure is
# expected; on a simulator without it, engine_cuda must pass (judged at the end, below).
run_probe() {  # name
  local probe=$1 status rc=0
  run_sim "$out/probe_$probe.log" "$root/build/gpusim/tests/cuda/kvpolicy_probe_$probe" || rc=$?
  if [ $rc -eq 0 ]; then status=passed
  elif [ "$probe" = async_pageable ] && [ $rc -ne 3 ]; then status="shows the simulator's fault"  # 3: a PTX syntax error
  else status="FAILED (rc $rc)"; fi
  printf 'gpusim: probe %-89s %s  %s\n' "$probe" "$status" \
    "$(grep -aE 'wrong|mismatches|async pageable' "$out/probe_$probe.log" | tr '\n' ' ' | tr -s ' ')" >"$out/probe_$probe.result"
}
# The case names, from the sources: the binary lists nothing without a device. A templated case
# (TEST_CASE_TEMPLATE_DEFINE: one instance per registered policy) is one entry, "NAME<*", which
# runs every instance (doctest names each NAME<type>).
mapfile -t cases < <({ grep -ho 'TEST_CASE("[^"]*")' tests/cuda/*.cu | grep -v 'test_suite("host")' |
                         sed 's/^TEST_CASE("//; s/")$//'
                       grep -ho 'TEST_CASE_TEMPLATE_DEFINE("[^"]*"' tests/cuda/*.cu |
                         sed 's/^TEST_CASE_TEMPLATE_DEFINE("//; s/"$/<*/'; } | grep -E -- "${KVPOLICY_GPUSIM_CASES:-.}")
# Each simulator process runs on one core: KVPOLICY_GPUSIM_JOBS of them at once (default: every core).
# A process runs a batch of cases (KVPOLICY_GPUSIM_BATCH, default 8): the simulator takes about 20 s
# to start (it extracts and parses the binary's PTX), which one process per case paid 38 times.
# Batches take every n-th case (n = the number of batches), so long and short cases mix. Each case
# still gets its own line (its time from doctest's --duration), printed in the sources' order at the
# end; a case that fails names itself in its batch's log (batch<b>.log).
jobs_max=${KVPOLICY_GPUSIM_JOBS:-$(nproc)}
per_batch=${KVPOLICY_GPUSIM_BATCH:-8}
for setting in "JOBS=$jobs_max" "BATCH=$per_batch"; do
  if ! [[ ${setting#*=} =~ ^[1-9][0-9]*$ ]]; then
    echo "gpusim: KVPOLICY_GPUSIM_${setting%%=*} = '${setting#*=}' must be an integer >= 1" >&2
    exit 2
  fi
done
if [ ${#cases[@]} -eq 0 ]; then
  echo "gpusim: no test case matches KVPOLICY_GPUSIM_CASES = '${KVPOLICY_GPUSIM_CASES:-}'" >&2
  exit 2
fi
run_batch() {  # b, case indices...
  local b=$1 start status filter="" i name seconds rc=0 ran
  shift
  start=$(date +%s)
  for i in "$@"; do filter+="${filter:+,}${cases[$i]//,/?}"; done  # doctest splits filters on commas
  run_sim "$out/batch$b.log" "$root/$tests" --duration=true --test-case="$filter" || rc=$?
  ran=$(grep -aEo '^\[doctest\] test cases: +[0-9]+' "$out/batch$b.log" | grep -Eo '[0-9]+$' || echo 0)
  for i in "$@"; do
    name=${cases[$i]}
    # the case's own line: "<seconds> s: <name>" once doctest finished it (a templated case: the sum
    # over its instances' lines)
    seconds=$(awk -v name="$name" '/^[0-9.]+ s: / {
                  case_name = substr($0, index($0, " s: ") + 4)
                  if (case_name == name) { print $1; found = 2; exit }
                  if (name ~ /<\*$/ && index(case_name, substr(name, 1, length(name) - 1)) == 1) { sum += $1; found = 1 }
                } END { if (found == 1) print sum }' "$out/batch$b.log")
    if [ $rc -eq 0 ] && [ "$ran" -ge $# ] && [ -n "$seconds" ]; then
      status="passed, ${seconds%.*}s"
    elif [ $rc -eq 0 ]; then
      status="FAILED (rc 0: the filter ran $ran of the batch's $# cases)"
    elif [ -z "$seconds" ]; then
      status="FAILED (rc $rc: batch $b ended before this case did; batch$b.log)"
    else
      status="in a FAILED batch (rc $rc, batch$b.log names the failing case), ${seconds%.*}s"
    fi
    printf 'gpusim: %-95s %s\n' "$name" "$status" >"$out/case$((i + 1)).result"
  done
  printf 'gpusim: batch %s (%s cases) took %ss, rc %s  %s\n' "$b" $# "$(( $(date +%s) - start ))" "$rc" \
    "$(grep -aE '^\[doctest\] assertions' "$out/batch$b.log" | tr -s ' ' || true)" >"$out/batch$b.result"
}
run_engine() {  # engine_cuda; its verdict waits for the async_pageable probe (the end, below)
  local start rc=0
  start=$(date +%s)
  run_sim "$out/engine_cuda.log" "$root/build/gpusim/examples/engine_cuda" || rc=$?
  echo "$rc $(( $(date +%s) - start ))" >"$out/engine_cuda.rc"
}
# The device Cache sharded over 2 MPI ranks against the unsharded CPU Cache
# (tests/dist/sharded_cache_cuda.cu): each rank a simulator process of its own.
run_sharded() {
  local start status
  start=$(date +%s)
  if run_sim_with "$out/sharded_cache.log" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       mpirun --oversubscribe -np 2 "$root/tools/gpusim-run.sh" "$prefix" \
       "$root/$sharded" "${KVPOLICY_GPUSIM_SHARDED_TRACES:-4}"; then status=passed; else status="FAILED (rc $?)"; fi
  printf 'gpusim: %-95s %s, %ss  %s\n' "dist: the sharded device Cache on 2 MPI ranks" "$status" \
    "$(( $(date +%s) - start ))" "$(grep -a -m1 'sharded device Cache' "$out/sharded_cache.log" || true)" >"$out/sharded_cache.result"
}
pool() {  # command...: runs it in the background once fewer than jobs_max jobs run
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  "$@" &
}
rm -f "$out"/case*.result "$out"/batch*.result "$out"/probe_*.result "$out"/sharded_cache.result "$out"/engine_cuda.rc
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # an interrupted check leaves no simulator behind
# The sharded test first, alone: its two ranks are two simulator processes, which would share the
# cores with the pool's jobs (one process each) and slow the pool's cases beside them.
has_sharded=0
if [ -x "$sharded" ] && command -v mpirun >/dev/null 2>&1; then
  has_sharded=1
  run_sharded
fi
# Then one pool of KVPOLICY_GPUSIM_JOBS jobs runs the rest: the longest case (about 4 minutes, bound
# by kernel launches) alone and first, so that the rest fills the other cores meanwhile; the probes;
# the batches; engine_cuda. The lines are printed at the end, in this order.
longest=() rest=()
for i in "${!cases[@]}"; do
  if [[ ${cases[$i]} == "evict_step keeps"* ]]; then longest+=("$i"); else rest+=("$i"); fi
done
batches=$(( (${#rest[@]} + per_batch - 1) / per_batch ))
b=0
if [ ${#longest[@]} -gt 0 ]; then
  b=$((b + 1))  # counted here, not in the background job's own shell
  pool run_batch "$b" "${longest[@]}"
fi
for probe in cvt_s64 reconverge async_pageable; do pool run_probe "$probe"; done
for ((j = 0; j < batches; ++j)); do
  members=()
  for ((k = j; k < ${#rest[@]}; k += batches)); do members+=("${rest[$k]}"); done
  b=$((b + 1))
  pool run_batch "$b" "${members[@]}"
done
pool run_engine
wait
for probe in cvt_s64 reconverge async_pageable; do
  if [ ! -f "$out/probe_$probe.result" ]; then echo "gpusim: probe $probe left no result" >&2; failed=1; continue; fi
  cat "$out/probe_$probe.result"
  if grep -q " FAILED (rc" "$out/probe_$probe.result"; then failed=1; fi
done
async_fault=0
grep -q "shows the simulator's fault" "$out/probe_async_pageable.result" 2>/dev/null && async_fault=1
n=${#cases[@]}
for i in $(seq 1 "$n"); do
  if [ ! -f "$out/case$i.result" ]; then
    echo "gpusim: case $i (${cases[$((i - 1))]}) left no result" >&2; failed=1; continue
  fi
  cat "$out/case$i.result"
  if ! grep -q " passed, [0-9]*s$" "$out/case$i.result"; then failed=1; fi
done
cat "$out"/batch*.result
trap - EXIT

read -r engine_rc engine_seconds <"$out/engine_cuda.rc" || { engine_rc=1; engine_seconds=0; }
if [ "$engine_rc" = 0 ]; then
  status=passed
elif [ $async_fault = 1 ] && ! grep -q "Syntax error" "$out/engine_cuda.log"; then
  status="expected failure (the simulator's async-copy fault: tests/cuda/probes/async_pageable.cu)"
else
  status="FAILED"; failed=1
fi
printf 'gpusim: %-95s %s, %ss  %s\n' "examples/engine_cuda" "$status" "$engine_seconds" \
  "$(grep -m1 'keep the same' "$out/engine_cuda.log" || true)"
if [ $has_sharded = 1 ]; then
  cat "$out/sharded_cache.result"
  grep -q " passed, " "$out/sharded_cache.result" || failed=1
else
  echo "gpusim: dist: the sharded device Cache SKIPPED (no OpenMPI: tools/install-deps.sh installs it)"
fi

if [ $failed -ne 0 ]; then
  echo "gpusim: FAILED (logs in $out)" >&2
  exit 1
fi
echo "gpusim: every GPU test case passed under GPGPU-Sim (functional mode; simulated, not a GPU)"
