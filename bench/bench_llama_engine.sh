#!/usr/bin/env bash
# docs/perf.md's kvpolicy-llama table: llama.cpp alone (its full cache) against llama.cpp under a
# token-level policy (kvpolicy-llama), at contexts of 1K, 4K and 8K tokens: the context in steps of
# 256 tokens, then 64 tokens decoded one a step. The runs alternate (alone, trimkv, streamingllm,
# tova, alone, ...) --repeats times and each cell is the median: tokens/s of each part, llama.cpp's
# cells and K/V memory, the policy's state beside it, the total, and the seconds of the policy's own
# per-step work (inputs, gate, scores, selection, removal). TOVA stands for the policies that read
# llama.cpp's K cells (the attention of each step's last query over them). Run it on an idle machine.
#   bench/bench_llama_engine.sh [--contexts "1024 4096 8192"] [--threads 2] [--budget 256] [--repeats 3]
#                               [--llama PATH]   (default build/default/apps/kvpolicy-llama)
# The text: the licenses in /usr/share/common-licenses (GPL-3, GPL-2, LGPL-3, LGPL-2.1, Apache-2.0,
# MPL-2.0) one after another, about 25,000 tokens.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
contexts="1024 4096 8192" threads=2 budget=256 repeats=3 llama=$root/build/default/apps/kvpolicy-llama
while [ $# -gt 0 ]; do
  case "$1" in
    --contexts) contexts=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --llama) llama=$2; shift 2 ;;
    *) echo "usage: bench/bench_llama_engine.sh [--contexts LIST] [--threads N] [--budget M] [--repeats R] [--llama PATH]" >&2; exit 2 ;;
  esac
done
[ -x "$llama" ] || { echo "bench_llama_engine: build kvpolicy-llama first (tools/fetch-llama-cpp.sh, cmake --build --preset default)" >&2; exit 1; }
model=$("$root/tools/fetch-model.sh" | tail -n 1)
text=$(mktemp)
trap 'rm -f "$text"' EXIT
for f in GPL-3 GPL-2 LGPL-3 LGPL-2.1 Apache-2.0 MPL-2.0; do cat "/usr/share/common-licenses/$f"; done >"$text"
echo "| context | run | context tokens/s | decode tokens/s | llama.cpp cells | llama.cpp K/V MiB | policy state MiB | total MiB | policy s |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
declare -A ctx dec cells mib state secs
one() {  # key args...: one run, its numbers appended under key
  local key=$1; shift
  local log; log=$("$llama" --model "$model/model.gguf" --text "$text" --tokens "${key%%|*}" --chunk 256 --generate 64 \
                   --threads "$threads" "$@")
  ctx[$key]+=" $(sed -n 's/.*; context [0-9]* tokens, \([0-9.]*\) tokens\/s;.*/\1/p' <<<"$log")"
  dec[$key]+=" $(sed -n 's/.*; decode [0-9]* tokens, \([0-9.]*\) tokens\/s$/\1/p' <<<"$log")"
  cells[$key]=$(sed -n 's/^llama.cpp context: \([0-9]*\) cells (\([0-9.]*\) MiB.*/\1/p' <<<"$log")
  mib[$key]=$(sed -n 's/^llama.cpp context: \([0-9]*\) cells (\([0-9.]*\) MiB.*/\2/p' <<<"$log")
  local s; s=$(sed -n 's/^policy state ([^)]*): \([0-9.]*\) MiB.*/\1/p' <<<"$log")
  state[$key]=${s:-0}
  s=$(sed -n 's/^policy time: \([0-9.]*\) s of.*/\1/p' <<<"$log")
  secs[$key]+=" ${s:-0}"
}
runs=("llama.cpp alone (full cache)|"
      "trimkv, M = $budget tokens|--policy trimkv --gate $root/gates/smollm2-135m/trimkv.safetensors --budget $budget --buffer 32 --sinks 4"
      "streamingllm, M = $budget tokens|--policy streamingllm --budget $budget --buffer 32 --sinks 4"
      "tova, M = $budget tokens|--policy tova --budget $budget --buffer 32 --sinks 4")
for n in $contexts; do
  for ((r = 0; r < repeats; ++r)); do
    for run in "${runs[@]}"; do
      # shellcheck disable=SC2086  # the run's flags split on spaces
      one "$n|${run%%|*}" ${run#*|}
    done
  done
  for run in "${runs[@]}"; do
    key="$n|${run%%|*}"
    total=$(awk -v a="${mib[$key]}" -v b="${state[$key]}" 'BEGIN {printf "%.2f", a + b}')
    echo "| $n | ${run%%|*} | $(median <<<"${ctx[$key]}") | $(median <<<"${dec[$key]}") | ${cells[$key]} | ${mib[$key]} |" \
         "${state[$key]} | $total | $(median <<<"${secs[$key]}") |"
  done
done
