#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds the CUDA path for this GPU, runs the GPU tests (plainly,
# then under compute-sanitizer memcheck), runs the GPU benchmarks (5 repetitions, medians) and
# runs bench/torch_reference.py (PyTorch baselines) where torch is installed, and prints the results
# table that docs/perf.md records. Needs what tools/install-deps.sh installs,
# plus nvcc and compute-sanitizer from the CUDA toolkit.
#   tools/gpu-check.sh [build-dir]        (default build/gpu; OUT=dir also keeps the raw JSON there)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/gpu}
out=${OUT:-$build}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPOLICY_BUILD_TESTS=ON -DKVPOLICY_BUILD_EXAMPLES=ON \
      -DKVPOLICY_BUILD_BENCHMARKS=ON -DCMAKE_CUDA_ARCHITECTURES=native
cmake --build "$build" --target kvpolicy_cuda_tests kvpolicy_bench_cuda

echo "== GPU tests"
"$build/tests/cuda/kvpolicy_cuda_tests" --host-only
"$build/tests/cuda/kvpolicy_cuda_tests" 2>&1 | tee "$out/gpu_tests.txt"

echo "== GPU tests under compute-sanitizer memcheck (the 64K-entry and full-size cases left out for time)"
compute-sanitizer --tool memcheck --error-exitcode 1 --leak-check full \
  "$build/tests/cuda/kvpolicy_cuda_tests" --test-case-exclude='*64K*,*DBTrimKV*' 2>&1 | tee "$out/memcheck.txt"

echo "== GPU benchmarks"
"$build/bench/kvpolicy_bench_cuda" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/bench_cuda.json" --benchmark_out_format=json
echo "== PyTorch baselines on the same shapes (SDPA-flash, torch.topk), when torch is installed"
ref=()
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 bench/torch_reference.py >"$out/torch.json" && ref=("$out/torch.json")
else
  echo "torch with CUDA not importable: no PyTorch columns"
fi
python3 bench/gpu_table.py "$out/bench_cuda.json" "${ref[@]}" | tee "$out/table.md"
