#!/usr/bin/env bash
# Installs GPGPU-Sim (public source accel-sim/gpgpu-sim_distribution, commit 667834cf, branch dev),
# patched for CUDA 13 by the shared simulator kit, into PREFIX (default /opt/kvpolicy-gpusim, where
# tools/test.sh and tools/gpusim-check.sh look). The simulator's source and binaries never enter
# this repository. About 5 CPU-minutes; needs root (apt) and PyPI (cuobjdump).
#   tools/install-gpusim.sh GIT_DIR [PREFIX] [KIT_DIR]
#     GIT_DIR  a git directory of accel-sim/gpgpu-sim_distribution that holds commit 667834cf
#              (e.g. a bare clone: git clone --bare https://github.com/accel-sim/gpgpu-sim_distribution)
#     KIT_DIR  the simulator kit (build-gpgpusim.sh, its patches and PTX filter); default ../shared/gpu-sim
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
git_dir=${1:?usage: tools/install-gpusim.sh GIT_DIR [PREFIX] [KIT_DIR]}
prefix=${2:-/opt/kvpolicy-gpusim}
kit=${3:-$here/../shared/gpu-sim}
commit=667834cf
[ -x "$kit/build-gpgpusim.sh" ] || { echo "install-gpusim: no build-gpgpusim.sh in $kit" >&2; exit 2; }
git --git-dir="$git_dir" cat-file -e "$commit^{commit}" 2>/dev/null ||
  { echo "install-gpusim: $git_dir does not hold commit $commit" >&2; exit 2; }
src=$prefix-src
if [ ! -f "$src/setup_environment" ]; then
  mkdir -p "$src"
  git --git-dir="$git_dir" archive "$commit" | tar -x -C "$src"
fi
"$kit/build-gpgpusim.sh" "$src" "$prefix"
echo "install-gpusim: installed in $prefix; tools/gpusim-check.sh runs the CUDA tests under it"
