"""Whether the package index pip reads answers: PIP_INDEX_URL, else index-url from pip's
configuration files (in pip's order), else PyPI's, within 20 s. The files are read here, not through
`pip config`: a fresh Debian has pip only inside the venvs the set-up scripts make.

    python3 -m kvpolicy_tools.pypi        exit 0 when it answers, 1 (with the reason) when not

The set-up scripts (tools/pypi.sh) and kvpolicy-fetch-model tell the two failures of an install
apart with it: the index cannot be reached (exit 77, SKIPPED in the tests), or it answers and the
install failed (exit 1). Standard library only.
"""
import configparser
import os
import sys
import urllib.request

UNREACHABLE = 77  # the exit status of a set-up that could not reach the index (ctest: SKIPPED)


def index_url():
    index = os.environ.get("PIP_INDEX_URL")
    if index:
        return index
    files = ["/etc/pip.conf", "/etc/xdg/pip/pip.conf", os.path.expanduser("~/.pip/pip.conf"),
             os.path.join(os.environ.get("XDG_CONFIG_HOME", os.path.expanduser("~/.config")), "pip", "pip.conf")]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(os.environ["PIP_CONFIG_FILE"])
    config = configparser.ConfigParser()
    config.read(files)
    for section in ("global", "install", "download"):
        index = config.get(section, "index-url", fallback=index)
    return index or "https://pypi.org/simple"


def reachable():
    """None when the index answers, else why not."""
    index = index_url()
    try:
        urllib.request.urlopen(index.rstrip("/") + "/pip/", timeout=20).read(1)
    except Exception as e:  # DNS, refused, TLS, timeout, HTTP error: not reachable
        return f"{index}: {e}"
    return None


if __name__ == "__main__":
    why = reachable()
    if why:
        print(why, file=sys.stderr)
        sys.exit(1)
