#!/usr/bin/env bash
# Runs the training venv's python with the arguments given: pytest on a test module that needs torch
# (tools/train-venv.sh makes the venv once: torch, transformers, pytest, pinned; later runs reuse it).
# Exit status 77 (ctest: SKIPPED) when PyPI cannot be reached and the venv is not there, 1 when the
# install failed while PyPI answers: never a pass without torch.
#   tests/with_torch.sh -m pytest ... FILE   (any python arguments)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$("$root/tools/train-venv.sh")
rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 77 ] && echo "with_torch: SKIPPED: torch and transformers could not be installed (PyPI cannot be reached)" >&2
  exit "$rc"
fi
exec "$(tail -n 1 <<<"$out")" "$@"
