#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and Nsight Compute: profiles one launch of the paged decode
# attention kernel (2 GiB of fp16 K+V, the largest shape of bench/bench_cuda.cu) and one of the
# segmented top-K, with ncu's full section set, and writes each report and its details page:
#   tools/gpu-profile.sh [BENCH_BINARY] [OUT_DIR]
# (defaults build/gpu/bench/kvpolicy_bench_cuda and $OUT or build/gpu/profile). The clocks are left
# as the driver sets them (--clock-control none), so the counters describe the kernel as the
# benchmark times it; ncu flushes the caches before the profiled launch.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:-build/gpu/bench/kvpolicy_bench_cuda}
out=${2:-${OUT:-build/gpu/profile}}
mkdir -p "$out"
[ -x "$bench" ] || { echo "gpu-profile: $bench is not built (tools/gpu-check.sh builds it)" >&2; exit 1; }
profile() {  # name kernel-regex benchmark-filter
  # google-benchmark names a manually timed case NAME/ARG/manual_time: the filter matches its prefix
  ncu --clock-control none --kernel-name "regex:$2" --launch-count 1 --set full -f -o "$out/$1" \
    "$bench" --benchmark_filter="$3" --benchmark_min_time=0.01
  ncu -i "$out/$1.ncu-rep" --page details >"$out/$1.txt"
  grep -q "Section: Memory Workload Analysis" "$out/$1.txt" || { echo "gpu-profile: $1: no kernel was profiled" >&2; exit 1; }
}
profile decode_2g decode_partial_kernel '^BM_decode_attention/65536/'
profile segmented_topk segmented_select_kernel '^BM_segmented_topk/'
echo "gpu-profile: $out/decode_2g.txt, $out/segmented_topk.txt"
