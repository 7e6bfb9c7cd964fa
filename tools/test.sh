#!/usr/bin/env bash
# Builds kvpolicy and passes every test: the Release suite (with the installed-package consumer
# build, the replay CLI and a benchmark smoke run), then the unit and replay tests again under
# AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset default
cmake --build --preset default
ctest --preset default
cmake --preset asan
cmake --build --preset asan
ctest --preset asan
