#!/usr/bin/env bash
# Equivalence of the ZeRO stages: zero1, zero2 and zero3 at world 1, 2 and 4
# (mpirun, oversubscribed), with and without gradient accumulation, with and
# without activation checkpointing, must log the 20-step loss curve and
# gradient norms of ddp at world 1 on gpt2-tiny-shaped models, with
# clipping and without (the norm is logged before clipping, which hides a
# wrong gradient scale from the losses); so must every stage at world 2 and
# 4 on a model whose parameter count (36399) and parameter sizes are odd,
# so shards split parameters mid-way. zero3 runs with every parameter
# sharded (param_persistence_threshold = 0), a live cap below the model
# size and small prefetch and reduce buckets, so gathers, evictions and
# buckets all happen, and also at its default persistence threshold.
# Tolerances as test_world_equivalence.sh: losses 1e-6, gradient norms 2e-6
# relative per step.
# Then the bytes each step sends, counted by the communicator, against the
# exact ring totals over all ranks (N ranks, 4 bytes per element, psi
# elements): a reduce-scatter of every gradient (N-1) 4 psi per reduction
# (zero1 once a step, zero2 and zero3 every micro-step), zero1's and
# zero2's all-gather of the stepped parameters (N-1) 4 psi, zero3's
# gathers (N-1) 4 psi for forward and again for backward per micro-step
# (prefetch and reuse off; on an untied Llama, see below), and the small
# all-reduces of 2 (N-1) 4 bytes per element: the loss with the stop and
# checkpoint-written flags (3 elements) and the global norm (1): a bucket reduced twice or never, or a gather too many, shows. And
# weights exported from zero3 and imported into it match ddp's.
#
# usage: test_zero_equivalence.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

steps=20
base=(--set model.n_layer=2 --set model.seq_len=32 --set model.vocab_size=256
  --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=20 --set train.warmup_steps=5
  --set device.threads=1 --set train.save_final=false)
wide=(--model gpt2-tiny --set model.n_embd=64)
odd=(--model gpt2-tiny --set model.n_embd=33 --set model.n_head=3 --set model.vocab_size=251)
zero3=(--set strategy.param_persistence_threshold=0 --set strategy.max_live_parameters=70000
  --set strategy.prefetch_bucket_size=20000 --set strategy.reduce_bucket_size=5000)

# compare REFERENCE NAME...: losses and gradient norms
compare() {
  local ref=$1 name
  shift
  for name in "$@"; do same_training "$ref" "$name" 1e-6 2e-6; done
}

train_run ddp_w1 1 8 1 "${wide[@]}"
names=()
for stage in zero1 zero2 zero3; do
  extra=()
  [ "$stage" = zero3 ] && extra=("${zero3[@]}")
  for layout in "1 8 1" "1 4 2" "2 4 1" "2 2 2" "4 2 1" "4 1 2"; do
    set -- $layout
    for ckpt in false true; do
      name="${stage}_w$1_m$2_a$3_ckpt_$ckpt"
      train_run "$name" "$1" "$2" "$3" "${wide[@]}" --strategy "$stage" "${extra[@]}" \
        --set model.activation_checkpointing="$ckpt"
      names+=("$name")
    done
  done
done
compare ddp_w1 "${names[@]}"
# Without clipping, and zero3 at its default options (every parameter of
# this model is under the persistence threshold of 1e5: gathered once and
# kept, refreshed after each step).
train_run ddp_w1_noclip 1 8 1 "${wide[@]}" --set train.grad_clip=0
noclip=()
for stage in zero1 zero2 zero3; do
  extra=()
  [ "$stage" = zero3 ] && extra=("${zero3[@]}")
  train_run "${stage}_w2_a2_noclip" 2 2 2 "${wide[@]}" --strategy "$stage" "${extra[@]}" --set train.grad_clip=0
  train_run "${stage}_w4_a2_noclip" 4 1 2 "${wide[@]}" --strategy "$stage" "${extra[@]}" --set train.grad_clip=0
  noclip+=("${stage}_w2_a2_noclip" "${stage}_w4_a2_noclip")
done
train_run zero3_default_w2 2 4 1 "${wide[@]}" --strategy zero3
train_run zero3_default_w4_noclip 4 1 2 "${wide[@]}" --strategy zero3 --set train.grad_clip=0
compare ddp_w1 zero3_default_w2
compare ddp_w1_noclip "${noclip[@]}" zero3_default_w4_noclip

train_run odd_ddp_w1 1 8 1 "${odd[@]}"
grep -q "36.4k params" "$scratch/odd_ddp_w1.out" || fail "the odd model is not 36399 parameters"
odd_names=()
for stage in zero1 zero2 zero3; do
  extra=()
  [ "$stage" = zero3 ] && extra=("${zero3[@]}")
  for np in 2 4; do
    train_run "odd_${stage}_w$np" "$np" $((8 / np)) 1 "${odd[@]}" --strategy "$stage" "${extra[@]}"
    odd_names+=("odd_${stage}_w$np")
  done
done
compare odd_ddp_w1 "${odd_names[@]}"

# Weights out of and into sharded parameters: zero3 at world 4 exports
# (gathering every parameter) what ddp at world 1 exports, and imports what
# ddp would. probe: the loss of one lr-0 step from a weights file.
probe() {
  local name=$1 np=$2 weights=$3
  shift 3
  on_ranks "$np" "$ZTRAIN" "${base[@]}" "${wide[@]}" --set train.steps=1 --set train.lr=0 \
    --set train.min_lr=0 --set train.warmup_steps=0 --set train.micro_batch_size=$((8 / np)) \
    --set model.init_from="$weights" --set train.out_dir="$scratch/$name" "$@" \
    "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 || { cat "$scratch/$name.out" >&2; fail "probe $name failed"; }
  curve "$name" 1
}
train_run w_ddp 1 8 1 "${wide[@]}" --set train.save_final=true
train_run w_zero3 4 2 1 "${wide[@]}" --strategy zero3 "${zero3[@]}" --set train.save_final=true
probe from_ddp 1 "$scratch/w_ddp"
probe from_zero3 1 "$scratch/w_zero3"
probe zero3_from_ddp 2 "$scratch/w_ddp" --strategy zero3 "${zero3[@]}"
for name in from_zero3 zero3_from_ddp; do same_losses from_ddp "$name" 1e-6; done
grep -q "weights from $scratch/w_ddp" "$scratch/zero3_from_ddp.out" || fail "zero3 did not report its initial weights"
# Training goes on from imported weights: the optimizer's fp32 master
# weights took them too (ddp and zero1 set them beside their bf16 replica,
# zero3 in its shard), so three bf16 steps from ddp's file agree under
# every strategy (within the bf16 tolerance of test_mixed_precision.sh).
go_on() {
  local name=$1 np=$2
  shift 2
  on_ranks "$np" "$ZTRAIN" "${base[@]}" "${wide[@]}" --set train.steps=3 \
    --set train.micro_batch_size=$((8 / np)) --set model.init_from="$scratch/w_ddp" \
    --set train.precision=bf16 --set train.out_dir="$scratch/$name" "$@" "$SRC/configs/run.toml" \
    > "$scratch/$name.out" 2>&1 || { cat "$scratch/$name.out" >&2; fail "run $name from imported weights failed"; }
  curve "$name" 3
}
go_on on_ddp 1
go_on on_zero1 2 --strategy zero1
go_on on_zero3 2 --strategy zero3 "${zero3[@]}"
for name in on_zero1 on_zero3; do same_losses on_ddp "$name" 2e-4; done

# zero_bytes NAME RANKS REDUCTIONS GATHERS PSI: the counted bytes of a ZeRO
# step against the ring totals (above).
zero_bytes() {
  local name=$1 n=$2 reductions=$3 gathers=$4 psi=$5
  check_bytes "$name" reduce_scatter $((reductions * (n - 1) * 4 * psi))
  check_bytes "$name" all_gather $((gathers * (n - 1) * 4 * psi))
  check_bytes "$name" all_reduce $((2 * 4 * (n - 1) * 4))
  check_bytes "$name" broadcast 0
}
psi=118528
for np in 2 4; do
  for stage in zero1 zero2; do
    zero_bytes "${stage}_w${np}_m$((8 / np))_a1_ckpt_false" "$np" 1 1 "$psi"
  done
  zero_bytes "zero1_w${np}_m$((4 / np))_a2_ckpt_false" "$np" 1 1 "$psi"
  zero_bytes "zero2_w${np}_m$((4 / np))_a2_ckpt_false" "$np" 2 1 "$psi"
done
# zero3 on an untied Llama: GPT-2's tied embedding is gathered for both
# modules using it, in both passes, which ZeRO's 3 psi does not count.
llama=(--model llama-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256)
train_run llama_ddp_w1 1 8 1 "${llama[@]}"
grep -q "164.2k params" "$scratch/llama_ddp_w1.out" || fail "the Llama shape is not 164160 parameters"
for np in 2 4; do
  for accum in 1 2; do
    name="zero3_bytes_w${np}_a$accum"
    train_run "$name" "$np" $((8 / np / accum)) "$accum" "${llama[@]}" --strategy zero3 "${zero3[@]}" \
      --set strategy.prefetch_bucket_size=0 --set strategy.max_reuse_distance=0
    compare llama_ddp_w1 "$name"
    zero_bytes "$name" "$np" "$accum" $((2 * accum)) 164160
  done
done
echo "PASS"
