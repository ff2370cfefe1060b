#!/usr/bin/env bash
# Tensor parallelism ([parallel] tensor, Megatron's split of each block:
# q, k, v and the MLP's first layer cut by output, the attention's and the
# MLP's last projection by input, one all-reduce after each of those
# forward and one after each block input's gradient backward; the
# embedding and the head cut by vocabulary rows, the loss assembled from
# the slices (the row maxima all-reduced by max, the sums by sum), the
# embedding's output and the head's input gradient all-reduced) must train
# exactly what ddp trains at world 1 on the same global batch: GPT-2 at
# tensor 2 and 4; Llama with 2 key/value heads at tensor 2 (each rank one
# of them), with biases on every projection (the row-parallel biases added
# once), tensor 2 x data 2 under zero1 with activation checkpointing and
# under zero3, with gradient accumulation, and bf16 against bf16 ddp at
# world 1; evaluation too (the same val loss); zero2, cpu_offload and
# nvme_offload at tensor 2 x data 2 as well. The gradient norm counts
# every parameter once: a norm weight or bias the tensor group shares is
# not counted `tensor` times.
# Tolerances, relative per step, as the sequence-splitting tests': fp32
# losses 1e-6 and gradient norms 2e-6 (a row-parallel projection sums its
# parts' partial products over the group, in another order than one
# GEMM); bf16 2e-4 and 4e-3. A part at the wrong place, a missing
# all-reduce or a shared parameter counted twice is orders of magnitude
# larger (tests/mutations).
# compare --parallel tensor=2 runs each strategy on the mesh.
# Then the bytes: a step's all-reduces, counted by the communicator, equal
# the formula; the memory: a rank at tensor 2 holds half of the split
# projections' parameters, gradients and optimizer state, measured, and
# `ztrain estimate` says what a rank measures; the weights in and out: the
# final weights are the whole model's (gathered from the parts), and a run
# at tensor 2 starts from whole weights as world 1 does; and the refusals
# by key.
#
# usage: test_tensor_parallel.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sequence_lib.sh"

# GPT-2: 4 heads of 16, the MLP 256 wide.
base=(--model gpt2-tiny "${common[@]}")
train_run g_w1 1 8 1
train_run g_t2 2 8 1 --set parallel.tensor=2
train_run g_t4 4 8 1 --set parallel.tensor=4
for name in g_t2 g_t4; do same_training g_w1 "$name" 1e-6 2e-6; done
same_val_loss g_w1 g_t2 g_t4
# A vocabulary the degree does not divide (259 rows over 4 ranks: 64, 65,
# 65, 65): the parts differ by a row.
train_run g_w1_v259 1 8 1 --set model.vocab_size=259
train_run g_t4_v259 4 8 1 --set model.vocab_size=259 --set parallel.tensor=4
same_training g_w1_v259 g_t4_v259 1e-6 2e-6
grep -q "batch: 8 x 1 accum x 1 data rank = 8 sequences of 32 tokens" "$scratch/g_t2.out" ||
  fail "tensor 2 did not report its batch over the data ranks"
grep -q "mesh: tensor 2: each block's projections split over tensor groups 0-1 (Megatron's.*\[strategy\] on each rank's parts alone (one data rank)" \
  "$scratch/g_t2.out" || fail "the run header does not name the tensor groups"

# compare --parallel runs every job on the mesh it names, and says so.
compared_on_mesh ddp,zero3 tensor=2 "tensor 2"

# Llama: 4 query heads over 2 key/value heads, biases on every projection.
base=(--model llama-tiny --set model.n_kv_head=2 --set model.attention_bias=all
  --set model.mlp_bias=true "${common[@]}")
train_run l_w1 1 4 2
train_run l_t2 2 4 2 --set parallel.tensor=2
train_run l_t2d2_zero1 4 2 2 --set parallel.tensor=2 --strategy zero1 \
  --set model.activation_checkpointing=true
train_run l_t2d2_zero3 4 2 2 --set parallel.tensor=2 --strategy zero3
for name in l_t2 l_t2d2_zero1 l_t2d2_zero3; do same_training l_w1 "$name" 1e-6 2e-6; done
# Every other strategy shards a rank's parts over the data ranks alike.
mkdir -p "$scratch/nvme"
train_run l_t2d2_zero2 4 2 2 --set parallel.tensor=2 --strategy zero2
train_run l_t2d2_cpu_offload 4 2 2 --set parallel.tensor=2 --strategy cpu_offload
train_run l_t2d2_nvme_offload 4 2 2 --set parallel.tensor=2 --strategy nvme_offload \
  --set strategy.offload_optimizer.nvme_path="$scratch/nvme"
for name in l_t2d2_zero2 l_t2d2_cpu_offload l_t2d2_nvme_offload; do
  same_training l_w1 "$name" 1e-6 2e-6
done
same_val_loss l_w1 l_t2 l_t2d2_zero3
grep -q "mesh: tensor 2 x data 2: .*tensor groups 0-1 | 2-3 .*\[strategy\] across data groups 0,2 | 1,3" \
  "$scratch/l_t2d2_zero3.out" || fail "the run header does not name the tensor and data groups"
# Fewer key/value heads than ranks: at tensor 4 each of the 2 is copied to
# the two ranks whose query heads read it, its gradient summed over them.
train_run l_t4 4 4 2 --set parallel.tensor=4
same_training l_w1 l_t4 1e-6 2e-6
# With a split sequence: Ulysses over each tensor part's heads, the ring
# around it; the strategy over the ranks holding the same parts.
train_run l_t2s2 4 4 2 --set parallel.tensor=2 --set parallel.sequence=2
train_run l_t2c2_zero3 4 4 2 --set parallel.tensor=2 --set parallel.context=2 --strategy zero3
for name in l_t2s2 l_t2c2_zero3; do same_training l_w1 "$name" 1e-6 2e-6; done
grep -q "mesh: tensor 2 x sequence 2: each block's projections split over tensor groups 0-1 | 2-3 .*each sequence split over 2 ranks (Ulysses.*sequence groups 0,2 | 1,3; \[strategy\] across the 2 ranks holding each part" \
  "$scratch/l_t2s2.out" || fail "the run header does not name both splits"
train_run l_w1_bf16 1 4 2 --set train.precision=bf16
train_run l_t2_bf16 2 4 2 --set train.precision=bf16 --set parallel.tensor=2
same_training l_w1_bf16 l_t2_bf16 2e-4 4e-3

# all-reduce bytes per step over all ranks: per layer and micro-step two
# in forward (after the attention's and the MLP's output projections) and
# two in backward (the gradients of the two norms' outputs), and per
# micro-step the embedding's output and the head's input gradient, each of
# micro x 32 tokens x 64 floats, and the loss's three floats a token (its
# row maximum, its slice's sum and target logit); the step's gradient norm
# (one float over the tensor group) and the ranks' agreement on the loss
# and the stop (three floats over the world). A ring all-reduce of n
# elements over R ranks sends 2 (R-1) n elements in all.
# tp_bytes RANKS TENSOR MICRO ACCUM
tp_bytes() {
  local ranks=$1 t=$2 micro=$3 accum=$4 layers=2
  local tokens=$((micro * 32)) act=$((micro * 32 * 64))
  local per_micro=$((layers * 4 * act + 2 * act + 3 * tokens))
  echo $((4 * (accum * 2 * (t - 1) * per_micro + 2 * (t - 1) + 2 * (ranks - 1) * 3)))
}
check_bytes g_t2 all_reduce "$(tp_bytes 2 2 8 1)"
check_bytes g_t4 all_reduce "$(tp_bytes 4 4 8 1)"
check_bytes l_t2 all_reduce "$(tp_bytes 2 2 4 2)"

# Memory, measured: a rank at tensor 2 holds the whole position table,
# norms and the row-parallel biases, half of every other block parameter
# (per GPT-2 block 12 C^2 + 7 C of its 12 C^2 + 13 C elements are split)
# and half of the tied embedding and head (V C).
half=$(((2 * (12 * 64 * 64 + 7 * 64) + 256 * 64) / 2 * 4))
for category in params grads optimizer; do
  whole=$(peak_bytes g_w1 "$category") part=$(peak_bytes g_t2 "$category")
  per=$([ "$category" = optimizer ] && echo 2 || echo 1)
  [ $((whole - part)) -eq $((per * half)) ] ||
    fail "tensor 2 holds $part bytes of $category per rank against $whole whole, not $((per * half)) fewer"
done
echo "tensor 2: $(peak_bytes g_t2 params) bytes of parameters a rank, $(peak_bytes g_w1 params) whole"
# `ztrain estimate` knows the split: its bytes per rank are those measured.
estimated_as_measured g_t2 2 --model gpt2-tiny "${common[@]}" --set parallel.tensor=2 \
  --set train.micro_batch_size=8
grep -q "^mesh: tensor 2 (the bytes below are one rank's" "$scratch/g_t2.estimate" ||
  { cat "$scratch/g_t2.estimate" >&2; fail "estimate at tensor 2 does not name the mesh"; }

# The final weights are the whole model's, gathered from the parts: the
# same tensors, names and shapes as ddp's at world 1, and the same model:
# a step from each (at world 1) has the same loss and gradient norm. (Not
# value for value: the keys' bias has no gradient but rounding noise,
# which Adam scales up to steps of lr, so it differs between any two
# orders of summing; the loss does not see it.)
base=(--model gpt2-tiny "${common[@]}" --set train.save_final=true)
train_run e_w1 1 8 1
train_run e_t2 2 8 1 --set parallel.tensor=2
same_headers() {  # same_headers REF OTHER: the same tensors, dtypes and shapes in both
  python3 - "$scratch/$1/model.safetensors" "$scratch/$2/model.safetensors" << 'PY' ||
import json, struct, sys
def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return {name: (t["dtype"], tuple(t["shape"])) for name, t in h.items()}
whole, parts = header(sys.argv[1]), header(sys.argv[2])
assert whole == parts, sorted(set(whole.items()) ^ set(parts.items()))
print("%s: %d tensors, named and shaped as %s's" % (sys.argv[2], len(whole), sys.argv[1]))
PY
    fail "$2's final weights are not the whole model's tensors"
}
same_headers e_w1 e_t2
# And a tensor-parallel run starts from whole weights ([model] init_from),
# each rank reading its parts of them: its first step is world 1's from
# the same file, GPT-2's Conv1D layout (transposed in the file) and
# Llama's alike.
from_weights from_e_w1 1 e_w1
from_weights from_e_t2 1 e_t2
from_weights from_e_w1_t2 2 e_w1 --set parallel.tensor=2
same_training from_e_w1 from_e_t2 1e-6 2e-6
same_training from_e_w1 from_e_w1_t2 1e-6 2e-6
# Llama at tensor 4 too, each of its 2 key/value heads copied on two
# ranks: written once, read by both; its vocabulary of 259 rows cut into
# unequal parts (64, 65, 65, 65 at tensor 4; 129, 130 at tensor 2), the
# embedding's and the untied head's alike.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" --set model.vocab_size=259
  --set train.save_final=true)
train_run e_l_w1 1 8 1
train_run e_l_t4 4 8 1 --set parallel.tensor=4
same_headers e_l_w1 e_l_t4
from_weights from_e_l_w1 1 e_l_w1
from_weights from_e_l_t4 1 e_l_t4
from_weights from_e_l_w1_t2 2 e_l_w1 --set parallel.tensor=2
from_weights from_e_l_w1_t4 4 e_l_w1 --set parallel.tensor=4
for name in from_e_l_t4 from_e_l_w1_t2 from_e_l_w1_t4; do same_training from_e_l_w1 "$name" 1e-6 2e-6; done

# Refused by key, before anything trains.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}")
refused "key/value heads that neither divide nor copy over the degree" \
  "--set parallel.tensor=2: [parallel] tensor = 2: [model] n_kv_head (key/value heads) = 3 neither divides into 2 equal parts nor into copies for them" \
  2 "$ZTRAIN" "${base[@]}" --set model.n_embd=96 --set model.n_head=6 --set model.n_kv_head=3 \
  --set parallel.tensor=2 "$SRC/configs/run.toml"
refused "a vocabulary of fewer rows than the degree" \
  "[parallel] tensor = 2: [model] vocab_size = 1 is smaller than the tensor degree 2" \
  2 "$ZTRAIN" "${base[@]}" --set parallel.tensor=2 --set model.vocab_size=1 "$SRC/configs/run.toml"
refused "sampling during a tensor-parallel run" \
  "--set train.sample_every=5: [train] sample_every > 0 with [parallel] tensor = 2" \
  2 "$ZTRAIN" "${base[@]}" --set parallel.tensor=2 --set train.sample_every=5 \
  --set train.out_dir="$scratch/refused_sampling" "$SRC/configs/run.toml"
refused "Ulysses over more ranks than a tensor part's heads" \
  "--set parallel.sequence=4: [parallel] sequence = 4: at tensor = 2 each part computes 2 of the 4 heads: Ulysses gives each of the 4 ranks" \
  8 "$ZTRAIN" "${base[@]}" --set parallel.tensor=2 --set parallel.sequence=4 "$SRC/configs/run.toml"
echo "PASS"
