#!/usr/bin/env bash
# A tensor-parallel run's checkpoints hold the whole model's state, so
# they resume on another mesh: Llama with 2 key/value heads and a
# vocabulary of 259 rows (unequal parts) trains 10 steps at tensor 2 x
# data 2 under zero1, checkpointing every 3 steps; its step 3 continues at
# data 4 under zero2, whose step 6 continues at tensor 4 under zero3 (the
# key/value heads copied on two ranks each), whose step 9 continues at
# world 1 under ddp and at pipeline 2 x data 2 under zero1. Every run, the resumed ones from their first step on,
# trains what ddp trains at world 1 without a break (losses 1e-6 and
# gradient norms 2e-6 relative, the tensor-parallel tests' tolerances;
# a resume restores the state exactly, so the breaks add nothing). The
# manifests list the whole model's parameters once each (the writer checks
# that every element is stored exactly once: a tensor group whose ranks
# all stored the norms would fail there), `ztrain checkpoint info` reads
# one written at tensor 2 as any other, and `ztrain export` of one written
# at tensor 4 is the Hugging Face directory data 4's of the same step is.
#
# usage: test_tensor_checkpoint.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sequence_lib.sh"

base=(--model llama-tiny --set model.n_kv_head=2 "${common[@]}" --set model.vocab_size=259)
train_run w1 1 4 2
train_run t2d2 4 2 2 --set parallel.tensor=2 --strategy zero1 --set train.checkpoint_every=3 \
  --set train.keep_last=0
same_training w1 t2d2 1e-6 2e-6
for step in 3 6 9; do
  [ -f "$scratch/t2d2/step_$step/manifest.json" ] || fail "tensor 2 x data 2 wrote no checkpoint at step $step"
done
"$ZTRAIN" checkpoint info "$scratch/t2d2/step_3" > "$scratch/info.out" 2>&1 ||
  { cat "$scratch/info.out" >&2; fail "checkpoint info of a tensor-parallel checkpoint failed"; }
python3 - "$scratch/t2d2/step_3/manifest.json" << 'PY' || fail "the checkpoint at tensor 2 does not list the whole model"
import json, sys
m = json.load(open(sys.argv[1]))
shapes = {p["name"]: p["shape"] for p in m["params"]}
assert shapes["model.embed_tokens.weight"] == [259, 64], shapes["model.embed_tokens.weight"]
assert shapes["lm_head.weight"] == [259, 64], shapes["lm_head.weight"]
assert shapes["model.layers.0.self_attn.q_proj.weight"] == [64, 64]
assert shapes["model.layers.0.self_attn.k_proj.weight"] == [32, 64]
assert shapes["model.layers.0.mlp.down_proj.weight"] == [64, 256]
print("the checkpoint lists %d whole parameters" % len(shapes))
PY

# resumed NAME RANKS MICRO ACCUM FROM STEPS ARGS...: FROM continued into
# $scratch/NAME, its STEPS steps the last STEPS of w1's.
resumed() {
  local name=$1 np=$2 micro=$3 accum=$4 from=$5 count=$6
  shift 6
  on_ranks "$np" "$ZTRAIN" "${base[@]}" --set train.micro_batch_size="$micro" \
    --set train.grad_accum="$accum" --set train.out_dir="$scratch/$name" --resume="$scratch/$from" \
    "$@" "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 ||
    { cat "$scratch/$name.out" >&2; fail "resuming $from as $name failed"; }
  curve "$name" "$count"
  tail -n "$count" "$scratch/w1.curve" > "$scratch/w1_last$count.curve"
  same_training "w1_last$count" "$name" 1e-6 2e-6
}
resumed d4 4 2 1 t2d2/step_3 7 --set parallel.tensor=1 --strategy zero2 \
  --set train.checkpoint_every=3 --set train.keep_last=0
resumed t4 4 4 2 d4/step_6 4 --set parallel.tensor=4 --strategy zero3 \
  --set train.checkpoint_every=3 --set train.keep_last=0
resumed w1_from_t4 1 4 2 t4/step_9 1 --set parallel.tensor=1 --strategy ddp
grep -q "ranks: 4 -> 1" "$scratch/w1_from_t4.out" || fail "the resume did not say the world changed"
# And tensor 4's step 9 at pipeline 2 x data 2 under zero1 (each stage
# reading its parameters' ranges by their whole-model ids).
resumed p2d2_from_t4 4 2 2 t4/step_9 1 --set parallel.tensor=1 --set parallel.pipeline=2 \
  --strategy zero1
# `ztrain export` of a checkpoint written at tensor 4 is a Hugging Face
# directory like the one of data 4's checkpoint of the same step: a step
# from each at world 1 is the same step.
for from in t4 d4; do
  "$ZTRAIN" export "$scratch/$from/step_9" "$scratch/exported_$from" > "$scratch/export.out" 2>&1 ||
    { cat "$scratch/export.out" >&2; fail "export of $from's checkpoint failed"; }
  from_weights "from_$from" 1 "exported_$from"
done
same_training from_d4 from_t4 1e-6 2e-6
echo "PASS"
