#!/usr/bin/env bash
# Conan 2, for real and offline: `conan create` builds the kvpolicy package and its test_package
# (CMakeDeps + CMakeToolchain), with cpu=True and with cpu=False. Eigen and nlohmann_json come from
# Debian through conan/profiles/debian12 ([platform_requires]); every remote is disabled, so Conan
# downloads nothing. Conan itself is installed from PyPI into build/conan-venv when missing: exit
# status 77 when PyPI cannot be reached, 1 when it answers and the install fails (tools/pypi.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/pypi.sh
conan=conan
if ! command -v conan >/dev/null 2>&1 || ! conan --version | grep -q "Conan version 2"; then
  conan=build/conan-venv/bin/conan
  if [ ! -x "$conan" ]; then
    echo "kvpolicy: installing Conan 2 from PyPI into build/conan-venv"
    python3 -m venv build/conan-venv
    : >build/conan-venv/pip.log
    pypi_install conan-test build/conan-venv/pip.log build/conan-venv/bin/pip install -q "conan>=2.0,<3"
  fi
fi
export CONAN_HOME="$PWD/build/conan-home"
"$conan" profile detect --exist-ok >/dev/null
"$conan" remote disable "*" >/dev/null  # offline: nothing may come from a remote
"$conan" create . -pr:a conan/profiles/debian12
"$conan" create . -pr:a conan/profiles/debian12 -o "&:cpu=False"
