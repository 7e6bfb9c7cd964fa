#!/usr/bin/env bash
# docs/perf.md's kvpolicy-llama table: llama.cpp alone (its full cache) against llama.cpp under a
# token-level policy (kvpolicy-llama), one run each, at contexts of 1K, 4K and 8K tokens: the context
# in steps of 256 tokens, then 64 tokens decoded one a step; tokens/s of each part, llama.cpp's
# context cells and K/V memory, and the policy Cache's memory beside it. Run it on an idle machine.
#   tools/bench_llama_engine.sh [--contexts "1024 4096 8192"] [--threads 2] [--budget 256]
# The text: the licenses in /usr/share/common-licenses (GPL-3, GPL-2, LGPL-3, LGPL-2.1, Apache-2.0,
# MPL-2.0) one after another, about 25,000 tokens.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
contexts="1024 4096 8192" threads=2 budget=256
while [ $# -gt 0 ]; do
  case "$1" in
    --contexts) contexts=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    *) echo "usage: tools/bench_llama_engine.sh [--contexts LIST] [--threads N] [--budget M]" >&2; exit 2 ;;
  esac
done
llama=$root/build/default/examples/kvpolicy-llama
[ -x "$llama" ] || { echo "bench_llama_engine: build kvpolicy-llama first (tools/fetch-llama-cpp.sh, cmake --build --preset default)" >&2; exit 1; }
model=$("$root/tools/fetch-model.sh" | tail -n 1)
text=$(mktemp)
trap 'rm -f "$text"' EXIT
for f in GPL-3 GPL-2 LGPL-3 LGPL-2.1 Apache-2.0 MPL-2.0; do cat "/usr/share/common-licenses/$f"; done >"$text"
echo "| context | run | context tokens/s | decode tokens/s | llama.cpp cells | llama.cpp K/V MiB | policy cache MiB |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"
run() {  # context label args...
  local n=$1 label=$2; shift 2
  local log; log=$("$llama" --model "$model/model.gguf" --text "$text" --tokens "$n" --chunk 256 --generate 64 \
                   --threads "$threads" "$@")
  local ctx dec cells mib mirror
  ctx=$(sed -n 's/.*; context [0-9]* tokens, \([0-9.]*\) tokens\/s;.*/\1/p' <<<"$log")
  dec=$(sed -n 's/.*; decode [0-9]* tokens, \([0-9.]*\) tokens\/s$/\1/p' <<<"$log")
  cells=$(sed -n 's/^llama.cpp context: \([0-9]*\) cells (\([0-9.]*\) MiB.*/\1/p' <<<"$log")
  mib=$(sed -n 's/^llama.cpp context: \([0-9]*\) cells (\([0-9.]*\) MiB.*/\2/p' <<<"$log")
  mirror=$(sed -n 's/^policy cache (kvpolicy, F32 K\/V beside llama.cpp.s): \([0-9.]*\) MiB$/\1/p' <<<"$log")
  echo "| $n | $label | $ctx | $dec | $cells | $mib | ${mirror:-0} |"
}
for n in $contexts; do
  run "$n" "llama.cpp alone (full cache)"
  run "$n" "trimkv, M = $budget tokens" --policy trimkv --gate "$root/gates/smollm2-135m/trimkv.safetensors" \
    --budget "$budget" --buffer 32 --sinks 4
  run "$n" "streamingllm, M = $budget tokens" --policy streamingllm --budget "$budget" --buffer 32 --sinks 4
done
