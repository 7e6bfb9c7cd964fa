#!/usr/bin/env bash
# Simulated (never measured) performance ratios under GPGPU-Sim's timing model (the SM75 RTX 2060
# config): runs kvpolicy_sim_ratios once with PTX_SIM_MODE_FUNC=0 and prints the table that
# docs/perf.md records under "Simulated". Needs the gpusim build (tools/gpusim-check.sh makes it).
#   bench/gpusim-ratios.sh [kv_MiB] [PREFIX]    (default 16 MiB, /opt/kvpolicy-gpusim; OUT=dir keeps the log)
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${1:-16}
prefix=${2:-/opt/kvpolicy-gpusim}
[ -f "$prefix/env.sh" ] || { echo "gpusim: no simulator at $prefix (docs/gpusim.md installs one)" >&2; exit 2; }
out=${OUT:-build/gpusim/logs}
mkdir -p "$out"
cmake --build --preset gpusim --target kvpolicy_sim_ratios >/dev/null
root=$PWD
scratch=$(mktemp -d /tmp/kvpolicy-gpusim.XXXXXX)
cp "$prefix"/config/* "$scratch/"
# The SM75 config lists five integer-unit latencies, but the simulator reads a sixth for shfl
# (int_latency[5] in set_opcode_and_latency): left uninitialised, the first shuffle crashes the
# timing model (pipelined_simd_unit::cycle). A sixth entry is added where missing: latency 32 and
# initiation interval 2, an assumption of this project (not a figure of the RTX 2060 config).
sed -E -i -e 's/^(-ptx_opcode_latency_int +[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+)$/\1,32/' \
          -e 's/^(-ptx_opcode_initiation_int +[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]+)$/\1,2/' "$scratch/gpgpusim.config"
( set +u; source "$prefix/env.sh"; set -u
  export KVPOLICY_GPUSIM_NEXT_FILTER=$GPGPUSIM_PTX_FILTER GPGPUSIM_PTX_FILTER=$root/tools/gpusim-ptx-filter.sh
  export PTX_SIM_MODE_FUNC=0  # the timing model
  cd "$scratch" && exec "$root/build/gpusim/bench/kvpolicy_sim_ratios" "$mib" ) >"$out/sim_ratios.log" 2>&1
rm -rf "$scratch"
if grep -q "Syntax error" "$out/sim_ratios.log"; then
  echo "gpusim: PTX syntax error in the simulator's log ($out/sim_ratios.log)" >&2
  exit 3
fi
grep "^kvpolicy-sim: cache" "$out/sim_ratios.log" || true
python3 bench/gpusim_ratios.py "$out/sim_ratios.log"
