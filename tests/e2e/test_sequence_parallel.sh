#!/usr/bin/env bash
# Sequence parallelism (Ulysses, [parallel] sequence): each sequence split
# over a group of ranks must train exactly what ddp trains at world 1 on
# the same global batch, for GPT-2 (learned positions, fused qkv) and
# Llama shapes with 2 key/value heads (rotary positions; at sequence 4 each
# key/value head is shared by two ranks), with gradient accumulation,
# activation checkpointing (the forward runs again in backward, its
# all-to-alls too), sequence 2 x data 2 under zero1 and zero3, and bf16
# against bf16 ddp at world 1; evaluation too (the same val loss).
# Tolerances, relative per step: fp32 losses 1e-6 and gradient norms 2e-6,
# as for ddp across world sizes (the shards' parameter gradients are summed
# in another order than one process sums its batch; measured at most 1e-7
# and 5.4e-7 over 10 steps); bf16 2e-4 and 4e-3, the 16-bit tolerance of
# ranks against one rank (test_mixed_precision; measured 7e-6 and 1.5e-4,
# as ddp at world 2 against world 1 in bf16). Positions not offset per
# shard, heads crossed in an exchange or gradients not summed over the
# group are orders of magnitude larger.
# Then the bytes: every step's all-to-alls, counted by the communicator,
# equal the formula of four per layer and micro-step (six with
# checkpointing), each sending all but the rank's own block; and the
# refusals: a degree that
# does not divide the heads, the sequence or the world, named by key.
#
# usage: test_sequence_parallel.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sequence_lib.sh"

# GPT-2: 4 heads of 16.
base=(--model gpt2-tiny "${common[@]}")
train_run g_w1 1 8 1
train_run g_s2 2 8 1 --set parallel.sequence=2
train_run g_s4 4 8 1 --set parallel.sequence=4
train_run g_s2d2_zero1 4 4 1 --set parallel.sequence=2 --strategy zero1
for name in g_s2 g_s4 g_s2d2_zero1; do same_training g_w1 "$name" 1e-6 2e-6; done
grep -q "batch: 4 x 1 accum x 2 data ranks = 8 sequences of 32 tokens" "$scratch/g_s2d2_zero1.out" ||
  fail "sequence 2 x data 2 did not report its batch over the data ranks"
grep -q "mesh: sequence 2 x data 2: each sequence split over 2 ranks (Ulysses.*sequence groups 0-1 | 2-3; \[strategy\] across all 4 ranks" \
  "$scratch/g_s2d2_zero1.out" || fail "the run header does not name the mesh and its groups"

# Llama, 4 query heads over 2 key/value heads.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}")
train_run l_w1 1 4 2
train_run l_s2 2 4 2 --set parallel.sequence=2 --set train.checkpoint_every=5
train_run l_s4 4 4 2 --set parallel.sequence=4
train_run l_s2_ckpt 2 4 2 --set parallel.sequence=2 --set model.activation_checkpointing=true
train_run l_s2d2_zero3 4 2 2 --set parallel.sequence=2 --strategy zero3
for name in l_s2 l_s4 l_s2_ckpt l_s2d2_zero3; do same_training l_w1 "$name" 1e-6 2e-6; done
# Evaluation splits its sequences the same way: the same val loss.
same_val_loss g_w1 g_s2 g_s4
same_val_loss l_w1 l_s4 l_s2d2_zero3

# Checkpoints resume on another mesh: sequence 2's step 5, continued at
# world 1 and at sequence 4 under zero3, trains its steps 6 to 10.
resumed() {  # resumed NAME RANKS ARGS...: l_s2's step 5 continued into $scratch/NAME
  local name=$1 np=$2
  shift 2
  on_ranks "$np" "$ZTRAIN" "${base[@]}" --set train.micro_batch_size=4 --set train.grad_accum=2 \
    --set train.out_dir="$scratch/$name" --resume="$scratch/l_s2/step_5" "$@" \
    "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 || fail "resuming l_s2 as $name failed"
  curve "$name" 5
  same_training l_s2_last5 "$name" 1e-6 2e-6
}
tail -n 5 "$scratch/l_s2.curve" > "$scratch/l_s2_last5.curve"
resumed l_s2_to_w1 1 --set parallel.sequence=1
resumed l_s2_to_s4_zero3 4 --set parallel.sequence=4 --strategy zero3
train_run l_w1_bf16 1 4 2 --set train.precision=bf16
train_run l_s2_bf16 2 4 2 --set train.precision=bf16 --set parallel.sequence=2
same_training l_w1_bf16 l_s2_bf16 2e-4 4e-3

# all_to_all bytes per step over all ranks: per layer and micro-step, each
# of the S ranks of each group sends S-1 of its S blocks of each exchange:
# forward q, k and v (B*T/S*(h + 2 kv)*hs floats, h = heads/S, kv the
# key/value heads a rank gets) and the output (B*T/S*h*hs); backward the
# output's gradient with the output (twice that), then q's, k's and v's
# gradients. a2a_bytes RANKS S MICRO ACCUM HEADS KV_HEADS FORWARDS (2 with
# checkpointing, which runs each forward again in backward).
a2a_bytes() {
  local ranks=$1 s=$2 micro=$3 accum=$4 heads=$5 kv=$6 forwards=$7 hs=16 layers=2 tokens=32
  local h=$((heads / s)) k=$((kv >= s ? kv / s : 1)) rows=$((micro * tokens / s))
  local qkv=$((rows * (h + 2 * k) * hs)) out=$((rows * h * hs))
  echo $((ranks * layers * accum * (s - 1) * 4 * (forwards * (qkv + out) + qkv + 2 * out)))
}
check_bytes g_s2 all_to_all "$(a2a_bytes 2 2 8 1 4 4 1)"
check_bytes g_s4 all_to_all "$(a2a_bytes 4 4 8 1 4 4 1)"
check_bytes g_s2d2_zero1 all_to_all "$(a2a_bytes 4 2 4 1 4 4 1)"
check_bytes l_s2 all_to_all "$(a2a_bytes 2 2 4 2 4 2 1)"
check_bytes l_s4 all_to_all "$(a2a_bytes 4 4 4 2 4 2 1)"
# Recomputing a block's forward in backward exchanges its q, k, v and
# output once more (six all-to-alls a layer).
check_bytes l_s2_ckpt all_to_all "$(a2a_bytes 2 2 4 2 4 2 2)"
check_bytes l_w1 all_to_all 0
check_bytes l_s2 permute 0

# Memory, measured: a rank of a sequence group of 4 holds a quarter of the
# unsharded run's activations within 10% (measured 26.4%: what is not
# divided is the exchanges' buffers, which the layers share, and the
# head's chunk of logits), and `ztrain estimate` says what it measures.
split_activations sequence 0.275

# Refused by key, before anything trains.
refused "a degree that does not divide the heads" \
  "[parallel] sequence = 3: Ulysses gives each of the 3 ranks of a sequence group an equal share of the 4 attention heads, which 3 does not divide" \
  3 "$ZTRAIN" "${base[@]}" --set parallel.sequence=3 "$SRC/configs/run.toml"
refused "a degree that does not divide the sequence" \
  "--set parallel.sequence=4: [parallel] sequence = 4: each rank holds an equal share of the 34-token sequences" \
  4 "$ZTRAIN" "${base[@]}" --set model.seq_len=34 --set parallel.sequence=4 "$SRC/configs/run.toml"
refused "a degree that does not divide the world" \
  "[parallel] tensor x sequence x context x pipeline = 2 ranks per copy of the model do not divide the world of 1 rank" \
  1 "$ZTRAIN" "${base[@]}" --set parallel.sequence=2 "$SRC/configs/run.toml"
echo "PASS"
