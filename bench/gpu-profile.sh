#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and Nsight Compute: profiles one launch of each paged decode
# attention kernel (2 GiB of fp16 K+V, the largest shape of bench/bench_cuda.cu: the tensor-core
# kernel an engine gets on sm_80+, and the CUDA-core one) and one of the segmented top-K, with ncu's
# full section set, and writes each report, its details page and its warp stall reasons:
#   bench/gpu-profile.sh [BENCH_BINARY] [OUT_DIR]
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
  # cycles a warp spends stalled per issued instruction, by reason (the largest first)
  ncu -i "$out/$1.ncu-rep" --page raw --csv --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
    | python3 -c 'import csv, sys
def number(v):
    try: return float(v.replace(",", ""))
    except ValueError: return -1.0
rows = list(csv.reader(sys.stdin)); head, vals = rows[0], rows[-1]
pairs = sorted(((number(v), h) for h, v in zip(head, vals) if "stalled" in h), reverse=True)
print("\n".join(f"{v:8.3f}  {h}" for v, h in pairs if v > 0))' >"$out/$1.stalls.txt"
}
profile decode_mma_2g decode_mma_kernel '^BM_decode_attention/65536/'
profile decode_cuda_cores_2g decode_partial_kernel '^BM_decode_attention_cuda_cores/65536/'
profile segmented_topk segmented_select_kernel '^BM_segmented_topk/'
echo "gpu-profile: $out/{decode_mma_2g,decode_cuda_cores_2g,segmented_topk}.{txt,stalls.txt}"
