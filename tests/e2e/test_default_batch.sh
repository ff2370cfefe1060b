#!/usr/bin/env bash
# The default run keeps its global batch at any world size: configs/run.toml
# gives global_batch_size, so 1, 2 and 4 ranks split the same 8 sequences
# per step (8, 4 and 2 per rank) and log the same training losses and
# gradient norms, and evaluation reads the same validation sequences
# (eval_batches global batches) so the val losses agree too; with
# grad_accum set on the command line the micro-batch shrinks instead. A
# --set of both micro_batch_size and grad_accum outranks the run file's
# global batch.
#
# usage: test_default_batch.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

steps=6
base=(--set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32 --set train.steps=$steps
  --set train.log_every=1 --set train.eval_every=3 --set train.eval_batches=2 --set device.threads=1
  --set train.save_final=false)

run() {  # run NAME RANKS [ARGS...]
  local name=$1 np=$2
  shift 2
  on_ranks "$np" "$ZTRAIN" "${base[@]}" --set train.out_dir="$scratch/$name" "$@" "$SRC/configs/run.toml" \
    > "$scratch/$name.out" 2>&1 || { cat "$scratch/$name.out" >&2; fail "$name failed"; }
  curve "$name" "$steps"
  metrics_fields "$scratch/$name/metrics.jsonl" val step loss > "$scratch/$name.val"
  [ "$(wc -l < "$scratch/$name.val")" -eq 2 ] || fail "$name logged $(wc -l < "$scratch/$name.val") evaluations, not 2"
}
same_val() {  # same_val REF NAME TOLERANCE
  paste "$scratch/$1.val" "$scratch/$2.val" | awk -v t="$3" -v n="$2" '
    { d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > worst) worst = r }
    END { printf "%s: largest relative val loss difference %.3g\n", n, worst; exit !(worst <= t) }' ||
    fail "$2's val losses differ from $1's"
}

run w1 1
grep -q "batch: 8 x 1 accum x 1 rank = 8 sequences" "$scratch/w1.out" || fail "world 1 did not take 8 sequences"
for np in 2 4; do
  run "w$np" "$np"
  grep -q "batch: $((8 / np)) x 1 accum x $np ranks = 8 sequences" "$scratch/w$np.out" ||
    fail "world $np did not split the global batch: $(grep batch: "$scratch/w$np.out")"
  same_training w1 "w$np" 1e-6 2e-6
  same_val w1 "w$np" 1e-6
done
run accum_w2 2 --set train.grad_accum=2
grep -q "batch: 2 x 2 accum x 2 ranks = 8 sequences" "$scratch/accum_w2.out" || fail "grad_accum did not shrink the micro-batch"
same_training w1 accum_w2 1e-6 2e-6
same_val w1 accum_w2 1e-6
# Both per-rank keys on the command line outrank the file's global batch.
run fixed_w2 2 --set train.micro_batch_size=8 --set train.grad_accum=1
grep -q "batch: 8 x 1 accum x 2 ranks = 16 sequences" "$scratch/fixed_w2.out" ||
  fail "--set micro_batch_size and grad_accum did not outrank global_batch_size"
echo "PASS"
