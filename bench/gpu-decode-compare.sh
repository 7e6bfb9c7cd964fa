#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, Nsight Compute (ncu) and PyTorch: kvpolicy's paged decode attention
# against FlashInfer's and PyTorch's SDPA-flash on the same shapes, in one session, timed two ways
# (docs/perf.md, "Decode against FlashInfer"):
#   - kernel time: ncu's duration of every kernel one call launches, summed (bench/ncu_kernel_time.py);
#   - CUDA-graph replay of one call with the L2 rotated (bench_cuda.cu, bench/torch_reference.py);
# with the copy bandwidth, the split sweep, and, with --profile, ncu's full section set for the
# decode kernels of both at 64 MiB and 256 MiB of K+V. Writes everything under OUT (default
# build/gpu/compare) and prints the table (bench/decode_table.py).
#   bench/gpu-decode-compare.sh [--profile] [--prefix P] [--no-peers] BENCH_BINARY [FLASHINFER_SDIST]
# FLASHINFER_SDIST: flashinfer_python-0.2.5.tar.gz (`pip download --no-deps --no-binary :all:
# flashinfer-python==0.2.5`); it is laid out under /tmp as flashinfer/jit/env.py expects and its
# tensor-core decode JIT-compiles at the first plan. Without it, the FlashInfer columns are empty.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=0 prefix="" peers=1
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=1; shift ;;
    --prefix) prefix="$2"; shift 2 ;;
    --no-peers) peers=0; shift ;;
    *) break ;;
  esac
done
bench=$(realpath "$1"); sdist=${2:-}
out=${OUT:-build/gpu/compare}
mkdir -p "$out"
sizes=256,512,1024,2048,4096,8192,16384,32768,65536
if [ -n "$sdist" ] && [ ! -d /tmp/flashinfer-pkg/flashinfer ]; then
  src=/tmp/flashinfer-src pkg=/tmp/flashinfer-pkg/flashinfer
  mkdir -p "$src" "$pkg/data/cutlass/tools/util"
  tar xzf "$sdist" -C "$src" --strip-components=1
  cp -r "$src/flashinfer/." "$pkg/"
  cp -r "$src/include" "$src/csrc" "$src/tvm_binding" "$pkg/data/"
  cp -r "$src/3rdparty/cutlass/include" "$pkg/data/cutlass/"
  cp -r "$src/3rdparty/cutlass/tools/util/include" "$pkg/data/cutlass/tools/util/"
fi
[ -n "$sdist" ] && export PYTHONPATH=/tmp/flashinfer-pkg${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_WORKSPACE_BASE=/tmp \
  TORCH_CUDA_ARCH_LIST=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1) MAX_JOBS=$(nproc)

echo "== kvpolicy: copy, decode (events and graph replay), 3 repetitions"
"$bench" --benchmark_filter='^BM_copy|^BM_decode_attention/|^BM_decode_attention_graph/' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out="$out/${prefix}bench.json" --benchmark_out_format=json >/dev/null
echo "== kvpolicy: kernel time (ncu)"
ncu --metrics gpu__time_duration.sum -f -o "$out/${prefix}ncu_kvpolicy" "$bench" --once=$sizes >"$out/${prefix}once.log"
ncu --import "$out/${prefix}ncu_kvpolicy.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum --print-units base \
  >"$out/${prefix}ncu_kvpolicy.csv"
python3 bench/ncu_kernel_time.py "$out/${prefix}ncu_kvpolicy.csv" --marker ncu_marker_kernel --labels $sizes \
  >"$out/${prefix}ncu_kvpolicy.jsonl"
[ "$peers" = 1 ] || { echo "gpu-decode-compare: $out/${prefix}{bench.json,ncu_kvpolicy.jsonl}"; exit 0; }

echo "== kvpolicy: the split sweep (graph replay)"
"$bench" --benchmark_filter='^BM_decode_split/' --benchmark_out="$out/${prefix}sweep.json" --benchmark_out_format=json >/dev/null
echo "== peers: SDPA-flash and FlashInfer (events and graph replay), torch.topk, copy"
python3 bench/torch_reference.py >"$out/${prefix}torch.json"
echo "== peers: kernel time (ncu)"
python3 bench/torch_reference.py --once $sizes >/dev/null  # the JIT modules built before ncu runs
ncu --metrics gpu__time_duration.sum -f -o "$out/${prefix}ncu_peers" python3 bench/torch_reference.py --once $sizes \
  >"$out/${prefix}once_peers.log"
ncu --import "$out/${prefix}ncu_peers.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum --print-units base \
  >"$out/${prefix}ncu_peers.csv"
python3 bench/ncu_kernel_time.py "$out/${prefix}ncu_peers.csv" --marker spin_kernel --labels-json "$out/${prefix}once_peers.log" \
  >"$out/${prefix}ncu_peers.jsonl"
python3 bench/decode_table.py "$out/${prefix}bench.json" "$out/${prefix}torch.json" "$out/${prefix}ncu_kvpolicy.jsonl" \
  "$out/${prefix}ncu_peers.jsonl" "$out/${prefix}sweep.json" | tee "$out/${prefix}decode_table.md"

if [ "$profile" = 1 ]; then
  echo "== ncu, full section set: the decode kernels of both at 64 MiB and 256 MiB"
  ncu --set full --kernel-name regex:'decode_mma_kernel' -f -o "$out/${prefix}profile_kvpolicy" "$bench" --once=2048,8192 >/dev/null
  ncu --set full --kernel-name regex:'Prefill|MergeStates' -f -o "$out/${prefix}profile_flashinfer" \
    python3 bench/torch_reference.py --once 2048,8192 >/dev/null
  for r in kvpolicy flashinfer; do
    ncu --import "$out/${prefix}profile_$r.ncu-rep" --page details >"$out/${prefix}profile_$r.txt"
  done
fi
