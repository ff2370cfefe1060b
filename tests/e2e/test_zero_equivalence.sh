#!/usr/bin/env bash
# Equivalence of the ZeRO stages: zero1, zero2 and zero3 at world 1, 2 and 4
# (mpirun, oversubscribed), with and without gradient accumulation, with and
# without activation checkpointing, must log the 20-step loss curve of ddp at
# world 1 on gpt2-tiny-shaped models; so must every stage at world 2 and 4
# on a model whose parameter count (36399) and parameter sizes are odd, so
# shards split parameters mid-way. zero3 runs with every parameter sharded
# (param_persistence_threshold = 0), a live cap below the model size and
# small prefetch and reduce buckets, so gathers, evictions and buckets all
# happen. Tolerance as test_world_equivalence.sh: 1e-6 relative per step.
# Then bytes per step and rank against ZeRO's theory: 2 psi (N-1)/N for
# zero1 and zero2, 3 psi (N-1)/N for zero3 (prefetch and reuse off, so every
# parameter is gathered for forward and again for backward; on an untied
# Llama, see below), x 4 bytes, within 2 % (padding). And weights exported
# from zero3 and imported into it match ddp's.
#
# usage: test_zero_equivalence.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

base=(--set model.n_layer=2 --set model.seq_len=32 --set model.vocab_size=256
  --set train.steps=20 --set train.log_every=1 --set train.eval_every=20 --set train.warmup_steps=5
  --set device.threads=1 --set train.save_final=false)
wide=(--model gpt2-tiny --set model.n_embd=64)
odd=(--model gpt2-tiny --set model.n_embd=33 --set model.n_head=3 --set model.vocab_size=251)
zero3=(--set strategy.param_persistence_threshold=0 --set strategy.max_live_parameters=70000
  --set strategy.prefetch_bucket_size=20000 --set strategy.reduce_bucket_size=5000)

# run NAME RANKS MICRO ACCUM [ARGS...]: losses of each step into $scratch/NAME.losses
run() {
  local name=$1 np=$2 micro=$3 accum=$4
  shift 4
  on_ranks "$np" "$ZTRAIN" "${base[@]}" --set train.micro_batch_size="$micro" \
    --set train.grad_accum="$accum" --set train.out_dir="$scratch/$name" "$@" "$SRC/configs/run.toml" \
    > "$scratch/$name.out" 2>&1 || { cat "$scratch/$name.out" >&2; fail "run $name failed"; }
  train_losses "$scratch/$name/metrics.jsonl" > "$scratch/$name.losses"
  [ "$(wc -l < "$scratch/$name.losses")" -eq 20 ] || fail "run $name logged $(wc -l < "$scratch/$name.losses") steps, not 20"
}

# compare REFERENCE NAME...
compare() {
  local ref=$1 name
  shift
  for name in "$@"; do same_losses "$ref" "$name" 1e-6; done
}

run ddp_w1 1 8 1 "${wide[@]}"
names=()
for stage in zero1 zero2 zero3; do
  extra=()
  [ "$stage" = zero3 ] && extra=("${zero3[@]}")
  for layout in "1 8 1" "1 4 2" "2 4 1" "2 2 2" "4 2 1" "4 1 2"; do
    set -- $layout
    for ckpt in false true; do
      name="${stage}_w$1_m$2_a$3_ckpt_$ckpt"
      run "$name" "$1" "$2" "$3" "${wide[@]}" --strategy "$stage" "${extra[@]}" \
        --set model.activation_checkpointing="$ckpt"
      names+=("$name")
    done
  done
done
compare ddp_w1 "${names[@]}"

run odd_ddp_w1 1 8 1 "${odd[@]}"
grep -q "36.4k params" "$scratch/odd_ddp_w1.out" || fail "the odd model is not 36399 parameters"
odd_names=()
for stage in zero1 zero2 zero3; do
  extra=()
  [ "$stage" = zero3 ] && extra=("${zero3[@]}")
  for np in 2 4; do
    run "odd_${stage}_w$np" "$np" $((8 / np)) 1 "${odd[@]}" --strategy "$stage" "${extra[@]}"
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
  train_losses "$scratch/$name/metrics.jsonl" > "$scratch/$name.losses"
}
run w_ddp 1 8 1 "${wide[@]}" --set train.save_final=true
run w_zero3 4 2 1 "${wide[@]}" --strategy zero3 "${zero3[@]}" --set train.save_final=true
probe from_ddp 1 "$scratch/w_ddp"
probe from_zero3 1 "$scratch/w_zero3"
probe zero3_from_ddp 2 "$scratch/w_ddp" --strategy zero3 "${zero3[@]}"
compare from_ddp from_zero3 zero3_from_ddp
grep -q "weights from $scratch/w_ddp" "$scratch/zero3_from_ddp.out" || fail "zero3 did not report its initial weights"

# bytes NAME RANKS COPIES PSI: the last step's bytes_sent against
# COPIES psi (N-1)/N x 4
bytes() {
  local b
  b=$(grep '"split": "train"' "$scratch/$1/metrics.jsonl" | tail -n 1 | sed -n 's/.*"bytes_sent": \([0-9]*\).*/\1/p')
  awk -v b="$b" -v p="$4" -v n="$2" -v k="$3" -v name="$1" 'BEGIN { t = k * p * (n - 1) / n * 4;
      r = b / t; printf "%s: %d bytes sent per step, theory %d (ratio %.4f)\n", name, b, t, r;
      exit !(r >= 1 && r <= 1.02) }' || fail "$1: bytes per step $b not within 2% above the theory"
}
bytes zero1_w2_m4_a1_ckpt_false 2 2 118528
bytes zero1_w4_m2_a1_ckpt_false 4 2 118528
bytes zero2_w2_m4_a1_ckpt_false 2 2 118528
bytes zero2_w4_m2_a1_ckpt_false 4 2 118528
# zero3 on an untied Llama: GPT-2's tied embedding is gathered for both
# modules using it, in both passes, which ZeRO's 3 psi does not count (and
# the rank owning it pays for).
llama=(--model llama-tiny --set model.n_layer=2 --set model.n_embd=64 --set model.seq_len=32
  --set model.vocab_size=256)
run llama_ddp_w1 1 8 1 "${llama[@]}"
grep -q "164.2k params" "$scratch/llama_ddp_w1.out" || fail "the Llama shape is not 164160 parameters"
for np in 2 4; do
  run "zero3_bytes_w$np" "$np" $((8 / np)) 1 "${llama[@]}" --strategy zero3 "${zero3[@]}" \
    --set strategy.prefetch_bucket_size=0 --set strategy.max_reuse_distance=0
  compare llama_ddp_w1 "zero3_bytes_w$np"
  bytes "zero3_bytes_w$np" "$np" 3 164160
done
echo "PASS"
