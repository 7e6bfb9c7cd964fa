#!/usr/bin/env bash
# Simulated (never measured) performance ratios under GPGPU-Sim's timing model (the SM75 RTX 2060
# config): runs kvpolicy_sim_ratios once with PTX_SIM_MODE_FUNC=0 and prints the table that
# docs/perf.md records under "Simulated". Needs the gpusim build (tools/gpusim-check.sh makes it).
#   tools/gpusim-ratios.sh [kv_MiB] [PREFIX]    (default 16 MiB, /opt/kvpolicy-gpusim; OUT=dir keeps the log)
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
python3 tools/gpusim_ratios.py "$out/sim_ratios.log"
