#!/usr/bin/env bash
# Activations kept in the run's precision ([train] activation_dtype; unset,
# the precision): under bf16 and fp16 every tensor a backward reads is
# rounded to the 16-bit type where it is produced and held in it until its
# backward.
# - The same computation however the kept tensors are held: without
#   checkpointing (each block's own 16-bit copies, restored into one fp32
#   working set), with checkpointing (recomputed and rounded again), with
#   the checkpoints offloaded to host memory (in 16 bits; five layers, so
#   the device streams rotate) and Ulysses' head shards: the same losses
#   and gradient norms to the bit, GPT-2 and Llama, bf16 and fp16; a value
#   restored that the forward did not read would differ in the last bits.
# - Rounded indeed: the losses differ from the same run keeping fp32
#   activations, by a 16-bit rounding's share (under 1e-3 relative).
# - Memory, measured: each further layer adds exactly half the bytes it
#   adds in fp32, checkpointed or not (its statistics aside, fp32, as the
#   peers keep them); the host holds the offloaded block
#   inputs in 16 bits; `ztrain estimate` says what is measured, to the
#   byte.
# - A type other than fp32 or the precision is a config error saying what
#   to write.
#
# usage: test_activation_dtype.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sequence_lib.sh"

for precision in bf16 fp16; do
  base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" --set model.n_layer=5
    --set train.precision="$precision")
  train_run "l_$precision" 1 8 1
  train_run "l_${precision}_ckpt" 1 8 1 --set model.activation_checkpointing=true
  train_run "l_${precision}_offload" 1 8 1 --set model.activation_checkpointing=true \
    --set model.offload_checkpoints=true
  train_run "l_${precision}_fp32" 1 8 1 --set train.activation_dtype=fp32
  same_training "l_$precision" "l_${precision}_ckpt" 0 0
  same_training "l_$precision" "l_${precision}_offload" 0 0
  same_losses "l_$precision" "l_${precision}_fp32" 1e-3
  cmp -s <(cut -d' ' -f2 "$scratch/l_$precision.curve") <(cut -d' ' -f2 "$scratch/l_${precision}_fp32.curve") &&
    fail "$precision: keeping the activations in $precision trains exactly what fp32 activations train"
  same_val_loss "l_$precision" "l_${precision}_ckpt"
  grep -q "reduced in $precision, activations kept in $precision, loss scale" "$scratch/l_$precision.out" ||
    fail "the $precision run's header does not say its activations are kept in $precision"
  grep -q "activations kept in fp32, loss scale" "$scratch/l_${precision}_fp32.out" ||
    fail "the run keeping fp32 activations does not say so"
done

base=(--model gpt2-tiny "${common[@]}" --set train.precision=bf16)
train_run g_bf16 1 8 1
train_run g_bf16_ckpt 1 8 1 --set model.activation_checkpointing=true
same_training g_bf16 g_bf16_ckpt 0 0

# Ulysses keeps its head shards of q, k and v per block, in 16 bits too.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" --set train.precision=bf16)
train_run u_bf16 2 4 2 --set parallel.sequence=2
train_run u_bf16_ckpt 2 4 2 --set parallel.sequence=2 --set model.activation_checkpointing=true
same_training u_bf16 u_bf16_ckpt 0 0

# Memory: a 1024-token Llama at 8 and 16 layers, activations kept in fp32
# and in bf16, checkpointed or not. Each run measures what `ztrain
# estimate` says; the eight layers more cost half the bytes in bf16.
mem=(--model llama-tiny --set model.n_kv_head=4 --set model.seq_len=1024
  --set model.loss_chunk_tokens=256 --set train.steps=1 --set train.global_batch_size=1
  --set train.eval_every=0 --set device.threads=1 --set train.save_final=false
  --set train.precision=bf16)
for ckpt in false true; do
  for kept in fp32 bf16; do
    for layers in 8 16; do
      name="m_${ckpt}_${kept}_$layers"
      args=("${mem[@]}" --set model.n_layer="$layers" --set train.activation_dtype="$kept"
        --set model.activation_checkpointing="$ckpt")
      "$ZTRAIN" "${args[@]}" --set train.out_dir="$scratch/$name" "$SRC/configs/run.toml" \
        > "$scratch/$name.out" 2>&1 || { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
      estimated=$("$ZTRAIN" estimate --world 1 "${args[@]}" "$SRC/configs/run.toml" |
        awk '$1 == "device" && $2 == "activations" { print $3 }')
      [ "$estimated" = "$(peak_activations "$name")" ] ||
        fail "$name: the estimate's activations ($estimated) are not the measured $(peak_activations "$name")"
    done
  done
  f8=$(peak_activations "m_${ckpt}_fp32_8") f16=$(peak_activations "m_${ckpt}_fp32_16")
  b8=$(peak_activations "m_${ckpt}_bf16_8") b16=$(peak_activations "m_${ckpt}_bf16_16")
  echo "checkpointing $ckpt: 8 and 16 layers hold $f8 and $f16 bytes in fp32, $b8 and $b16 in bf16"
  # Without checkpointing each layer also keeps its statistics in fp32:
  # two norms' rstd and the attention's lse of 4 heads, 6 floats a token.
  stats=0
  [ "$ckpt" = true ] || stats=$((8 * 6 * 1024 * 4))
  [ $((2 * (b16 - b8))) -eq $((f16 - f8 + stats)) ] ||
    fail "checkpointing $ckpt: eight more layers add $((b16 - b8)) bytes in bf16, not half of fp32's $((f16 - f8)) and their fp32 statistics"
done

# Offloaded checkpoints: the host holds the five block inputs in 16 bits.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" --set model.n_layer=5
  --set train.precision=bf16)
[ "$(peak_activations l_bf16_offload host)" -eq $((5 * 8 * 32 * 64 * 2)) ] ||
  fail "the host holds $(peak_activations l_bf16_offload host) bytes of bf16 checkpoints, not five streams of 2 bytes"

refused "fp16 activations under bf16" 'activation_dtype "fp16" with precision "bf16": activations are kept in fp32 or in the working precision; use "fp32" or "bf16"' \
  1 "$ZTRAIN" "${base[@]}" --set train.activation_dtype=fp16 "$SRC/configs/run.toml"
refused "bf16 activations under fp32" 'activation_dtype "bf16" with precision "fp32": activations are kept in fp32 or in the working precision; use "fp32"' \
  1 "$ZTRAIN" "${base[@]}" --set train.precision=fp32 --set train.activation_dtype=bf16 "$SRC/configs/run.toml"
echo "PASS test_activation_dtype"
