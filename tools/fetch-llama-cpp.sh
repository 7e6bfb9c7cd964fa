#!/usr/bin/env bash
# Builds llama.cpp (CPU only, static libraries) from a pinned source release for kvpolicy-llama
# (apps/llama/): the llama.cpp tree that llama-cpp-python 0.3.36's source distribution on PyPI
# vendors (llama.cpp commit 0c1e57098), checked by its SHA-256. Everything lives under a cache
# directory that later runs reuse:
#   tools/fetch-llama-cpp.sh [CACHE]      (default build/llama.cpp; installs into CACHE/install)
# CMake finds the result there (-DKVPOLICY_LLAMA_CPP=CACHE/install, the default) and builds
# kvpolicy-llama. Prints the install prefix on its last line. Exit status 77 when PyPI cannot be
# reached and nothing is cached (kvpolicy-llama is then not built and its test reports SKIPPED), 1
# when PyPI answers and the download fails (tools/pypi.sh).
# About 1 minute to download and 2 to build on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/tools/pypi.sh"
cache=$(mkdir -p "${1:-$root/build/llama.cpp}" && cd "${1:-$root/build/llama.cpp}" && pwd)
exec 9>"$cache/.fetch.lock"
flock 9
version=0.3.36
sdist=llama_cpp_python-$version.tar.gz
# the SHA-256 of the sdist as downloaded from PyPI on 2026-11-27: what is built is what was pinned
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
stamp="$sdist_sha256 cpu-static no-amx 2"
prefix=$cache/install

if [ -f "$prefix/built.ok" ] && [ "$(cat "$prefix/built.ok")" = "$stamp" ]; then
  echo "fetch-llama-cpp: cached"
  echo "$prefix"
  exit 0
fi

if [ ! -f "$cache/$sdist" ] || ! echo "$sdist_sha256  $cache/$sdist" | sha256sum -c --quiet - 2>/dev/null; then
  venv=$cache/venv
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  : >"$cache/pip.log"
  pypi_install fetch-llama-cpp "$cache/pip.log" "$venv/bin/pip" download -q --disable-pip-version-check --no-deps \
    --no-binary :all: "llama-cpp-python==$version" -d "$cache"
fi
echo "$sdist_sha256  $cache/$sdist" | sha256sum -c --quiet - || {
  echo "fetch-llama-cpp: $cache/$sdist is not the pinned release (SHA-256 differs)" >&2
  exit 1
}

rm -rf "$cache/src" "$cache/build" "$prefix"
mkdir -p "$cache/src"
tar -xzf "$cache/$sdist" -C "$cache/src" "llama_cpp_python-$version/vendor/llama.cpp"
src=$cache/src/llama_cpp_python-$version/vendor/llama.cpp
# AMX off: virtual machines may report AMX in cpuid without enabling its state, and ggml's AMX
# kernels then die on their first tile instruction (SIGILL); -march=native would select them
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# the library only: no tools, examples, server, tests or network; static, so kvpolicy-llama runs
# from anywhere; OpenMP off so that its threads are llama.cpp's own pool
cmake -S "$src" -B "$cache/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \
  -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" \
  >"$cache/configure.log"
cmake --build "$cache/build" --target llama -j"$(nproc)" >"$cache/build.log"
# the headers and static libraries kvpolicy-llama links (llama.cpp's own install step also wants
# the tools this build leaves out)
mkdir -p "$prefix/include" "$prefix/lib"
cp "$src/include/llama.h" "$src"/ggml/include/*.h "$prefix/include/"
cp "$cache/build/src/libllama.a" "$cache"/build/ggml/src/libggml*.a "$prefix/lib/"
echo "$stamp" >"$prefix/built.ok"
echo "$prefix"
