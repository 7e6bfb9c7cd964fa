# Sourced by the set-up scripts that install from PyPI (tools/train-venv.sh, tools/fetch-model.sh,
# tools/fetch-llama-cpp.sh, tools/kvpress-check.sh, tools/conan-test.sh, tests/python/run.sh).
# A failed install means one of two things, and the tests treat them apart (docs/developing.md):
#   PyPI cannot be reached   exit 77: the entry reports SKIPPED, and .ci/run fails on the skip
#   the install failed       exit 1, with the pip log's last lines: a wrong pin, a missing wheel
#
#   pypi_install WHO LOG COMMAND...   runs COMMAND (a pip call) with its output in LOG (appended)

# Whether the index pip reads answers (kvpolicy_tools.pypi: PIP_INDEX_URL, pip's configuration
# files, else PyPI's, within 20 s; the system python3 runs it, standard library only).
pypi_tools=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/python/tools  # resolved once, where it is sourced
pypi_reachable() {
  PYTHONPATH="$pypi_tools" python3 -m kvpolicy_tools.pypi
}

pypi_install() {
  local who=$1 log=$2
  shift 2
  if "$@" >>"$log" 2>&1; then
    return 0
  fi
  # pip's own connection errors say its index (a mirror, a proxy) did not answer; else one probe
  if grep -qE "connection broken by|Failed to establish a new connection|Could not fetch URL" "$log" ||
     ! pypi_reachable 2>>"$log"; then
    echo "$who: SKIPPED: PyPI cannot be reached (pip's log, then the probe's answer: $log)" >&2
    exit 77
  fi
  echo "$who: FAILED: PyPI answers, but this install failed: $*" >&2
  echo "$who: the last lines of $log:" >&2
  tail -n 15 "$log" >&2
  exit 1
}
