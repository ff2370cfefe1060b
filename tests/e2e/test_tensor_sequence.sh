#!/usr/bin/env bash
# Megatron's sequence parallelism inside the tensor group ([parallel]
# tensor_sequence): the residual stream, the norms and the embedding's
# output split by tokens over the tensor ranks, the regions between them
# reading their rows all-gathered and returning their sums
# reduce-scattered, the norms' weight gradients summed over the group. It
# must train exactly what ddp trains at world 1: GPT-2 at tensor 2 and 4,
# Llama with 2 key/value heads at tensor 2, tensor 2 x data 2 under zero3
# with activation checkpointing and with its checkpoints offloaded, LoRA,
# bf16 against bf16 at world 1 (the tensor-parallel tests' tolerances:
# fp32 losses 1e-6 and norms 2e-6, LoRA's norms 4e-6, bf16 2e-4 and 4e-3),
# and fp16 through overflows the loss scaler skips on every rank alike;
# evaluation too. Then the bytes a step moves, counted by the
# communicators, against the formula; the activations a rank holds
# measured below tensor parallelism's alone, and as `ztrain estimate`
# says; and the refusals.
#
# usage: test_tensor_sequence.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sequence_lib.sh"

sp=(--set parallel.tensor_sequence=true)
base=(--model gpt2-tiny "${common[@]}")
train_run g_w1 1 8 1
train_run g_t2 2 8 1 --set parallel.tensor=2
train_run g_sp2 2 8 1 --set parallel.tensor=2 "${sp[@]}"
train_run g_sp4 4 8 1 --set parallel.tensor=4 "${sp[@]}"
for name in g_sp2 g_sp4; do same_training g_w1 "$name" 1e-6 2e-6; done
grep -q "mesh: tensor 2: .*the tokens between them too (tensor_sequence)" "$scratch/g_sp2.out" ||
  fail "the run header does not say the tokens are split over the tensor group"
same_val_loss g_w1 g_sp2 g_sp4
# compare --parallel takes the key too, and names it.
compared_on_mesh ddp,zero2 tensor=2,tensor_sequence=true "tensor 2 (tensor_sequence)"

base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}")
train_run l_w1 1 4 2
train_run l_sp2 2 4 2 --set parallel.tensor=2 "${sp[@]}"
train_run l_sp2d2_ckpt 4 2 2 --set parallel.tensor=2 "${sp[@]}" --strategy zero3 \
  --set model.activation_checkpointing=true
train_run l_sp2_offload 2 4 2 --set parallel.tensor=2 "${sp[@]}" \
  --set model.activation_checkpointing=true --set model.offload_checkpoints=true
for name in l_sp2 l_sp2d2_ckpt l_sp2_offload; do same_training l_w1 "$name" 1e-6 2e-6; done
lora=(--set 'model.finetuning_type="lora"' --set model.lora_rank=4)
train_run l_w1_lora 1 4 2 "${lora[@]}"
train_run l_sp2_lora 2 4 2 --set parallel.tensor=2 "${sp[@]}" "${lora[@]}"
same_training l_w1_lora l_sp2_lora 1e-6 4e-6
train_run l_w1_bf16 1 4 2 --set train.precision=bf16
train_run l_sp2_bf16 2 4 2 --set train.precision=bf16 --set parallel.tensor=2 "${sp[@]}"
same_training l_w1_bf16 l_sp2_bf16 2e-4 4e-3
# fp16 from a loss scale of 2^24: the first steps overflow (5 of 10 at
# world 1), on some parts before others; the group's summed norm makes
# every rank skip the same steps and halve the same scale as world 1, then
# train the same steps, with tensor parallelism alone and with the split
# tokens. (From 2^40 every step overflowed, and nothing trained.)
fp16=(--set train.precision=fp16 --set train.fp16.initial_scale_power=24)
train_run l_w1_fp16 1 4 2 "${fp16[@]}"
train_run l_t2_fp16 2 4 2 "${fp16[@]}" --set parallel.tensor=2
train_run l_sp2_fp16 2 4 2 "${fp16[@]}" --set parallel.tensor=2 "${sp[@]}"
for name in l_t2_fp16 l_sp2_fp16; do
  same_training l_w1_fp16 "$name" 2e-4 4e-3
  [ "$(grep -c "^overflow: skipping step" "$scratch/$name.out")" = \
    "$(grep -c "^overflow: skipping step" "$scratch/l_w1_fp16.out")" ] ||
    fail "$name skipped other steps than world 1 on overflow"
done
grep -q "^overflow: skipping step 1 " "$scratch/l_w1_fp16.out" || fail "2^24 did not overflow at step 1"
[ "$(grep -c "^overflow: skipping step" "$scratch/l_w1_fp16.out")" -lt "$steps" ] ||
  fail "from 2^24 every step overflowed: nothing trained to compare"

# The bytes of a step over all ranks (L = 2 layers, C = 64, micro x 32
# tokens of C floats a pass, a ring over T ranks sending (T-1) times an
# all-gather's or reduce-scatter's whole and 2 (T-1) times an
# all-reduce's). Per micro-step: all-gathers of the norms' outputs (2 a
# layer forward, again in backward), of the gradients the regions read
# (2 a layer) and of the final norm's output and the embedding's gradient:
# 6 L + 2; reduce-scatters of the regions' outputs and input gradients, 4
# a layer, and of the embedding's output and the head's input gradient:
# 4 L + 2; all-reduces of the norms' weight gradients (2 L + 1 norms of 2 C
# floats, GPT-2's weight and bias) and the loss's three floats a token;
# a step adds the gradient norm (one float over the group) and the ranks'
# agreement (three floats over the world).
passes() { echo $((8 * 32 * 64)); }
check_bytes g_sp2 all_gather $((4 * (6 * 2 + 2) * $(passes)))
check_bytes g_sp2 reduce_scatter $((4 * (4 * 2 + 2) * $(passes)))
check_bytes g_sp2 all_reduce $((4 * (2 * ((2 * 2 + 1) * 2 * 64 + 3 * 8 * 32) + 2 + 2 * 3)))

# The activations: the streams and norms a rank holds divide by T, so it
# holds less than tensor parallelism alone; estimate says what it holds.
sp_act=$(peak_bytes g_sp2 activations) tp_act=$(peak_bytes g_t2 activations)
echo "activations a rank at tensor 2: $tp_act bytes, with tensor_sequence $sp_act"
[ "$sp_act" -lt "$tp_act" ] || fail "tensor_sequence holds $sp_act bytes of activations, tensor 2 alone $tp_act"
base=(--model gpt2-tiny "${common[@]}")
estimated_as_measured g_sp2 2 "${base[@]}" --set parallel.tensor=2 "${sp[@]}" \
  --set train.micro_batch_size=8

# Refused by key, before anything trains.
refused "tensor_sequence without a tensor group" \
  "--set parallel.tensor_sequence=true: [parallel] tensor_sequence splits the tokens over the tensor group, and tensor = 1 makes none" \
  1 "$ZTRAIN" "${base[@]}" "${sp[@]}" "$SRC/configs/run.toml"
refused "tensor_sequence beside Ulysses" \
  "--set parallel.tensor_sequence=true: [parallel] tensor_sequence with [parallel] sequence = 2" \
  4 "$ZTRAIN" "${base[@]}" --set parallel.tensor=2 --set parallel.sequence=2 "${sp[@]}" \
  "$SRC/configs/run.toml"
refused "a batch the degree does not divide into rows" \
  "does not split into [parallel] tensor = 4 equal shares of rows ([parallel] tensor_sequence)" \
  4 "$ZTRAIN" "${base[@]}" --set parallel.tensor=4 "${sp[@]}" --set model.seq_len=30 \
  --set train.micro_batch_size=1 --set train.out_dir="$scratch/refused_rows" "$SRC/configs/run.toml"
echo "PASS"
