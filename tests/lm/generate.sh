#!/usr/bin/env bash
# kvpolicy-lm's budgeted generation (tests/lm/with_model.sh gives MODEL): two prompts in one pool,
# 128 tokens each under StreamingLLM at M = 64, B = 8. It must exit 0, print both continuations, and
# hold what SPEC §1's trigger (every per-head evictor's) says: a head evicts to M when it reaches
# M + B, so after n tokens (n >= M + B) it holds M + (n - M) mod B, the sequence L * Hkv times that.
#   generate.sh KVPOLICY_LM MODEL
set -euo pipefail
lm=$1 model=$2
M=64 B=8
rc=0
out=$("$lm" --model "$model" --threads 1 --policy streamingllm --budget $M --buffer $B --generate 128 \
  --prompt "The GNU General Public License is" --prompt "Once upon a time, there was") || rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAILED: kvpolicy-lm exited with status $rc" >&2; exit 1; }
GENERATED=$out python3 - "$model/config.json" $M $B <<'PY'
import json, os, re, sys
config = json.load(open(sys.argv[1]))
L, Hkv, M, B = config["layers"], config["kv_heads"], int(sys.argv[2]), int(sys.argv[3])
rows = re.findall(r"^\[(\d)\] policy streamingllm: (\d+) tokens, (\d+) entries held$", os.environ["GENERATED"], re.M)
if [r[0] for r in rows] != ["0", "1"]:
    sys.exit(f"FAILED: expected a policy line for each of the 2 prompts, got {rows}")
for s, n, held in rows:
    n, held = int(n), int(held)
    if n < M + B:
        sys.exit(f"FAILED: [{s}] {n} tokens never reached M + B = {M + B}")
    want = L * Hkv * (M + (n - M) % B)
    if held != want:
        sys.exit(f"FAILED: [{s}] {held} entries held after {n} tokens; SPEC §1 gives L * Hkv * (M + (n - M) mod B) = {want}")
    print(f"[{s}] {n} tokens: {held} entries held, as SPEC §1 gives")
PY
