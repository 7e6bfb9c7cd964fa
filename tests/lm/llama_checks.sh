#!/usr/bin/env bash
# kvpolicy-llama (llama.cpp's graph and cache under a token-level policy) against llama.cpp alone and
# against kvpolicy-lm --mode union on the same model and text (tests/lm/with_model.sh gives MODEL):
#   llama_checks.sh KVPOLICY_LLAMA KVPOLICY_LM MODEL GATES TEXT
# What llama.cpp holds is read from llama.cpp's own memory (kvpolicy-llama --check-memory: its
# sequence state and llama_memory_seq_pos_min/max, after every step equal to the policy's keep set;
# --survivors from that memory), never from the policy's side alone.
# 1. A budget the text never reaches: the logits are llama.cpp's own, bit for bit (one digest of
#    every logit's bits), with the evaluation callback and the policy running beside it.
# 2. StreamingLLM at M = 64 (4 sinks, B = 16): llama.cpp's memory holds at most M + B - 1 + one step
#    positions in a context of that many cells rounded up to 256 (llama.cpp pads n_ctx), and at the
#    end exactly the positions kvpolicy-lm keeps in union mode (positions decide alone, no score can
#    near-tie); ppl within 1%.
# 3. TRIM-KV and DBTrimKV with the committed gates at M = 128 (4 sinks, w = 1): ppl within 1% of
#    kvpolicy-lm's union mode, every head of kvpolicy-lm keeping the same positions, and the two
#    sets at least 95% the same counted from either side (their gates read llama.cpp's normed
#    inputs, which differ from kvpolicy-lm's in the last bits, so near-tied positions may go either
#    way).
# 4. TOVA, H2O and KeyDiff at M = 128, which rank by stored keys or the attention over them: their
#    Cache holds metadata only and reads llama.cpp's K cells (at most 5% of llama.cpp's K/V bytes),
#    and llama.cpp's memory holds exactly what each keeps after every step.
set -euo pipefail
llama=$1 lm=$2 model=$3 gates=$4 text=$5
# One thread each: ctest runs another entry beside this one, and llama.cpp's threads wait for each
# other spinning (a 768-token run took 75 s on two threads beside a busy core, 9 s on one).
llama_run() { "$llama" --threads 1 "$@"; }
gguf=$model/model.gguf
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
value() { sed -n "s/^$1 //p" "$2" | tail -n 1; }
within() {  # a b tolerance name: |a / b - 1| <= tolerance
  python3 -c "import sys; a, b, t = map(float, sys.argv[1:4]); d = abs(a / b - 1); print(f'{sys.argv[4]}: {a} vs {b} ({100 * d:.3f}%)'); sys.exit(d > t)" "$@"
}

llama_run --model "$gguf" --text "$text" --tokens 512 >"$out/alone.txt"
llama_run --model "$gguf" --text "$text" --tokens 512 --policy trimkv --gate "$gates/trimkv.safetensors" \
  --budget 4096 >"$out/unreached.txt"
a=$(value logits "$out/alone.txt") b=$(value logits "$out/unreached.txt")
echo "llama.cpp alone: logits $a; under trimkv, M = 4096 never reached: logits $b"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAILED: the logits differ from llama.cpp's own" >&2; exit 1; }

common=(--text "$text" --tokens 768 --sinks 4 --window 1)
llama_run --model "$gguf" "${common[@]}" --policy streamingllm --budget 64 --buffer 16 --check-memory \
  --survivors "$out/stream-llama.pos" >"$out/stream-llama.txt"
"$lm" --model "$model" "${common[@]}" --policy streamingllm --budget 64 --buffer 16 --mode union --threads 1 \
  --survivors "$out/stream-lm.pos" >"$out/stream-lm.txt"
cat "$out/stream-llama.txt"
grep -q "^llama.cpp memory: after each of 48 steps, exactly the positions the policy keeps$" "$out/stream-llama.txt" ||
  { echo "FAILED: kvpolicy-llama did not check llama.cpp's memory after each of the 48 steps" >&2; exit 1; }
held=$(sed -n "s/.*positions held at most \([0-9]*\), [0-9]* evicted (counted in llama.cpp's memory)$/\1/p" "$out/stream-llama.txt")
cells=$(sed -n 's/^llama.cpp context: \([0-9]*\) cells.*/\1/p' "$out/stream-llama.txt")
[ -n "$held" ] && [ "$held" -le $((64 + 16 - 1 + 16)) ] ||
  { echo "FAILED: llama.cpp held '$held' positions, over M + B - 1 + 16" >&2; exit 1; }
[ "$cells" = 256 ] || { echo "FAILED: llama.cpp's context has '$cells' cells, not M + B - 1 + 16 = 95 padded to 256" >&2; exit 1; }
cmp -s "$out/stream-llama.pos" "$out/stream-lm.pos" ||
  { echo "FAILED: llama.cpp's memory does not hold what kvpolicy-lm --mode union keeps" >&2;
    diff "$out/stream-llama.pos" "$out/stream-lm.pos" | head -n 4 >&2; exit 1; }
echo "survivors: llama.cpp's memory holds exactly kvpolicy-lm --mode union's $(($(head -n 1 "$out/stream-lm.pos" | wc -w) - 2)) positions in each of $(wc -l <"$out/stream-lm.pos") heads"
within "$(value ppl "$out/stream-llama.txt")" "$(value ppl "$out/stream-lm.txt")" 0.01 "streamingllm ppl"

for p in trimkv dbtrimkv; do
  llama_run --model "$gguf" "${common[@]}" --policy $p --gate "$gates/$p.safetensors" --budget 128 --check-memory \
    --survivors "$out/$p-llama.pos" >"$out/$p-llama.txt"
  grep -q "^llama.cpp memory: after each of 48 steps" "$out/$p-llama.txt" ||
    { echo "FAILED: $p: kvpolicy-llama did not check llama.cpp's memory after every step" >&2; exit 1; }
  "$lm" --model "$model" "${common[@]}" --policy $p --gate "$gates/$p.safetensors" --budget 128 --mode union \
    --threads 1 --survivors "$out/$p-lm.pos" >"$out/$p-lm.txt"
  within "$(value ppl "$out/$p-llama.txt")" "$(value ppl "$out/$p-lm.txt")" 0.01 "$p ppl"
  python3 - "$out/$p-llama.pos" "$out/$p-lm.pos" "$p" <<'PY'
import sys
heads = [[set(map(int, line.split()[2:])) for line in open(f)] for f in sys.argv[1:3]]
for f, h in zip(sys.argv[1:3], heads):
    if any(x != h[0] for x in h):
        sys.exit(f"FAILED: {f}: the heads keep different positions (SPEC 8: one decision per position)")
a, b = heads[0][0], heads[1][0]
print(f"{sys.argv[3]} survivors: {len(a & b)} positions in both, of {len(a)} in llama.cpp's memory and "
      f"{len(b)} kept by kvpolicy-lm")
# two-sided: a superset (llama.cpp failing to remove) fails as a subset does
sys.exit(len(a & b) < 0.95 * max(len(a), len(b)))
PY
done
# H2O, TOVA and KeyDiff rank by stored keys or the attention over them: their Cache reads llama.cpp's
# K cells and keeps each entry's metadata alone, and llama.cpp's memory holds exactly what it keeps
for p in tova h2o keydiff; do
  llama_run --model "$gguf" "${common[@]}" --policy $p --budget 128 --buffer 16 --check-memory >"$out/$p-llama.txt"
  grep -E "^policy state|^llama.cpp memory" "$out/$p-llama.txt"
  share=$(sed -n "s/^policy state (metadata only, reading llama.cpp's K cells): [0-9.]* MiB, \([0-9.]*\)% of llama.cpp's K\/V$/\1/p" "$out/$p-llama.txt")
  [ -n "$share" ] && python3 -c "import sys; sys.exit(float(sys.argv[1]) > 5.0)" "$share" ||
    { echo "FAILED: $p: kvpolicy-llama's policy state is not metadata alone within 5% of llama.cpp's K/V ('$share')" >&2; exit 1; }
  grep -q "^llama.cpp memory: after each of 48 steps" "$out/$p-llama.txt" ||
    { echo "FAILED: $p: kvpolicy-llama did not check llama.cpp's memory after every step" >&2; exit 1; }
done
echo "llama checks: passed"
