#!/usr/bin/env bash
# Builds kvpolicy and passes every test: the Release suite (with the installed-package consumer
# build, the vcpkg port's install tree, the replay CLI, a benchmark smoke run, the state-machine
# test, a 10^5-step soak and 30 s of libFuzzer per parser), then `conan create` offline with its
# test_package, then the unit and replay tests again under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset default
cmake --build --preset default
ctest --preset default
tools/conan-test.sh
cmake --preset asan
cmake --build --preset asan
ctest --preset asan
