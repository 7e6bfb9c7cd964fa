#!/usr/bin/env bash
# kvpolicy-llama (llama.cpp's graph and cache under a token-level policy) against llama.cpp alone and
# against kvpolicy-lm --mode union on the same model and text (tests/lm/with_model.sh gives MODEL):
#   llama_checks.sh KVPOLICY_LLAMA KVPOLICY_LM MODEL GATES TEXT
# 1. A budget the text never reaches: the logits are llama.cpp's own, bit for bit (one digest of
#    every logit's bits), with the evaluation callback and the policy running beside it.
# 2. StreamingLLM at M = 64 (4 sinks, B = 16): llama.cpp's context is bounded by the budget (the
#    positions held never pass M + B - 1 + one step), the survivors are kvpolicy-lm's in union mode
#    exactly (positions decide alone, no score can near-tie), ppl within 1%.
# 3. TRIM-KV and DBTrimKV with the committed gates at M = 128 (4 sinks, w = 1): ppl within 1% of
#    kvpolicy-lm's union mode, every head keeping the same positions in both, and at least 95% of
#    them the same positions in both (their gates read llama.cpp's normed inputs, which differ from
#    kvpolicy-lm's in the last bits, so near-tied positions may go either way).
set -euo pipefail
llama=$1 lm=$2 model=$3 gates=$4 text=$5
gguf=$model/model.gguf
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
value() { sed -n "s/^$1 //p" "$2" | tail -n 1; }
within() {  # a b tolerance name: |a / b - 1| <= tolerance
  python3 -c "import sys; a, b, t = map(float, sys.argv[1:4]); d = abs(a / b - 1); print(f'{sys.argv[4]}: {a} vs {b} ({100 * d:.3f}%)'); sys.exit(d > t)" "$@"
}

"$llama" --model "$gguf" --text "$text" --tokens 512 >"$out/alone.txt"
"$llama" --model "$gguf" --text "$text" --tokens 512 --policy trimkv --gate "$gates/trimkv.safetensors" \
  --budget 4096 >"$out/unreached.txt"
a=$(value logits "$out/alone.txt") b=$(value logits "$out/unreached.txt")
echo "llama.cpp alone: logits $a; under trimkv, M = 4096 never reached: logits $b"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAILED: the logits differ from llama.cpp's own" >&2; exit 1; }

common=(--text "$text" --tokens 768 --sinks 4 --window 1)
"$llama" --model "$gguf" "${common[@]}" --policy streamingllm --budget 64 --buffer 16 >"$out/stream-llama.txt"
"$lm" --model "$model" "${common[@]}" --policy streamingllm --budget 64 --buffer 16 --mode union --threads 2 \
  >"$out/stream-lm.txt"
cat "$out/stream-llama.txt"
held=$(sed -n 's/.*positions held at most \([0-9]*\),.*/\1/p' "$out/stream-llama.txt")
[ "$held" -le $((64 + 16 - 1 + 16)) ] || { echo "FAILED: llama.cpp held $held positions, over M + B - 1 + 16" >&2; exit 1; }
a=$(value survivors "$out/stream-llama.txt") b=$(value survivors "$out/stream-lm.txt")
echo "survivors: kvpolicy-llama $a, kvpolicy-lm --mode union $b"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAILED: the survivors differ" >&2; exit 1; }
within "$(value ppl "$out/stream-llama.txt")" "$(value ppl "$out/stream-lm.txt")" 0.01 "streamingllm ppl"

for p in trimkv dbtrimkv; do
  "$llama" --model "$gguf" "${common[@]}" --policy $p --gate "$gates/$p.safetensors" --budget 128 \
    --survivors "$out/$p-llama.pos" >"$out/$p-llama.txt"
  "$lm" --model "$model" "${common[@]}" --policy $p --gate "$gates/$p.safetensors" --budget 128 --mode union \
    --threads 2 --survivors "$out/$p-lm.pos" >"$out/$p-lm.txt"
  within "$(value ppl "$out/$p-llama.txt")" "$(value ppl "$out/$p-lm.txt")" 0.01 "$p ppl"
  python3 - "$out/$p-llama.pos" "$out/$p-lm.pos" "$p" <<'PY'
import sys
heads = [[set(map(int, line.split()[2:])) for line in open(f)] for f in sys.argv[1:3]]
for f, h in zip(sys.argv[1:3], heads):
    if any(x != h[0] for x in h):
        sys.exit(f"FAILED: {f}: the heads keep different positions (SPEC 8: one decision per position)")
a, b = heads[0][0], heads[1][0]
print(f"{sys.argv[3]} survivors: {len(a & b)} of {len(b)} positions the same in both")
sys.exit(len(a & b) < 0.95 * len(b))
PY
done
echo "llama checks: passed"
