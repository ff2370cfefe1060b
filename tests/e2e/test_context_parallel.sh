#!/usr/bin/env bash
# Context parallelism (ring attention, [parallel] context): each sequence
# split over a ring of ranks, each holding the mirrored pair of chunks
# r and 2R-1-r, must train exactly what ddp trains at world 1 on the same
# global batch: GPT-2 (learned positions, which jump between a rank's two
# chunks) and Llama with 2 key/value heads (rotary positions), at context
# 2 and 4, with gradient accumulation, activation checkpointing (the ring
# runs again in backward), context 2 x data 2 under zero1 and zero3,
# context 2 under zero3_offload (and through `ztrain compare --parallel`),
# Ulysses inside the ring (sequence 2 x context 2), a degree beyond the
# head count (where Ulysses is refused), and bf16 against bf16 ddp at
# world 1; evaluation too (the same val loss).
# Tolerances, relative per step, as test_sequence_parallel's: fp32 losses
# 1e-6 and gradient norms 2e-6 (the blocks' softmax sums and the ring's
# key/value gradients add in other orders than one process's kernel);
# bf16 2e-4 and 4e-3. A chunk at the wrong position, a block with the
# wrong mask or a key/value gradient that does not come home is orders of
# magnitude larger.
# Then the bytes: every step's passes, counted by the communicator, equal
# the formula (per layer and micro-step R-1 key/value passes forward, R-1
# and R gradient passes backward, each B*2c*2*NKV*hs floats); the memory:
# a rank of a ring of 4 holds about a quarter of the unsharded
# activations, as `ztrain estimate` says; and the refusals by key.
#
# usage: test_context_parallel.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sequence_lib.sh"

# GPT-2: 4 heads of 16.
base=(--model gpt2-tiny "${common[@]}")
train_run g_w1 1 8 1
train_run g_c2 2 8 1 --set parallel.context=2
train_run g_c4 4 8 1 --set parallel.context=4
train_run g_c2d2_zero1 4 4 1 --set parallel.context=2 --strategy zero1
for name in g_c2 g_c4 g_c2d2_zero1; do same_training g_w1 "$name" 1e-6 2e-6; done
grep -q "batch: 4 x 1 accum x 2 data ranks = 8 sequences of 32 tokens" "$scratch/g_c2d2_zero1.out" ||
  fail "context 2 x data 2 did not report its batch over the data ranks"
grep -q "mesh: context 2 x data 2: each sequence split over 2 ranks (ring attention.*context groups 0-1 | 2-3; \[strategy\] across all 4 ranks" \
  "$scratch/g_c2d2_zero1.out" || fail "the run header does not name the ring and its groups"

# Llama, 4 query heads over 2 key/value heads.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}")
train_run l_w1 1 4 2
train_run l_c2 2 4 2 --set parallel.context=2 --set train.checkpoint_every=5
train_run l_c4 4 4 2 --set parallel.context=4
train_run l_c2_ckpt 2 4 2 --set parallel.context=2 --set model.activation_checkpointing=true
train_run l_c2d2_zero3 4 2 2 --set parallel.context=2 --strategy zero3
for name in l_c2 l_c4 l_c2_ckpt l_c2d2_zero3; do same_training l_w1 "$name" 1e-6 2e-6; done
same_val_loss g_w1 g_c4
same_val_loss l_w1 l_c4 l_c2d2_zero3

# Under zero3_offload too (the optimizer on the host, the ring on the
# device's activations).
train_run l_c2_offload 2 4 2 --set parallel.context=2 --strategy zero3_offload
same_training l_w1 l_c2_offload 1e-6 2e-6

# compare --parallel runs every job on the mesh it names, and says so.
compared_on_mesh ddp,zero3 context=2 "context 2"

# Ulysses inside the ring (a 2-D group of 4): Ulysses pairs trade heads,
# each pair one rank of a ring of two.
train_run l_s2c2 4 4 2 --set parallel.sequence=2 --set parallel.context=2
same_training l_w1 l_s2c2 1e-6 2e-6
grep -q "mesh: sequence 2 x context 2: each sequence split over 4 ranks (Ulysses inside ring attention: heads traded across sequence groups 0-1 | 2-3, keys and values passed around context groups 0,2 | 1,3); \[strategy\] across all 4 ranks" \
  "$scratch/l_s2c2.out" || fail "the run header does not name the 2-D group"

# Beyond the heads: 2 heads over 1 key/value head split over 4 ranks, which
# Ulysses cannot do.
base=(--model llama-tiny --set model.n_head=2 --set model.n_kv_head=1 "${common[@]}")
train_run n_w1 1 4 1
train_run n_c4 4 4 1 --set parallel.context=4
same_training n_w1 n_c4 1e-6 2e-6

# A checkpoint of the ring resumes on another mesh: context 2's step 5,
# continued at world 1 and under Ulysses at sequence 2, trains its steps 6
# to 10.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}")
resumed() {  # resumed NAME RANKS ARGS...: l_c2's step 5 continued into $scratch/NAME
  local name=$1 np=$2
  shift 2
  on_ranks "$np" "$ZTRAIN" "${base[@]}" --set train.micro_batch_size=4 --set train.grad_accum=2 \
    --set train.out_dir="$scratch/$name" --resume="$scratch/l_c2/step_5" "$@" \
    "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 || fail "resuming l_c2 as $name failed"
  curve "$name" 5
  same_training l_c2_last5 "$name" 1e-6 2e-6
}
tail -n 5 "$scratch/l_c2.curve" > "$scratch/l_c2_last5.curve"
resumed l_c2_to_w1 1 --set parallel.context=1
resumed l_c2_to_s2 2 --set parallel.context=1 --set parallel.sequence=2
train_run l_w1_bf16 1 4 2 --set train.precision=bf16
train_run l_c2_bf16 2 4 2 --set train.precision=bf16 --set parallel.context=2
same_training l_w1_bf16 l_c2_bf16 2e-4 4e-3

# permute bytes per step over all ranks: per layer and micro-step each
# rank passes FORWARDS x (R-1) key/value blocks (2 with checkpointing,
# which runs each forward again in backward), then R-1 key/value blocks
# and R gradient blocks in backward, each micro*2c*2*kv*hs floats (2c =
# tokens/R). ring_bytes RANKS R MICRO ACCUM KV_HEADS FORWARDS
ring_bytes() {
  local ranks=$1 r=$2 micro=$3 accum=$4 kv=$5 forwards=$6 hs=16 layers=2 tokens=32
  local block=$((micro * tokens / r * 2 * kv * hs * 4))
  echo $((ranks * layers * accum * block * (forwards * (r - 1) + (r - 1) + r)))
}
check_bytes g_c2 permute "$(ring_bytes 2 2 8 1 4 1)"
check_bytes g_c4 permute "$(ring_bytes 4 4 8 1 4 1)"
check_bytes g_c2d2_zero1 permute "$(ring_bytes 4 2 4 1 4 1)"
check_bytes l_c2 permute "$(ring_bytes 2 2 4 2 2 1)"
check_bytes l_c4 permute "$(ring_bytes 4 4 4 2 2 1)"
check_bytes l_c2_ckpt permute "$(ring_bytes 2 2 4 2 2 2)"
check_bytes l_c4 all_to_all 0
check_bytes l_w1 permute 0
# Inside Ulysses the ring carries the Ulysses group's 16 tokens of the one
# key/value head each rank received; Ulysses' four all-to-alls per layer
# move each rank's 8 tokens of q, k, v and output: per exchange all but
# the rank's own block of (4 micro x 8 tokens) rows of h = 2 query heads
# and 1 key/value head of 16.
check_bytes l_s2c2 permute "$(ring_bytes 4 2 4 2 1 1)"
u_qkv=$((4 * 8 * (2 + 2 * 1) * 16)) u_out=$((4 * 8 * 2 * 16))
check_bytes l_s2c2 all_to_all $((4 * 2 * 2 * 1 * 4 * (2 * u_qkv + 3 * u_out)))

# Memory, measured: a rank of a ring of 4 holds about a quarter of the
# unsharded run's activations (measured 26.5%), and `ztrain estimate`
# says what it measures.
split_activations context 0.275


# Activation checkpoints offloaded to host memory (ALST's checkpoint
# offload) on a ring: five layers, so the three device streams the blocks'
# inputs rotate through wrap around. The same computation as keeping them
# on the device, to the bit; the device holds four residual streams
# instead of L + 1 and the host the L block inputs, measured as estimated.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" --set model.n_layer=5
  --set model.activation_checkpointing=true)
train_run o_kept 2 4 2 --set parallel.context=2
train_run o_offloaded 2 4 2 --set parallel.context=2 --set model.offload_checkpoints=true
same_training o_kept o_offloaded 0 0
stream=$((4 * 32 / 2 * 64 * 4))  # micro x tokens per rank x n_embd x 4 bytes
kept=$(peak_activations o_kept) offloaded=$(peak_activations o_offloaded)
[ $((kept - offloaded)) -eq $(((5 + 1 - 4) * stream)) ] ||
  fail "offloading the checkpoints saved $((kept - offloaded)) device bytes, not two streams of $stream"
[ "$(peak_activations o_offloaded host)" -eq $((5 * stream)) ] ||
  fail "the host holds $(peak_activations o_offloaded host) bytes of checkpoints, not five streams of $stream"
"$ZTRAIN" estimate --world 2 "${base[@]}" --set parallel.context=2 --set model.offload_checkpoints=true \
  --set train.micro_batch_size=4 "$SRC/configs/run.toml" > "$scratch/o_estimate.out" 2>&1 ||
  fail "estimate with offloaded checkpoints failed"
[ "$(awk '$1 == "host" && $2 == "activations" { print $3 }' "$scratch/o_estimate.out")" -eq $((5 * stream)) ] ||
  fail "the estimate's host activations are not the five streams measured"
[ "$(awk '$1 == "device" && $2 == "activations" { print $3 }' "$scratch/o_estimate.out")" -eq "$offloaded" ] ||
  fail "the estimate's device activations are not the $offloaded bytes measured"
refused "offloading checkpoints that are not taken" \
  "[model] offload_checkpoints moves the checkpoints of activation checkpointing to host memory, which is off" \
  1 "$ZTRAIN" "${base[@]}" --set model.activation_checkpointing=false --set model.offload_checkpoints=true \
  "$SRC/configs/run.toml"

# Refused by key, before anything trains.
refused "a degree whose chunk pairs do not divide the sequence" \
  "--set parallel.context=4: [parallel] context = 4: ring attention cuts each sequence into 2 x 4 = 8 chunks of equal length" \
  4 "$ZTRAIN" "${base[@]}" --set model.seq_len=36 --set parallel.context=4 "$SRC/configs/run.toml"
"$ZTRAIN" estimate --world 8 "${base[@]}" --set model.seq_len=36 --set parallel.sequence=4 \
  --set parallel.context=2 "$SRC/configs/run.toml" > "$scratch/refused.out" 2>&1 &&
  fail "Ulysses 4 inside a ring of 2 over 36 tokens was not refused"
grep -qF -- "[parallel] sequence = 4 x context = 2: within each ring rank's 18 tokens: each rank holds an equal share of the 18-token sequences, which 4 does not divide" \
  "$scratch/refused.out" || fail "the 2-D refusal does not name both degrees and why"
refused "a degree that does not divide the world" \
  "--set parallel.context=2: [parallel] tensor x sequence x context x pipeline = 2 ranks per copy of the model do not divide the world of 3 ranks" \
  3 "$ZTRAIN" "${base[@]}" --set parallel.context=2 "$SRC/configs/run.toml"
echo "PASS"
