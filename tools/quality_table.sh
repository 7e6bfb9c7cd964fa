#!/usr/bin/env bash
# docs/quality.md's table: perplexity of SmolLM2-135M on the first 2,048 tokens of
# /usr/share/common-licenses/GPL-3 under every policy at M in {64, 128, 256, 512} per
# (layer, kv head), each with and without 4 protected sinks, against the full cache. Eviction is
# decided inside kvpolicy-lm's own loop: a 16-token first step (the prompt), then 16-token steps
# (SnapKV compresses a prompt: its prompt is the first 1,024 tokens). One thread per run.
#   tools/quality_table.sh [OUT_DIR] [--budgets "64 128 256 512"] [--append] [--only "epikv hs-var"]
#                          [--text FILE] [--gates DIR] [--mode union] [--sinks "0 4"] [--window W]
# (default OUT_DIR build/lm/quality: results.csv, quality.png). --append adds the budgets' rows to an
# existing results.csv (the full cache is not run again), so a long table can be made in parts;
# --only runs just the policies it names. The learned policies run with the gates in DIR (default
# gates/smollm2-135m, tools/train-gates.sh): trimkv and dbtrimkv (its global budget L * Hkv * M, equal
# total memory) with and without sinks, wgkv with its ring W_local = M (tau 0.1; what it holds
# beyond the ring is what its gate admits: the entries columns). --mode union runs the policies that
# have a token-level mode in it (SPEC §8; rows named POLICY/union) and skips the others; --sinks
# names the sink settings run where a policy takes both a buffer and sinks (default both, 0 and 4).
# --window W protects the W newest entries of every head (SPEC §1, sliding-window protection) in the
# policies that take a window (rows named POLICY/wW) and skips the others.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build/lm/quality budgets="64 128 256 512" append=0 only=""
text=/usr/share/common-licenses/GPL-3 gates=$root/gates/smollm2-135m mode=per-head sink_runs="0 4" window=0
while [ $# -gt 0 ]; do
  case "$1" in
    --budgets) budgets=$2; shift 2 ;;
    --append) append=1; shift ;;
    --only) only=" $2 "; shift 2 ;;
    --text) text=$2; shift 2 ;;
    --gates) gates=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --sinks) sink_runs=$2; shift 2 ;;
    --window) window=$2; shift 2 ;;
    *) out=$1; shift ;;
  esac
done
[[ "$window" =~ ^[0-9]+$ ]] || { echo "quality_table: --window '$window' is not a count of entries" >&2; exit 2; }
mkdir -p "$out"
lm=$root/build/default/apps/kvpolicy-lm
[ -x "$lm" ] || { echo "quality_table: build kvpolicy-lm first (cmake --build --preset default)" >&2; exit 1; }
model=$("$root/tools/fetch-model.sh" | tail -n 1)
csv=$out/results.csv
if [ $append -eq 0 ] || [ ! -s "$csv" ]; then
  echo "policy,budget,sinks,ppl,peak_entries,final_entries,seconds,mean_entries" >"$csv"
  append=0
fi
run() {  # policy budget sinks extra-args...
  local p=$1 m=$2 s=$3; shift 3
  [ -z "$only" ] || [[ "$only" == *" $p "* ]] || return 0
  # F32 K/V, as docs/quality.md's table was made (kvpolicy-lm's default is F16 since 0.21.0)
  local log rc=0
  log=$("$lm" --model "$model" --text "$text" --tokens 2048 --score-from 1 --chunk 16 --threads 1 \
        --kv f32 --policy "$p" "$@" 2>/tmp/quality_table.$$.err) || rc=$?
  if [ $rc -ne 0 ]; then  # 2: the policy refused this configuration (e.g. sinks and window over M): skip the row
    cat /tmp/quality_table.$$.err >&2; rm -f /tmp/quality_table.$$.err
    [ $rc -eq 2 ] && { echo "quality_table: skipped $p M = $m" >&2; return 0; }
    exit $rc
  fi
  rm -f /tmp/quality_table.$$.err
  local ppl peak final secs mean
  ppl=$(grep '^ppl ' <<<"$log" | cut -d' ' -f2)
  peak=$(sed -n 's/^entries held: peak \([0-9]*\), final \([0-9]*\) .*/\1/p' <<<"$log")
  final=$(sed -n 's/^entries held: peak \([0-9]*\), final \([0-9]*\) .*/\2/p' <<<"$log")
  secs=$(sed -n 's/.*; \([0-9.]*\) s, .*/\1/p' <<<"$log")
  mean=$(sed -n 's/^entries held on average: //p' <<<"$log")
  local name=$p
  [[ " $* " == *" --mode union "* ]] && name=$p/union
  [[ " $* " == *" --window "* ]] && name=$name/w$window
  echo "$name,$m,$s,$ppl,$peak,$final,$secs,$mean" | tee -a "$csv"
}
# Every registered policy (kvpolicy-lm --list-policies: name, options, inputs, prompt, device), with the
# options it takes: M as --budget (or as the ring --local of a policy without a budget), B = 16
# where it has a buffer, and 0 and 4 sinks where it has both (a per-head or global budget with a
# trigger). A policy without options is the reference row; a gated one runs with its gate from
# $gates when there is one; a prompt-compressing one gets a 1,024-token prompt.
policies=$("$lm" --list-policies)
has() { [[ ",$1," == *",$2,"* ]]; }
while IFS=$'\t' read -r p opts inputs prompt device; do
  [ "$opts" = "-" ] && [ $append -eq 0 ] && run "$p" 1 0
done <<<"$policies"
for m in $budgets; do
  while IFS=$'\t' read -r p opts inputs prompt device; do
    [ "$opts" != "-" ] || continue
    args=()
    if has "$opts" budget; then args+=(--budget "$m"); elif has "$opts" local; then args+=(--local "$m"); fi
    has "$opts" buffer && args+=(--buffer 16)
    [ "$prompt" = "prompt" ] && args+=(--prefill 1024)
    if has "$opts" gate; then
      [ -f "$gates/$p.safetensors" ] || continue
      args+=(--gate "$gates/$p.safetensors")
    fi
    if [ "$mode" = union ]; then has "$opts" mode && args+=(--mode union) || continue; fi
    if [ "$window" -gt 0 ]; then has "$opts" window && args+=(--window "$window") || continue; fi
    has "$opts" sinks && args+=(--sinks 0)  # explicit: a policy's default may protect some (StreamingLLM's 4)
    if has "$opts" buffer && has "$opts" sinks; then
      [[ " $sink_runs " == *" 0 "* ]] && run "$p" "$m" 0 "${args[@]}"
      [[ " $sink_runs " == *" 4 "* ]] && run "$p" "$m" 4 "${args[@]}" --sinks 4
    else
      run "$p" "$m" 0 "${args[@]}"
    fi
  done <<<"$policies"
done
"$root/build/lm/venv/bin/python" -c "import matplotlib" 2>/dev/null ||
  "$root/build/lm/venv/bin/pip" install -q --disable-pip-version-check "matplotlib<4"
"$root/build/lm/venv/bin/python" "$root/tools/quality_plot.py" "$csv" "$out/quality.png" "2,048 tokens of $(basename "$text")"
