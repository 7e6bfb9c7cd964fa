# Sourced by the set-up scripts that install from PyPI (tools/train-venv.sh, tools/fetch-model.sh,
# tools/fetch-llama-cpp.sh, tools/kvpress-check.sh, tools/conan-test.sh, tests/python/run.sh).
# A failed install means one of two things, and the tests treat them apart (docs/developing.md):
#   PyPI cannot be reached   exit 77: the entry reports SKIPPED, and .ci/run fails on the skip
#   the install failed       exit 1, with the pip log's last lines: a wrong pin, a missing wheel
#
#   pypi_install WHO LOG COMMAND...   runs COMMAND (a pip call) with its output in LOG (appended)

# The index pip reads (PIP_INDEX_URL, else index-url from pip's configuration files, in pip's order,
# else PyPI's), answered within 20 s. The files are read here, not through `python3 -m pip config`:
# a fresh Debian has pip only inside the venvs these scripts make.
pypi_reachable() {
  python3 - <<'PY'
import configparser, os, sys, urllib.request
index = os.environ.get("PIP_INDEX_URL")
if not index:
    files = ["/etc/pip.conf", "/etc/xdg/pip/pip.conf", os.path.expanduser("~/.pip/pip.conf"),
             os.path.join(os.environ.get("XDG_CONFIG_HOME", os.path.expanduser("~/.config")), "pip", "pip.conf")]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(os.environ["PIP_CONFIG_FILE"])
    config = configparser.ConfigParser()
    config.read(files)
    for section in ("global", "install", "download"):
        index = config.get(section, "index-url", fallback=index)
index = index or "https://pypi.org/simple"
try:
    urllib.request.urlopen(index.rstrip("/") + "/pip/", timeout=20).read(1)
except Exception as e:  # DNS, refused, TLS, timeout, HTTP error: not reachable
    print(f"{index}: {e}", file=sys.stderr)
    sys.exit(1)
PY
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
