#!/usr/bin/env bash
# The committed SmolLM2 gates (gates/smollm2-135m, docs/training.md) load in kvpolicy-lm unchanged
# and do what they were trained for, on the first 512 tokens of GPL-3 (never trained on), one
# thread: TRIM-KV and DBTrimKV at M = 64 with 4 sinks keep a lower perplexity than StreamingLLM
# with 4 sinks at the same memory (the same binary and input give the same numbers every run);
# WG-KV with a ring of 64 runs and holds fewer entries than the full cache; each file's token-level
# gate (--mode union) loads and gives a finite perplexity; TRIM-KV's threshold budget keeps each head's floor
# (SPEC §1: every head at least its min_tokens best), which binds where the threshold alone keeps less.
#   tests/lm/trained_gates.sh KVPOLICY_LM MODEL_DIR
set -euo pipefail
lm=$1 model=$2
gates=$(cd "$(dirname "$0")/../../gates/smollm2-135m" && pwd)
text=/usr/share/common-licenses/GPL-3
run() { "$lm" --model "$model" --text "$text" --tokens 512 --chunk 16 --threads 1 "$@"; }
ppl() { sed -n 's/^ppl //p' <<<"$1"; }
base=$(run --policy streamingllm --budget 64 --buffer 16 --sinks 4)
status=0
for p in trimkv dbtrimkv; do
  out=$(run --policy $p --gate "$gates/$p.safetensors" --budget 64 --buffer 16 --sinks 4)
  echo "$p M = 64 + 4 sinks: ppl $(ppl "$out"); streamingllm: $(ppl "$base")"
  if ! awk -v a="$(ppl "$out")" -v b="$(ppl "$base")" 'BEGIN { exit !(a > 0 && a < b) }'; then
    echo "FAIL: $p with its trained gate is not below StreamingLLM at the same memory"
    status=1
  fi
done
out=$(run --policy wgkv --gate "$gates/wgkv.safetensors" --local 64)
held=$(sed -n 's/^entries held: peak [0-9]*, final \([0-9]*\) of \([0-9]*\).*/\1 \2/p' <<<"$out")
echo "wgkv W_local = 64: ppl $(ppl "$out"), entries held (final, of full) $held"
if ! awk -v h="$held" -v p="$(ppl "$out")" 'BEGIN { split(h, x, " "); exit !(p > 0 && x[1] < x[2]) }'; then
  echo "FAIL: wgkv with its trained gate held every entry or gave no perplexity"
  status=1
fi
# the token-level mode (SPEC §8) reads each file's token-level gate: it loads and runs
for p in trimkv dbtrimkv; do
  out=$(run --policy $p --gate "$gates/$p.safetensors" --budget 64 --buffer 16 --sinks 4 --mode union)
  echo "$p --mode union (its token-level gate) M = 64 + 4 sinks: ppl $(ppl "$out")"
  if ! awk -v p="$(ppl "$out")" 'BEGIN { exit !(p > 0 && p < 1e4) }'; then
    echo "FAIL: $p's token-level gate gave no finite perplexity"
    status=1
  fi
done
# the threshold budget (SPEC §1): alpha 0.9 alone leaves some head under 32 entries; with
# --min-tokens 32 every head holds at least 32, and the cache still fewer than the full one
fewest() { awk '{ if (min == "" || NF - 2 < min) min = NF - 2 } END { print min }' "$1"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run --policy trimkv --gate "$gates/trimkv.safetensors" --threshold 0.9 --sinks 4 --survivors "$work/alone" >/dev/null
out=$(run --policy trimkv --gate "$gates/trimkv.safetensors" --threshold 0.9 --sinks 4 --min-tokens 32 --survivors "$work/floor")
held=$(sed -n 's/^entries held: peak [0-9]*, final \([0-9]*\) of \([0-9]*\).*/\1 \2/p' <<<"$out")
echo "trimkv threshold 0.9: fewest entries in a head $(fewest "$work/alone") alone, $(fewest "$work/floor") with" \
     "--min-tokens 32 (ppl $(ppl "$out"), entries held (final, of full) $held)"
if ! awk -v a="$(fewest "$work/alone")" -v f="$(fewest "$work/floor")" -v h="$held" -v p="$(ppl "$out")" \
     'BEGIN { split(h, x, " "); exit !(a < 32 && f >= 32 && x[1] < x[2] && p > 0 && p < 1e4) }'; then
  echo "FAIL: the threshold's floor did not bind, or did not hold every head at 32 entries"
  status=1
fi
exit $status
