#!/usr/bin/env bash
# Equivalence: ddp at world 1, 2 and 4 (mpirun, oversubscribed), with and
# without gradient accumulation and clipping, and zero1 at world 1, 2 and 4,
# train gpt2-tiny-shaped models on the same global batch and must log the
# same losses and gradient norms as ddp at world 1 without accumulation.
# The gradient norm is logged before clipping, so it sees a wrong gradient
# scale (an average that sums, accumulation that does not divide) which
# clipping and AdamW hide from the losses.
# Tolerances, relative per step: losses 1e-6 (the ranks' gradients are
# summed in another order than one process sums its batch: measured at
# most 9.5e-8, one ulp of the logged loss, over 20 steps); gradient norms
# 2e-6 (measured at most 3.3e-7). Anything wrong in the data split, averaging or
# accumulation is orders of magnitude larger.
# Then the bytes each step sends, counted by the communicator, against the
# ring's exact totals over ranks: 2 (N-1) x 4 bytes per gradient element
# (psi = 118528 for this GPT-2 shape, no padding: every size is a multiple
# of 16) plus the loss average's three elements (the loss, the stop
# request and the checkpoint-written flag): a bucket reduced twice or
# never shows.
#
# usage: test_world_equivalence.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

NORM_TOL=2e-6
steps=20
base=(--model gpt2-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256 --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=20
  --set train.warmup_steps=5 --set device.threads=1 --set train.save_final=false)

train_run w1 1 8 1
train_run w1_accum 1 2 4
train_run w2 2 4 1
train_run w2_accum 2 2 2
train_run w4 4 2 1
train_run w4_accum 4 1 2
train_run w2_small_buckets 2 4 1 --set strategy.reduce_bucket_size=5000
train_run w2_no_overlap 2 2 2 --set strategy.overlap_comm=false
train_run zero1_w1 1 8 1 --strategy zero1
train_run zero1_w2_accum 2 2 2 --strategy zero1
train_run zero1_w4 4 2 1 --strategy zero1
for name in w1_accum w2 w2_accum w4 w4_accum w2_small_buckets w2_no_overlap zero1_w1 zero1_w2_accum zero1_w4; do
  same_training w1 "$name" 1e-6 "$NORM_TOL"
done
# Without clipping every gradient scale reaches the update.
train_run w1_noclip 1 8 1 --set train.grad_clip=0
train_run w4_accum_noclip 4 1 2 --set train.grad_clip=0
train_run zero1_w2_accum_noclip 2 2 2 --strategy zero1 --set train.grad_clip=0
for name in w4_accum_noclip zero1_w2_accum_noclip; do same_training w1_noclip "$name" 1e-6 "$NORM_TOL"; done
grep -q "batch: 2 x 2 accum x 2 ranks = 8 sequences" "$scratch/w2_accum.out" ||
  fail "world 2 did not report its batch layout"

psi=118528
for case in "w2 2" "w4 4" "w2_small_buckets 2" "w2_accum 2" "w2_no_overlap 2"; do
  set -- $case
  n=$2
  check_bytes "$1" all_reduce $((2 * (n - 1) * 4 * (psi + 3)))
  for kind in reduce_scatter all_gather broadcast barrier; do check_bytes "$1" "$kind" 0; done
done
echo "PASS"
