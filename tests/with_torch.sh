#!/usr/bin/env bash
# Runs a Python test script in the training venv (tools/train-venv.sh makes it once: torch,
# transformers, pinned; later runs reuse it). Exit status 77 (ctest: SKIPPED) when PyPI cannot be
# reached and the venv is not there, 1 when the install failed while PyPI answers: never a pass
# without torch.
#   tests/with_torch.sh SCRIPT ARGS...
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$("$root/tools/train-venv.sh")
rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 77 ] && echo "with_torch: SKIPPED: torch and transformers could not be installed (PyPI cannot be reached)" >&2
  exit "$rc"
fi
exec "$(tail -n 1 <<<"$out")" "$@"
