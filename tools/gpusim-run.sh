#!/usr/bin/env bash
# One program under GPGPU-Sim (functional mode), in a scratch directory of its own: the simulator
# reads its config from the working directory and writes the PTX it extracts there, so two
# simulated processes (the ranks of an mpirun) must not share one. The project's PTX rewrite rules
# (tools/gpusim-ptx-filter.sh) run before the simulator kit's own.
#   tools/gpusim-run.sh PREFIX PROGRAM [ARGS...]      (PROGRAM: an absolute path)
set -euo pipefail
prefix=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d /tmp/kvpolicy-gpusim.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
cp "$prefix"/config/* "$scratch/"
set +u; source "$prefix/env.sh"; set -u
export KVPOLICY_GPUSIM_NEXT_FILTER=$GPGPUSIM_PTX_FILTER GPGPUSIM_PTX_FILTER=$root/tools/gpusim-ptx-filter.sh
# Functional mode has no timing model: filling the model's L2 on every memcpy (-gpgpu_perf_sim_memcpy,
# timing state only) costs a memory-bound case 7% of its run and checks nothing there.
if [ "${PTX_SIM_MODE_FUNC:-1}" = 1 ]; then
  sed -i 's/^-gpgpu_perf_sim_memcpy 1/-gpgpu_perf_sim_memcpy 0/' "$scratch/gpgpusim.config"
fi
cd "$scratch"
"$@"
