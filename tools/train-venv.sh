#!/usr/bin/env bash
# Makes (once) the training venv under build/train/venv: PyTorch, transformers, what
# kvpolicy_tools.train reads with and pytest (the tests that need torch run under it), pinned. Later
# runs reuse it. Prints the venv's python on its last line.
# Exit status 77 when PyPI cannot be reached (the training tests then report SKIPPED), 1 when it
# answers and the install fails (tools/pypi.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tools/pypi.sh"
venv=$root/build/train/venv
requirements=(torch==2.15.0 transformers==5.24.0 accelerate==1.15.0 gguf==0.19.0 safetensors==0.8.0
              tqdm==4.70.1 matplotlib==3.11.2 "numpy<3" pytest==8.4.2)
stamp="${requirements[*]}"
mkdir -p "$root/build/train"
if [ -x "$venv/bin/python" ] && [ -f "$venv/requirements.ok" ] && [ "$(cat "$venv/requirements.ok")" = "$stamp" ]; then
  echo "$venv/bin/python"
  exit 0
fi
python3 -m venv "$venv"
# --no-compile: Python byte-compiles what it imports; compiling every file of torch up front took a
# quarter of the install's time
: >"$root/build/train/pip.log"
pypi_install train-venv "$root/build/train/pip.log" \
  "$venv/bin/pip" install -q --no-compile --disable-pip-version-check "${requirements[@]}"
echo "$stamp" >"$venv/requirements.ok"
echo "$venv/bin/python"
