#!/usr/bin/env bash
# Mixed precision on gpt2-tiny-shaped models, 40 steps.
# - bf16 and fp16 (16-bit working weights and gradients, fp32 master
#   weights) track the fp32 curve of ddp at world 1 within 2e-3 relative
#   per step in the loss and 2e-2 in the gradient norm (measured at most
#   1.2e-4 and 5.0e-3, the activations kept in the 16-bit type), for ddp
#   at world 1 and 2 and for zero3 at world 2; fp16 with the dynamic loss
#   scale, which must not skip a step here.
# - In one precision the strategies agree much more tightly: without
#   clipping, zero1, zero2 and zero3 at world 2 log ddp's world-2 losses
#   bit for bit (the same 16-bit gradients, reduced alike, step the same
#   fp32 masters) and its gradient norms within 2e-6 (the shards' squares
#   are summed in another order; measured 5.5e-8); with clipping within
#   2e-4 and 4e-3, because a last-bit difference in the clip factor moves
#   a few masters across a 16-bit rounding boundary (measured 3.2e-5 and
#   1.4e-3 in bf16). grad_accum_dtype = "fp32" (zero2, with accumulation)
#   stays within the 16-bit tolerances of fp32.
# - Bytes communicated per step in bf16 are half of fp32's (0.5 within
#   0.5 %) for every strategy.
# - Weights exported from bf16 zero3 import into fp32 and bf16 runs of
#   ddp, zero1 and zero3 with the same first loss.
# - A gradient accumulation type other than fp32 or the precision, and an
#   unknown precision, are config errors that say what to write.
#
# usage: test_mixed_precision.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

common=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps=40 --set train.log_every=1 --set train.eval_every=0
  --set train.warmup_steps=5 --set device.threads=1 --set train.save_final=false)
zero3=(--set strategy.param_persistence_threshold=0 --set strategy.max_live_parameters=70000
  --set strategy.prefetch_bucket_size=20000 --set strategy.reduce_bucket_size=5000)

# run NAME RANKS PRECISION [ARGS...]
run() {
  local name=$1 np=$2 precision=$3
  shift 3
  on_ranks "$np" "$ZTRAIN" "${common[@]}" --set train.micro_batch_size=$((8 / np)) \
    --set train.precision="$precision" --set train.out_dir="$scratch/$name" "$@" \
    "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
  curve "$name" 40
  grep -q "precision: $precision working weights" "$scratch/$name.out" ||
    fail "$name does not report its precision"
  if grep -q "skipped on gradient overflow" "$scratch/$name.out"; then
    grep -q "^0 steps skipped" "$scratch/$name.out" || fail "$name skipped steps"
  fi
}

# sent NAME: the bytes this rank sent in the last step
sent() {
  metrics_fields "$scratch/$1/metrics.jsonl" train bytes_sent | tail -n 1
}

run fp32_ddp_w1 1 fp32
for precision in bf16 fp16; do
  run "${precision}_ddp_w1" 1 "$precision"
  run "${precision}_ddp_w2" 2 "$precision"
  run "${precision}_ddp_w2_noclip" 2 "$precision" --set train.grad_clip=0
  for stage in zero1 zero2 zero3; do
    extra=()
    [ "$stage" = zero3 ] && extra=("${zero3[@]}")
    run "${precision}_${stage}_w2" 2 "$precision" --strategy "$stage" "${extra[@]}"
    run "${precision}_${stage}_w2_noclip" 2 "$precision" --strategy "$stage" "${extra[@]}" \
      --set train.grad_clip=0
    same_training "${precision}_ddp_w2" "${precision}_${stage}_w2" 2e-4 4e-3
    same_training "${precision}_ddp_w2_noclip" "${precision}_${stage}_w2_noclip" 0 2e-6
  done
  for run_name in ddp_w1 ddp_w2 zero3_w2; do
    same_training fp32_ddp_w1 "${precision}_$run_name" 2e-3 2e-2
  done
done
grep -q "loss scale dynamic from 2^16" "$scratch/fp16_ddp_w1.out" || fail "fp16 does not scale dynamically"
grep -q "loss scale 1$" "$scratch/bf16_ddp_w1.out" || fail "bf16 does not keep a loss scale of 1"

run bf16acc32_zero2_w2 2 bf16 --strategy zero2 --set train.grad_accum_dtype=fp32 \
  --set train.grad_accum=2 --set train.micro_batch_size=2
grep -q "gradients accumulated and reduced in fp32" "$scratch/bf16acc32_zero2_w2.out" ||
  fail "grad_accum_dtype = fp32 was not applied"
same_training fp32_ddp_w1 bf16acc32_zero2_w2 2e-3 2e-2

for stage in ddp zero1 zero2 zero3; do
  extra=()
  [ "$stage" = zero3 ] && extra=("${zero3[@]}")
  run "fp32_${stage}_w2" 2 fp32 --strategy "$stage" "${extra[@]}"
  b32=$(sent "fp32_${stage}_w2") b16=$(sent "bf16_${stage}_w2")
  awk -v a="$b16" -v b="$b32" -v s="$stage" 'BEGIN { r = a / b;
      printf "%s: %d bytes per step in bf16, %d in fp32 (ratio %.4f)\n", s, a, b, r;
      exit !(r >= 0.4975 && r <= 0.5025) }' || fail "$stage: bf16 does not halve the bytes sent"
done

# Weights out of and into 16-bit working copies: zero3 in bf16 at world 2
# exports its working weights (gathered, widened); importing them into fp32
# ddp, bf16 ddp and bf16 zero1/zero3 at world 2 (masters set from the file,
# working copies rounded, exactly, since the values are bf16 already) gives
# the same loss for one lr-0 step (1e-6: only the GEMMs' blocking differs),
# the activations kept in fp32 (in bf16 they would be rounded, a difference
# of its own: test_activation_dtype).
probe() {
  local name=$1 np=$2 precision=$3
  shift 3
  on_ranks "$np" "$ZTRAIN" "${common[@]}" --set train.steps=1 --set train.lr=0 \
    --set train.min_lr=0 --set train.warmup_steps=0 --set train.micro_batch_size=$((8 / np)) \
    --set train.precision="$precision" --set model.init_from="$scratch/w_bf16_zero3" \
    --set train.out_dir="$scratch/$name" "$@" "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "probe $name failed"; }
  curve "$name" 1
}
run w_bf16_zero3 2 bf16 --strategy zero3 "${zero3[@]}" --set train.save_final=true
probe from_fp32_ddp 1 fp32
probe from_bf16_ddp 1 bf16 --set train.activation_dtype=fp32
probe from_bf16_zero1 2 bf16 --strategy zero1 --set train.activation_dtype=fp32
probe from_bf16_zero3 2 bf16 --strategy zero3 "${zero3[@]}" --set train.activation_dtype=fp32
for run_name in from_bf16_ddp from_bf16_zero1 from_bf16_zero3; do
  same_losses from_fp32_ddp "$run_name" 1e-6
done

bad=$("$ZTRAIN" "${common[@]}" --set train.precision=bf16 --set train.grad_accum_dtype=fp16 \
  "$SRC/configs/run.toml" 2>&1) && fail "bf16 with fp16 gradient accumulation was accepted"
grep -q 'grad_accum_dtype "fp16" with precision "bf16".*use "fp32" or "bf16"' <<< "$bad" ||
  fail "unclear error for a mismatched grad_accum_dtype: $bad"
bad=$("$ZTRAIN" "${common[@]}" --set train.precision=fp8 "$SRC/configs/run.toml" 2>&1) &&
  fail "precision fp8 was accepted"
grep -q "fp8" <<< "$bad" || fail "unclear error for an unknown precision: $bad"
echo "PASS"
