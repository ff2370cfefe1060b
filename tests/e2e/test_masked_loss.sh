#!/usr/bin/env bash
# The loss on the trained tokens only: targets masked (-100, as a
# fine-tuning example's prompt) are skipped, and the loss is the mean over
# the trained tokens of the whole global batch, so it does not depend on
# how the batch is split. The synthetic source masks each sequence's first
# 0 to 24 of 32 targets (masked_prefix), so micro-batches and ranks hold
# very different numbers of trained tokens: a mean of micro-batch means, or
# of rank means, would differ at once.
# - The same global batch as micro 8 x accumulation 1 at world 1: micro 2 x
#   accumulation 4, world 2 under ddp, zero1, zero2, zero3 and
#   cpu_offload, world 4 under zero3 with accumulation 2, Ulysses and the
#   ring on Llama (the masks cut across the shards): losses and gradient
#   norms within 1e-6 and 2e-6 per step (fp32; test_sequence_parallel's),
#   val losses within 1e-6 (and within 5 % of the last train loss: a mean
#   over the trained tokens too); bf16 at world 2 against bf16 at world 1 within
#   2e-4 and 4e-3.
# - A checkpoint of world 2 resumes at world 1 with the same steps 6 to 10.
# - Every target masked is a DataError naming the step, before it trains;
#   an ignored target from a source that declares no masks is a DataError
#   (test_data).
#
# usage: test_masked_loss.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sequence_lib.sh"

base=(--model gpt2-tiny "${common[@]}" --set data.masked_prefix=24)
train_run g_w1 1 8 1
train_run g_accum 1 2 4
train_run g_w2 2 4 1 --set train.checkpoint_every=5
for strategy in zero1 zero2 zero3 cpu_offload; do
  train_run "g_w2_$strategy" 2 4 1 --strategy "$strategy"
done
train_run g_w4_zero3 4 1 2 --strategy zero3
for name in g_accum g_w2 g_w2_zero1 g_w2_zero2 g_w2_zero3 g_w2_cpu_offload g_w4_zero3; do
  same_training g_w1 "$name" 1e-6 2e-6
done
same_val_loss g_w1 g_accum g_w2 g_w4_zero3
# The val loss is the mean over the trained tokens too: near the train
# loss of the same step (a mean over every position, the masked ones at 0,
# would be about 60 % of it here).
val=$(metrics_fields "$scratch/g_w1/metrics.jsonl" val loss)
train=$(tail -n 1 "$scratch/g_w1.curve" | cut -d' ' -f2)
awk -v v="$val" -v t="$train" 'BEGIN { d = (v - t) / t; if (d < 0) d = -d; exit !(d <= 0.05) }' ||
  fail "the val loss $val is not within 5 % of the last train loss $train"

# Unmasked, the same source trains something else: the masks reach the loss.
train_run g_unmasked 1 8 1 --set data.masked_prefix=0
cmp -s <(cut -d' ' -f2 "$scratch/g_w1.curve") <(cut -d' ' -f2 "$scratch/g_unmasked.curve") &&
  fail "masking the targets did not change the losses"

tail -n 5 "$scratch/g_w2.curve" > "$scratch/g_w2_last5.curve"
on_ranks 1 "$ZTRAIN" "${base[@]}" --set train.micro_batch_size=8 --set train.out_dir="$scratch/g_resumed" \
  --resume="$scratch/g_w2/step_5" "$SRC/configs/run.toml" > "$scratch/g_resumed.out" 2>&1 ||
  { cat "$scratch/g_resumed.out" >&2; fail "resuming world 2's step 5 at world 1 failed"; }
curve g_resumed 5
same_training g_w2_last5 g_resumed 1e-6 2e-6

base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" --set data.masked_prefix=24)
train_run l_w1 1 4 2
train_run l_s2 2 4 2 --set parallel.sequence=2
train_run l_c2 2 4 2 --set parallel.context=2
train_run l_c2d2_zero3 4 2 2 --set parallel.context=2 --strategy zero3
for name in l_s2 l_c2 l_c2d2_zero3; do same_training l_w1 "$name" 1e-6 2e-6; done
train_run l_w1_bf16 1 4 2 --set train.precision=bf16
train_run l_w2_bf16 2 2 2 --set train.precision=bf16 --strategy zero2
same_training l_w1_bf16 l_w2_bf16 2e-4 4e-3

# Sequences of 4 tokens, each masking its first 0 to 1000: this seed's
# first batch masks every target.
refused "a batch with every target masked" "step 1: every target of the global batch is masked (-100)" \
  1 "$ZTRAIN" "${base[@]}" --set model.seq_len=4 --set data.masked_prefix=1000 \
  --set train.out_dir="$scratch/all_masked" "$SRC/configs/run.toml"
echo "PASS test_masked_loss"
