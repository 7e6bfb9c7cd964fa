#!/usr/bin/env bash
# Installs the Debian 12 packages kvpolicy builds with, when any is missing. Needs root or sudo.
set -euo pipefail
# clang + libclang-rt-14-dev: the libFuzzer targets (fuzz/); without them the fuzz tests report SKIPPED.
# python3 + python3-venv: Conan 2 from PyPI (tools/conan-test.sh). doxygen: the API reference.
# python3-pytest: the tests of kvpolicy_tools that need no torch; without it they report SKIPPED.
# libopenmpi-dev + openmpi-bin: the sharded selection across MPI ranks (kvpolicy/dist/mpi.hpp, its tests).
packages=(cmake ninja-build g++ libeigen3-dev doctest-dev libbenchmark-dev nlohmann-json3-dev libstb-dev clang libclang-rt-14-dev python3 python3-venv doxygen
          python3-pytest libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "kvpolicy: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
