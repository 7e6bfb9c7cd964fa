#!/usr/bin/env bash
# Runs tests/train/test_train_gates.py in the training venv (tools/train-venv.sh makes it once;
# later runs reuse it). Exit status 77 (ctest: SKIPPED) when PyPI cannot be reached and the venv
# is not there: never a pass without torch.
#   tests/train/run.sh GATE_FORWARD WORK_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$("$root/tools/train-venv.sh")
rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 77 ] && echo "train: SKIPPED: torch and transformers could not be installed from PyPI" >&2
  exit "$rc"
fi
exec "$(tail -n 1 <<<"$out")" "$root/tests/train/test_train_gates.py" "$@"
