#!/usr/bin/env bash
# Runs a test binary with OpenBLAS forced to one kernel family
# (OPENBLAS_CORETYPE), so that the numerics are checked under another
# summation order than the one ztrain chooses for this CPU. Exits 77
# (skipped) where the CPU cannot run the family's instructions.
#
# usage: with_coretype.sh FAMILY TEST_BINARY [ARGS...]
set -euo pipefail
family=$1
shift
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
needs() {
  local f
  for f in "$@"; do
    [[ "$flags" == *" $f "* ]] || { echo "skipped: $family needs $f, which this CPU lacks"; exit 77; }
  done
}
case $family in
  Prescott) needs pni ;;  # SSE3, as Linux names it
  Sandybridge) needs avx ;;
  Haswell | Zen) needs avx2 fma ;;
  SkylakeX) needs avx512f avx512dq avx512cd avx512bw avx512vl ;;
  Cooperlake) needs avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 ;;
  *) echo "with_coretype.sh: no instruction set known for family '$family'" >&2; exit 2 ;;
esac
OPENBLAS_CORETYPE=$family exec "$@"
