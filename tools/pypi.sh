# Sourced by the set-up scripts that install from PyPI (tools/train-venv.sh, tools/fetch-model.sh,
# tools/fetch-llama-cpp.sh, tools/kvpress-check.sh, tools/conan-test.sh, tests/python/run.sh).
# A failed install means one of two things, and the tests treat them apart (docs/developing.md):
#   PyPI cannot be reached   exit 77: the entry reports SKIPPED, and .ci/run fails on the skip
#   the install failed       exit 1, with the pip log's last lines: a wrong pin, a missing wheel
#
#   pypi_install WHO LOG COMMAND...   runs COMMAND (a pip call) with its output in LOG (appended)

# The index pip reads (PIP_INDEX_URL, else pip's configuration, else PyPI's), answered within 20 s.
pypi_reachable() {
  local index=${PIP_INDEX_URL:-}
  if [ -z "$index" ]; then
    index=$(python3 -m pip config get global.index-url 2>/dev/null || true)
  fi
  index=${index:-https://pypi.org/simple}
  python3 - "$index" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/pip/", timeout=20).read(1)
except Exception as e:  # DNS, refused, TLS, timeout, HTTP error: not reachable
    print(f"{sys.argv[1]}: {e}", file=sys.stderr)
    sys.exit(1)
PY
}

pypi_install() {
  local who=$1 log=$2
  shift 2
  if "$@" >>"$log" 2>&1; then
    return 0
  fi
  if ! pypi_reachable 2>>"$log"; then
    echo "$who: SKIPPED: PyPI cannot be reached (the probe's answer is the last line of $log)" >&2
    exit 77
  fi
  echo "$who: FAILED: PyPI answers, but this install failed: $*" >&2
  echo "$who: the last lines of $log:" >&2
  tail -n 15 "$log" >&2
  exit 1
}
