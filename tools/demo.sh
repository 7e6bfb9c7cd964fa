#!/usr/bin/env bash
# Builds kvpolicy-replay and runs the demo: the synthetic trace through every policy, as a table,
# with heatmaps written to demo-out/.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target kvpolicy-replay
build/default/apps/kvpolicy-replay --demo --png demo-out
