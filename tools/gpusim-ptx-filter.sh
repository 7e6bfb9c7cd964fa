#!/bin/sh
# The project's PTX rewrite rules for GPGPU-Sim (GPGPUSIM_PTX_FILTER <file>: edits the PTX in place
# before the simulator parses it), then the simulator kit's own filter ($KVPOLICY_GPUSIM_NEXT_FILTER).
# tools/gpusim-check.sh and bench/gpusim-ratios.sh install it. Each rule works around one simulator
# fault that a probe in tests/cuda/probes/ shows; on a GPU none of this runs.
#
# cvt.rn.f{32,64}.{s,u}64 (64-bit integer to floating point): the simulator returns wrong values
# (0 for -20; 253 of 256 random inputs wrong: tests/cuda/probes/cvt_s64.cu), while the conversions
# from 32-bit integers are right. Rewritten through the two 32-bit halves:
#   d = fma.rn.f64(hi, 2^32, lo)    (hi*2^32 exact, one rounding: correctly rounded to f64)
#   f32 destination: then cvt.rn.f32.f64, which rounds twice only where |x| > 2^53 (never for the
#   positions, lengths and counts the library converts).
# A predicate guard stays on the instruction that writes the destination.
set -eu
file=$1
sed -E -i \
  -e 's/(@!?%[A-Za-z0-9_]+[[:space:]]+)?cvt\.rn\.f32\.([su])64[[:space:]]+(%[A-Za-z0-9_]+),[[:space:]]*(%[A-Za-z0-9_]+);/{ .reg .b32 %kvp_lo, %kvp_hi; .reg .f64 %kvp_flo, %kvp_fhi, %kvp_d; mov.b64 {%kvp_lo, %kvp_hi}, \4; cvt.rn.f64.\232 %kvp_fhi, %kvp_hi; cvt.rn.f64.u32 %kvp_flo, %kvp_lo; fma.rn.f64 %kvp_d, %kvp_fhi, 0d41F0000000000000, %kvp_flo; \1cvt.rn.f32.f64 \3, %kvp_d; }/g' \
  -e 's/(@!?%[A-Za-z0-9_]+[[:space:]]+)?cvt\.rn\.f64\.([su])64[[:space:]]+(%[A-Za-z0-9_]+),[[:space:]]*(%[A-Za-z0-9_]+);/{ .reg .b32 %kvp_lo, %kvp_hi; .reg .f64 %kvp_flo, %kvp_fhi; mov.b64 {%kvp_lo, %kvp_hi}, \4; cvt.rn.f64.\232 %kvp_fhi, %kvp_hi; cvt.rn.f64.u32 %kvp_flo, %kvp_lo; \1fma.rn.f64 \3, %kvp_fhi, 0d41F0000000000000, %kvp_flo; }/g' \
  "$file"
if [ -n "${KVPOLICY_GPUSIM_NEXT_FILTER:-}" ]; then
  exec "$KVPOLICY_GPUSIM_NEXT_FILTER" "$file"
fi
