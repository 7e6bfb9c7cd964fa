#!/usr/bin/env bash
# kvpolicy-lm --tp 3 under mpirun against the unsharded run (issue 34, docs/distributed.md): SmolLM2's
# 3 kv heads on 3 ranks (3 query heads and a third of the MLP each, F32 weights), 128 tokens of
# GPL-3, one thread a rank. For every policy below the survivors' digest must be the same (the same
# entries in every (layer, kv head) at the end) and the perplexity the same within 1e-5 relative
# (the ranks' partial sums add in another order than one product). Both keep F32 K/V (--kv f32): in
# fp16 those last-bit differences of a key would sometimes round to another fp16 value, and a
# policy's choice between two near-equal scores could then differ.
#   tests/lm/tensor_parallel.sh KVPOLICY_LM MODEL_DIR MPIEXEC
set -euo pipefail
lm=$1 model=$2 mpiexec=$3
gates=$(cd "$(dirname "$0")/../../gates/smollm2-135m" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
args=(--model "$model" --text /usr/share/common-licenses/GPL-3 --tokens 128 --chunk 16 --threads 1 --kv f32)
status=0
check() {  # name, policy options...
  local name=$1; shift
  local one three
  one=$("$lm" "${args[@]}" --decode-weights f32 "$@")
  three=$("$mpiexec" --oversubscribe -np 3 "$lm" --tp 3 "${args[@]}" "$@")
  local p1 p3 s1 s3
  p1=$(sed -n 's/^ppl //p' <<<"$one"); p3=$(sed -n 's/^ppl //p' <<<"$three")
  s1=$(sed -n 's/^survivors //p' <<<"$one"); s3=$(sed -n 's/^survivors //p' <<<"$three")
  local verdict=same
  if [ -z "$s1" ] || [ "$s1" != "$s3" ] || ! awk -v a="$p1" -v b="$p3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-5 * a) }'; then
    verdict=DIFFERENT; status=1
  fi
  printf '%-34s ppl %s (1 rank) %s (3 ranks), survivors %s %s: %s\n' "$name" "$p1" "$p3" "$s1" "$s3" "$verdict"
}
check full --policy full
check "streamingllm M=32" --policy streamingllm --budget 32 --buffer 8 --sinks 4
check "trimkv M=32 (gate)" --policy trimkv --gate "$gates/trimkv.safetensors" --budget 32 --buffer 8 --sinks 4
check "dbtrimkv M=32 (gate, global)" --policy dbtrimkv --gate "$gates/dbtrimkv.safetensors" --budget 32 --buffer 8 --sinks 4
check "dbtrimkv M=32 floor 0.25" --policy dbtrimkv --gate "$gates/dbtrimkv.safetensors" --budget 32 --buffer 8 --floor 0.25
check "wgkv W=32 (gate)" --policy wgkv --gate "$gates/wgkv.safetensors" --local 32
check "wgkv W=32 avg-budget 16 (gate)" --policy wgkv --gate "$gates/wgkv.safetensors" --local 32 --avg-budget 16
check "snapkv M=64" --policy snapkv --budget 64 --prefill 96
check "adakv M=64" --policy adakv --budget 64 --prefill 96
check "kv-key M=32" --policy kv-key --budget 32
check "epikv M=32" --policy epikv --budget 32
exit $status
