#!/usr/bin/env bash
# Which GEMM kernels run, as a user sees it (test_blas checks that the
# family is the one this CPU's flags call for):
# - `ztrain plugins -v` names the OpenBLAS kernel family, chosen by ztrain,
#   and what runs attention's block products (ztrain's kernel on AVX-512);
# - OPENBLAS_CORETYPE set by the user is respected, named, and warned about
#   when it is below the CPU, in `plugins -v` and at a run's start (whose
#   header names the family after the device);
# - the ranks of a job started with --nproc choose for themselves: the
#   variable ztrain sets for OpenBLAS's initialiser does not leak into them
#   as if the user had set it.
#
# usage: test_gemm_report.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

env -u OPENBLAS_CORETYPE "$ZTRAIN" plugins -v > "$scratch/plugins.out" 2>&1 ||
  fail "ztrain plugins -v failed"
if grep -q "^GEMMs: .*, chosen by OpenBLAS" "$scratch/plugins.out"; then
  echo "a CPU without AVX: OpenBLAS chooses, nothing to check"
  exit 0
fi
expected=$(sed -n "s/^GEMMs: OpenBLAS [0-9.]*, \([A-Za-z]*\) kernels (.*), chosen by ztrain from this CPU's features.*/\1/p" \
  "$scratch/plugins.out")
[ -n "$expected" ] || fail "plugins -v does not report kernels chosen by ztrain"
if grep -q "^warning: the GEMMs" "$scratch/plugins.out"; then fail "a warning at the CPU's own kernels"; fi
echo "chosen: $(grep -m1 '^GEMMs:' "$scratch/plugins.out")"

# Attention's block products: ztrain's kernel exactly where the CPU has
# AVX-512 F, BW and VL (the kernel's instructions), whatever BLAS runs.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
if [[ " $flags " == *" avx512f "* && " $flags " == *" avx512bw "* && " $flags " == *" avx512vl "* ]]; then
  attention="ztrain's AVX-512 kernel"
else
  attention="OpenBLAS (no AVX-512 here)"
fi
grep -qxF "attention's block products: $attention" "$scratch/plugins.out" ||
  fail "plugins -v does not say attention's products run on $attention"
echo "attention: $attention"

# Prescott (SSE3) is below every CPU with AVX.
OPENBLAS_CORETYPE=Prescott "$ZTRAIN" plugins -v > "$scratch/set.out" 2>&1 || fail "plugins -v failed"
grep -q "^GEMMs: OpenBLAS [0-9.]*, Prescott kernels (SSE), set by OPENBLAS_CORETYPE=Prescott" \
  "$scratch/set.out" || fail "the user's OPENBLAS_CORETYPE is not reported as theirs"
grep -q "^warning: the GEMMs run OpenBLAS's Prescott kernels (SSE), below what this CPU runs (.*, $expected kernels): OPENBLAS_CORETYPE=Prescott is set; unset it" \
  "$scratch/set.out" || fail "no warning for kernels below the CPU"
echo "set: $(grep -m1 '^warning:' "$scratch/set.out")"

small=(--model gpt2-tiny --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=16
  --set model.vocab_size=256 --set train.steps=1 --set device.threads=1 --set train.eval_every=0)
OPENBLAS_CORETYPE=Prescott "$ZTRAIN" "${small[@]}" --set train.out_dir="$scratch/slow" \
  "$SRC/configs/run.toml" > "$scratch/slow.out" 2>&1 || fail "the run under Prescott failed"
grep -q "| cpu (1 threads), OpenBLAS Prescott$" "$scratch/slow.out" ||
  fail "the run's header does not name the kernels"
grep -q "^warning: the GEMMs run OpenBLAS's Prescott kernels" "$scratch/slow.out" ||
  fail "the run does not warn of kernels below the CPU"

env -u OPENBLAS_CORETYPE "$ZTRAIN" --nproc 2 -v "${small[@]}" --set train.out_dir="$scratch/two" \
  "$SRC/configs/run.toml" > "$scratch/two.out" 2>&1 || fail "the 2-rank run failed"
chosen=$(grep -c "^\[ztrain\] GEMMs: OpenBLAS [0-9.]*, $expected kernels (.*), chosen by ztrain" \
  "$scratch/two.out" || true)
[ "$chosen" -ge 2 ] || fail "$chosen of the 2 ranks say ztrain chose their kernels"
said=$(grep -cxF "[ztrain] attention's block products: $attention" "$scratch/two.out" || true)
[ "$said" -ge 2 ] || fail "$said of the 2 ranks name what runs attention's products"
if grep -q "set by OPENBLAS_CORETYPE" "$scratch/two.out"; then
  fail "a rank took ztrain's choice for the user's"
fi
echo "2 ranks: each chose $expected"
