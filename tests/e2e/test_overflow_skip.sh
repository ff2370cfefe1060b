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
# fp32 runs keep a static scale of 1, as DeepSpeed's. In fp16 the same
# injection lowers the dynamic scale per DeepSpeed's rules: with
# hysteresis 1 it halves at once (65536 -> 32768, logged and in the
# metrics), with the default hysteresis 2 the first overflow only uses up
# the hysteresis. And real fp16 overflows: starting at 2^24, the scaled
# gradients overflow fp16 until the scale has halved far enough; every
# rank skips those steps together (zero2 and zero3 at world 2 log the same
# losses and skips), and training then goes on with finite losses. The
# scale's state machine itself is unit-tested (test_loss_scaler).
#
# usage: test_overflow_skip.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

common=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=8 --set train.log_every=1 --set train.eval_every=0
  --set train.warmup_steps=5 --set device.threads=1 --set train.save_final=false)

# run NAME RANKS INJECT SCALES [ARGS...]: SCALES the logged "A -> B"
run() {
  local name=$1 np=$2 inject=$3 scales=$4
  shift 4
  ZTRAIN_TEST_INJECT_OVERFLOW=$inject on_ranks "$np" "$ZTRAIN" "${common[@]}" \
    --set train.micro_batch_size=$((4 / np)) --set train.grad_accum=2 \
    --set train.out_dir="$scratch/$name" "$@" "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
  metrics_fields "$scratch/$name/metrics.jsonl" train step loss lr skipped skipped_steps \
    > "$scratch/$name.rows"
  curve "$name" 8
  [ "$(wc -l < "$scratch/$name.rows")" -eq 8 ] || fail "$name logged $(wc -l < "$scratch/$name.rows") steps"
  grep -q "overflow: skipping step 3 (gradients not finite), loss scale $scales\$" "$scratch/$name.out" ||
    fail "$name did not log the skipped step"
  grep -q "1 step skipped on gradient overflow" "$scratch/$name.out" || fail "$name: no skip in the summary"
  awk '$1 == 3 && $4 != "true" { exit 1 } $1 != 3 && $4 != "false" { exit 1 }
       $1 >= 3 && $5 != 1 { exit 1 }' "$scratch/$name.rows" || fail "$name: skipped flags wrong: $(cat "$scratch/$name.rows")"
  awk '$1 == 3 { lr3 = $3 } $1 == 4 && $3 != lr3 { exit 1 }' "$scratch/$name.rows" ||
    fail "$name: the schedule advanced over the skipped step"
  awk '$2 != $2 + 0 || $2 == "nan" { exit 1 }' "$scratch/$name.rows" || fail "$name: a loss is not finite"
}

run ddp_w1 1 3:0 "1 -> 1"
run zero2_w2 2 3:1 "1 -> 1" --strategy zero2
run zero3_w2 2 3:1 "1 -> 1" --strategy zero3 --set strategy.param_persistence_threshold=0
for run_name in zero2_w2 zero3_w2; do same_training ddp_w1 "$run_name" 1e-6 2e-6; done

fp16=(--set train.precision=fp16 --set train.fp16.hysteresis=1)
run fp16_zero2_w2 2 3:1 "65536 -> 32768" --strategy zero2 "${fp16[@]}"
run fp16_zero3_w2 2 3:1 "65536 -> 32768" --strategy zero3 "${fp16[@]}" \
  --set strategy.param_persistence_threshold=0
same_training fp16_zero2_w2 fp16_zero3_w2 1e-6 2e-6
for run_name in fp16_zero2_w2 fp16_zero3_w2; do
  scales=$(metrics_fields "$scratch/$run_name/metrics.jsonl" train step loss_scale |
    tr ' ' ':' | tr '\n' ' ')
  [[ "$scales" == "1:65536 2:65536 3:65536 4:32768 "* ]] ||
    fail "$run_name: loss scale per step $scales, expected 65536 until the overflow, then 32768"
done
run fp16_hysteresis_w2 2 3:1 "65536 -> 65536" --strategy zero2 --set train.precision=fp16

# Real overflows: no injection, an initial scale fp16 cannot carry.
for stage in zero2 zero3; do
  on_ranks 2 "$ZTRAIN" "${common[@]}" --set train.steps=20 --set train.micro_batch_size=2 \
    --set train.precision=fp16 --set train.fp16.initial_scale_power=24 \
    --set train.fp16.hysteresis=1 --strategy "$stage" --set train.out_dir="$scratch/real_$stage" \
    "$SRC/configs/run.toml" > "$scratch/real_$stage.out" 2>&1 ||
    { cat "$scratch/real_$stage.out" >&2; fail "real_$stage failed"; }
  curve "real_$stage" 20
  skips=$(grep -c "overflow: skipping step" "$scratch/real_$stage.out" || true)
  echo "real_$stage: $skips steps skipped on real fp16 overflows"
  [ "$skips" -ge 1 ] || fail "real_$stage: a 2^24 loss scale did not overflow fp16 gradients"
  grep -q "overflow: skipping step 1 (gradients not finite), loss scale 16777216 -> 8388608" \
    "$scratch/real_$stage.out" || fail "real_$stage: the first step did not overflow and halve"
  awk '$2 != $2 + 0 || $2 == "nan" { exit 1 }' "$scratch/real_$stage.curve" ||
    fail "real_$stage: a loss is not finite"
  awk 'NR == 1 { first = $2 } END { exit !($2 < first) }' "$scratch/real_$stage.curve" ||
    fail "real_$stage: the loss did not go down after the skips"
done
same_training real_zero2 real_zero3 1e-6 2e-6

bad=$(ZTRAIN_TEST_INJECT_OVERFLOW=three "$ZTRAIN" "${common[@]}" --set train.out_dir="$scratch/bad_hook" \
  "$SRC/configs/run.toml" 2>&1) &&
  fail "a malformed ZTRAIN_TEST_INJECT_OVERFLOW was accepted"
grep -q "expected STEP:RANK" <<< "$bad" || fail "unclear error for a malformed hook: $bad"
echo "PASS"
