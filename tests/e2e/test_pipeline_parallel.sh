#!/usr/bin/env bash
# Pipeline parallelism ([parallel] pipeline: the modules cut into stages,
# the step's micro-batches run through them as a checked schedule plan
# says; each stage's backward reads the activations its forward kept)
# must train exactly what ddp trains at world 1 on the same global batch:
# GPT-2 (its head tied to the embedding on the other stage, their
# gradients summed and counted once in the norm) at pipeline 2 under
# GPipe, 1F1B and interleaved 1F1B, and at pipeline 4 (1F1B, GPipe); Llama (untied,
# fewer key/value heads than query heads) at pipeline 2 x data 2 under
# zero1, tensor 2 x pipeline 2, sequence 2 x pipeline 2, tensor 2 x data 2
# x pipeline 2 and tensor 2 x sequence 2 x pipeline 2 (8 ranks), all four
# at once (16 ranks), interleaved at pipeline 4, with activation
# checkpointing, in bf16 against bf16
# and fp16 against fp16 (the same overflowing steps skipped); evaluation
# too. Tolerances, relative per step, as the other mesh
# tests': fp32 losses 1e-6 and gradient norms 2e-6, bf16 2e-4 and 4e-3. A
# gradient sent to the wrong stage, a tied gradient not summed or counted
# twice is orders of magnitude larger (tests/mutations).
# Then the bytes each step sends between stages, counted by the
# communicators, against the formula; the final weights (the whole model,
# gathered from the stages: a step from them equals a step from world
# 1's); checkpoints resumed across meshes (pipeline 2 -> world 1, world 1
# -> pipeline 2 x data 2, each continuing as the uninterrupted run); and
# the refusals by key.
#
# usage: test_pipeline_parallel.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sequence_lib.sh"

# GPT-2: 2 blocks, so 4 modules (embedding, blocks, head) for up to 4
# stages.
base=(--model gpt2-tiny "${common[@]}")
train_run g_w1 1 2 4
train_run g_p2_gpipe 2 2 4 --set parallel.pipeline=2 --set parallel.pipeline_schedule=gpipe
train_run g_p2_1f1b 2 2 4 --set parallel.pipeline=2
train_run g_p2_interleaved 2 2 4 --set parallel.pipeline=2 \
  --set parallel.pipeline_schedule=interleaved --set parallel.pipeline_chunks=2
train_run g_p4 4 2 4 --set parallel.pipeline=4 --set parallel.pipeline_partition=uniform
train_run g_p4_gpipe 4 2 4 --set parallel.pipeline=4 --set parallel.pipeline_schedule=gpipe
for name in g_p2_gpipe g_p2_1f1b g_p2_interleaved g_p4 g_p4_gpipe; do
  same_training g_w1 "$name" 1e-6 2e-6
done
same_val_loss g_w1 g_p2_1f1b g_p4
grep -q "mesh: pipeline 2: the modules cut into 2 stages (parameters: embed-block.0 | block.1-head; 1f1b over 4 micro-batches), pipeline groups 0-1; \[strategy\] on each rank's parts alone (one data rank)" \
  "$scratch/g_p2_1f1b.out" || { cat "$scratch/g_p2_1f1b.out" >&2; fail "the run header does not name the pipeline"; }

# Each step's idle share per stage (of the longest stage's span): one value
# a stage, each strictly between 0 and 1, since at pipeline 2 the first
# stage waits for its first gradient and the last for its first input.
for name in g_p2_gpipe g_p2_1f1b; do
  idle=$(metrics_fields "$scratch/$name/metrics.jsonl" train pipeline_idle)
  [ "$(echo "$idle" | wc -l)" = "$steps" ] || fail "$name logged pipeline_idle on $(echo "$idle" | wc -l) of $steps steps"
  python3 -c '
import sys
for line in sys.stdin:
    shares = [float(v) for v in line.strip().strip("[]").split(",")]
    assert len(shares) == 2 and all(0 < v < 1 for v in shares), line
' <<< "$idle" || fail "$name: idle shares per stage not two values in (0, 1): $idle"
done

# Bytes between stages per step, over all ranks: each micro-batch's
# activation sent forward and its gradient sent back across each of the
# P - 1 boundaries (P x V - 1 with V chunks a stage), 2 x 32 tokens x 64
# floats each; nothing else is broadcast during a step.
pp_bytes() {  # pp_bytes BOUNDARIES
  echo $((4 * 2 * $1 * 4 * (2 * 32 * 64)))
}
check_bytes g_p2_1f1b broadcast "$(pp_bytes 1)"
check_bytes g_p2_gpipe broadcast "$(pp_bytes 1)"
check_bytes g_p2_interleaved broadcast "$(pp_bytes 3)"
check_bytes g_p4 broadcast "$(pp_bytes 3)"

# Memory, measured: the worst rank of pipeline 2 (the first stage: the
# embedding, the positions and one block; the last holds the other block,
# the final norm and its copy of the tied embedding) holds its stage's
# parameters alone; `ztrain estimate` says what it measures: the
# activations of every micro-batch a stage holds between its forward and
# backward (1F1B's first stage 2, GPipe's 4) and the buffers between the
# stages (1F1B's last stage keeps the input gradient of each of the 4
# micro-batches it sent; interleaving holds more).
stage0=$(((256 * 64 + 32 * 64 + 12 * 64 * 64 + 13 * 64) * 4))
[ "$(peak_bytes g_p2_1f1b params)" -eq "$stage0" ] ||
  fail "pipeline 2 holds $(peak_bytes g_p2_1f1b params) bytes of parameters a rank, not its stage's $stage0"
echo "pipeline 2: $(peak_bytes g_p2_1f1b params) bytes of parameters a rank, $(peak_bytes g_w1 params) whole"
estimated_as_measured g_p2_1f1b 2 --model gpt2-tiny "${common[@]}" --set parallel.pipeline=2 \
  --set train.micro_batch_size=2 --set train.grad_accum=4
estimated_as_measured g_p2_interleaved 2 --model gpt2-tiny "${common[@]}" --set parallel.pipeline=2 \
  --set train.micro_batch_size=2 --set train.grad_accum=4 \
  --set parallel.pipeline_schedule=interleaved --set parallel.pipeline_chunks=2
estimated_as_measured g_p2_gpipe 2 --model gpt2-tiny "${common[@]}" --set parallel.pipeline=2 \
  --set train.micro_batch_size=2 --set train.grad_accum=4 --set parallel.pipeline_schedule=gpipe
[ "$(peak_activations g_p2_gpipe)" -gt "$(peak_activations g_p2_1f1b)" ] ||
  fail "GPipe holds $(peak_activations g_p2_gpipe) bytes of activations, no more than 1F1B's $(peak_activations g_p2_1f1b)"
grep -q "^mesh: pipeline 2 (the bytes below are one rank's" "$scratch/g_p2_1f1b.estimate" ||
  { cat "$scratch/g_p2_1f1b.estimate" >&2; fail "estimate at pipeline 2 does not name the mesh"; }

# compare --parallel runs every job on the pipeline, and says so.
compared_on_mesh ddp,zero1 pipeline=2 "pipeline 2 (1f1b)" --set train.grad_accum=2

# Llama: 4 query heads over 2 key/value heads, its head untied.
base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}")
train_run l_w1 1 4 4
train_run l_p2d2_zero1 4 2 4 --set parallel.pipeline=2 --strategy zero1
train_run l_t2p2 4 4 4 --set parallel.tensor=2 --set parallel.pipeline=2
train_run l_s2p2 4 4 4 --set parallel.sequence=2 --set parallel.pipeline=2
for name in l_p2d2_zero1 l_t2p2 l_s2p2; do same_training l_w1 "$name" 1e-6 2e-6; done
same_val_loss l_w1 l_p2d2_zero1 l_t2p2
grep -q "mesh: data 2 x pipeline 2: the modules cut into 2 stages .*pipeline groups 0,2 | 1,3; \[strategy\] across data groups 0-1 | 2-3" \
  "$scratch/l_p2d2_zero1.out" || { cat "$scratch/l_p2d2_zero1.out" >&2; fail "the run header does not name the pipeline and data groups"; }
# Interleaved at pipeline 4: 6 blocks, 8 modules, 2 chunks a stage.
train_run l6_w1 1 4 4 --set model.n_layer=6
train_run l6_p4_interleaved 4 4 4 --set model.n_layer=6 --set parallel.pipeline=4 \
  --set parallel.pipeline_schedule=interleaved --set parallel.pipeline_chunks=2
same_training l6_w1 l6_p4_interleaved 1e-6 2e-6
# Three dimensions on 8 ranks: tensor 2 x data 2 x pipeline 2 under zero1.
train_run l_t2d2p2 8 2 4 --set parallel.tensor=2 --set parallel.pipeline=2 --strategy zero1
same_training l_w1 l_t2d2p2 1e-6 2e-6
# And tensor 2 x sequence 2 x pipeline 2: Ulysses over each tensor part's
# heads on each stage.
train_run l_t2s2p2 8 4 4 --set parallel.tensor=2 --set parallel.sequence=2 --set parallel.pipeline=2
same_training l_w1 l_t2s2p2 1e-6 2e-6
# Every dimension at once on 16 ranks: tensor 2 x sequence 2 x data 2 x
# pipeline 2 under zero1.
train_run l_t2s2d2p2 16 2 4 --set parallel.tensor=2 --set parallel.sequence=2 \
  --set parallel.pipeline=2 --strategy zero1
same_training l_w1 l_t2s2d2p2 1e-6 2e-6
# [model] activation_checkpointing: each stage keeps its blocks' inputs alone and
# recomputes each block in its backward, as one model does.
train_run l_p2_checkpointing 2 4 4 --set parallel.pipeline=2 --set model.activation_checkpointing=true
same_training l_w1 l_p2_checkpointing 1e-6 2e-6
train_run l_w1_bf16 1 4 4 --set train.precision=bf16
train_run l_p2_bf16 2 4 4 --set train.precision=bf16 --set parallel.pipeline=2
train_run l_p2_bf16_checkpointing 2 4 4 --set train.precision=bf16 --set parallel.pipeline=2 \
  --set model.activation_checkpointing=true
# And Ulysses' saved shards kept in 16 bits on each stage.
train_run l_s2p2_bf16 4 4 4 --set train.precision=bf16 --set parallel.sequence=2 \
  --set parallel.pipeline=2
for name in l_p2_bf16 l_p2_bf16_checkpointing l_s2p2_bf16; do
  same_training l_w1_bf16 "$name" 2e-4 4e-3
done
# fp16 from a loss scale of 2^24: every stage skips the steps whose
# gradients overflow on any stage (the norm is summed over the stages
# before the scaler's vote), as world 1 does (its first 4), halves its
# scale alike, then trains the same steps.
fp16=(--set train.precision=fp16 --set train.fp16.initial_scale_power=24)
train_run l_w1_fp16 1 4 4 "${fp16[@]}"
train_run l_p2_fp16 2 4 4 "${fp16[@]}" --set parallel.pipeline=2
same_training l_w1_fp16 l_p2_fp16 2e-4 4e-3
skips() { metrics_fields "$scratch/$1/metrics.jsonl" train skipped_steps | tail -n 1; }
[ "$(skips l_w1_fp16)" -gt 0 ] && [ "$(skips l_w1_fp16)" -lt "$steps" ] &&
  [ "$(skips l_p2_fp16)" = "$(skips l_w1_fp16)" ] ||
  fail "fp16 at pipeline 2 skipped $(skips l_p2_fp16) steps, world 1 $(skips l_w1_fp16)"

# The final weights are the whole model's, gathered from the stages: a
# step from them (at world 1) is a step from world 1's.
base=(--model gpt2-tiny "${common[@]}" --set train.save_final=true)
train_run e_w1 1 2 4
train_run e_p2 2 2 4 --set parallel.pipeline=2
from_weights from_e_w1 1 e_w1
from_weights from_e_p2 1 e_p2
from_weights from_e_w1_p2 2 e_w1 --set parallel.pipeline=2
same_training from_e_w1 from_e_p2 1e-6 2e-6
same_training from_e_w1 from_e_w1_p2 1e-6 2e-6

# Checkpoints resume on another mesh: pipeline 2's at world 1, world 1's at
# pipeline 2 x data 2 under zero1; each continues as the uninterrupted run.
base=(--model gpt2-tiny "${common[@]}" --set train.checkpoint_every=5)
train_run c_p2 2 2 4 --set parallel.pipeline=2
on_ranks 1 "$ZTRAIN" "${base[@]}" --set train.micro_batch_size=2 --set train.grad_accum=4 \
  --set parallel.pipeline=1 --resume "$scratch/c_p2/step_5" --set train.out_dir="$scratch/c_p2_w1" \
  "$SRC/configs/run.toml" > "$scratch/c_p2_w1.out" 2>&1 ||
  { cat "$scratch/c_p2_w1.out" >&2; fail "world 1 did not resume pipeline 2's checkpoint"; }
on_ranks 4 "$ZTRAIN" "${base[@]}" --set train.micro_batch_size=1 --set train.grad_accum=4 \
  --set parallel.pipeline=2 --strategy zero1 --resume "$scratch/c_p2/step_5" \
  --set train.out_dir="$scratch/c_p2d2" "$SRC/configs/run.toml" > "$scratch/c_p2d2.out" 2>&1 ||
  { cat "$scratch/c_p2d2.out" >&2; fail "pipeline 2 x data 2 did not resume pipeline 2's checkpoint"; }
for name in c_p2_w1 c_p2d2; do
  curve "$name" $((steps - 5))
  tail -n $((steps - 5)) "$scratch/g_w1.curve" > "$scratch/g_w1_tail.curve"
  same_training g_w1_tail "$name" 1e-6 2e-6
done

# Refused by key, before anything trains.
base=(--model gpt2-tiny "${common[@]}")
refused "ZeRO-3 under a pipeline" \
  "--set parallel.pipeline=2: [parallel] pipeline = 2 with strategy 'zero3': it does not keep each rank's whole gradient" \
  2 "$ZTRAIN" "${base[@]}" --set parallel.pipeline=2 --strategy zero3 "$SRC/configs/run.toml"
refused "chunks without the interleaved schedule" \
  "--set parallel.pipeline_chunks=2: [parallel] pipeline_chunks = 2 with pipeline_schedule \"1f1b\"" \
  2 "$ZTRAIN" "${base[@]}" --set parallel.pipeline=2 --set parallel.pipeline_chunks=2 "$SRC/configs/run.toml"
refused "more stages than modules" \
  "--set parallel.pipeline=2: [parallel] pipeline = 2 x pipeline_chunks = 4:" \
  2 "$ZTRAIN" "${base[@]}" --set parallel.pipeline=2 --set parallel.pipeline_schedule=interleaved \
  --set parallel.pipeline_chunks=4 "$SRC/configs/run.toml"
refused "interleaving over micro-batches the stages do not divide" \
  "[parallel] pipeline_schedule = \"interleaved\" over 3 micro-batches ([train] grad_accum):" \
  2 "$ZTRAIN" "${base[@]}" --set parallel.pipeline=2 --set parallel.pipeline_schedule=interleaved \
  --set parallel.pipeline_chunks=2 --set train.micro_batch_size=1 --set train.grad_accum=3 \
  --set train.global_batch_size=3 "$SRC/configs/run.toml"
refused "sampling during a pipeline-parallel run" \
  "--set train.sample_every=5: [train] sample_every > 0 with [parallel] pipeline = 2" \
  2 "$ZTRAIN" "${base[@]}" --set parallel.pipeline=2 --set train.sample_every=5 \
  --set train.out_dir="$scratch/refused_sampling" "$SRC/configs/run.toml"
echo "PASS"
