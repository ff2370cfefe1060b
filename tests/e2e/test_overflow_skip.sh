#!/usr/bin/env bash
# A gradient overflow on one rank (the ZTRAIN_TEST_INJECT_OVERFLOW hook
# makes that rank's gradients NaN in one step) must make every rank skip
# that step: the global norm is reduced over ranks before anyone steps. The
# skipped step consumes its batch but not the learning-rate schedule nor the
# optimizer's step count, as in DeepSpeed. Shown at world 2 under zero2 and
# zero3 (rank 1 overflows) against ddp at world 1 (rank 0 overflows): the
# same losses (1e-6 relative), step 3 logged as skipped with the overflow
# line, the learning rate of step 4 equal to step 3's, and every later loss
# finite (a rank that stepped with NaN gradients would poison the model).
# Loss scale dynamics are unit-tested (test_loss_scaler); fp32 runs keep a
# static scale of 1, as DeepSpeed's.
#
# usage: test_overflow_skip.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

common=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=8 --set train.log_every=1 --set train.eval_every=0
  --set train.warmup_steps=5 --set device.threads=1 --set train.save_final=false)

# run NAME RANKS INJECT [ARGS...]
run() {
  local name=$1 np=$2 inject=$3
  shift 3
  ZTRAIN_TEST_INJECT_OVERFLOW=$inject on_ranks "$np" "$ZTRAIN" "${common[@]}" \
    --set train.micro_batch_size=$((4 / np)) --set train.grad_accum=2 \
    --set train.out_dir="$scratch/$name" "$@" "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
  grep '"split": "train"' "$scratch/$name/metrics.jsonl" |
    sed -n 's/.*"step": \([0-9]*\).*"loss": \([-0-9.e+]*\), "lr": \([-0-9.e+]*\).*"skipped": \([a-z]*\), "skipped_steps": \([0-9]*\).*/\1 \2 \3 \4 \5/p' \
    > "$scratch/$name.rows"
  train_losses "$scratch/$name/metrics.jsonl" > "$scratch/$name.losses"
  [ "$(wc -l < "$scratch/$name.rows")" -eq 8 ] || fail "$name logged $(wc -l < "$scratch/$name.rows") steps"
  grep -q "overflow: skipping step 3 (gradients not finite), loss scale 1 -> 1" "$scratch/$name.out" ||
    fail "$name did not log the skipped step"
  grep -q "1 step skipped on gradient overflow" "$scratch/$name.out" || fail "$name: no skip in the summary"
  awk '$1 == 3 && $4 != "true" { exit 1 } $1 != 3 && $4 != "false" { exit 1 }
       $1 >= 3 && $5 != 1 { exit 1 }' "$scratch/$name.rows" || fail "$name: skipped flags wrong: $(cat "$scratch/$name.rows")"
  awk '$1 == 3 { lr3 = $3 } $1 == 4 && $3 != lr3 { exit 1 }' "$scratch/$name.rows" ||
    fail "$name: the schedule advanced over the skipped step"
  awk '$2 != $2 + 0 || $2 == "nan" { exit 1 }' "$scratch/$name.rows" || fail "$name: a loss is not finite"
}

run ddp_w1 1 3:0
run zero2_w2 2 3:1 --strategy zero2
run zero3_w2 2 3:1 --strategy zero3 --set strategy.param_persistence_threshold=0
for name in zero2_w2 zero3_w2; do same_losses ddp_w1 "$name" 1e-6; done

bad=$(ZTRAIN_TEST_INJECT_OVERFLOW=three "$ZTRAIN" "${common[@]}" "$SRC/configs/run.toml" 2>&1) &&
  fail "a malformed ZTRAIN_TEST_INJECT_OVERFLOW was accepted"
grep -q "expected STEP:RANK" <<< "$bad" || fail "unclear error for a malformed hook: $bad"
echo "PASS"
