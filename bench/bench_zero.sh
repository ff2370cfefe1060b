#!/usr/bin/env bash
# The ZeRO stages against ddp at world 2 (2 ranks x 1 thread), micro-batch
# 4 per rank, in one script: step time of each as a ratio to ddp's (goals:
# zero1 and zero2 <= 1.05, zero3 <= 1.15), bytes sent per step and rank,
# and the peak memory per rank of parameters, gradients, optimizer state
# and communication buffers. The model is gpt2-tiny (256 tokens per
# sequence) unless given, e.g. gpt2-124m 64 (the sequence length).
# zero3 runs twice: with the preset (DeepSpeed's defaults: parameters under
# 1e5 elements stay gathered, reuse keeps a step's parameters until its
# backward) and fully sharded (persistence 0, reuse 0: minimal memory, 3 psi
# bytes). Runs alternate between strategies, twice, and each ratio takes the
# better of its two rounds against ddp in the same round (noisy machines).
#
#   bench/bench_zero.sh [BUILD_DIR] [STEPS] [MODEL [SEQ_LEN]]
set -euo pipefail
build=${1:-build}
steps=${2:-20}
model=${3:-gpt2-tiny}
seq=${4:-256}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--model "$model" --set model.seq_len="$seq" --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0
  --set train.save_final=false --set train.grad_accum=1 --set device.threads=1
  --set train.micro_batch_size=4)
sharded=(--set strategy.param_persistence_threshold=0 --set strategy.max_reuse_distance=0
  --set strategy.prefetch_bucket_size=500000)

run() {  # run NAME STRATEGY [ARGS...]
  local name=$1 strategy=$2
  shift 2
  "$ztrain" --nproc 2 "${common[@]}" --strategy "$strategy" --set train.out_dir="$out/$name" \
    "$@" "$src/configs/run.toml" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}
source "$src/bench/metrics.sh"
peak() {
  grep '"split": "train"' "$out/$1/metrics.jsonl" | tail -n 1 |
    sed -n "s/.*\"device\": {[^}]*\"$2\": \([0-9]*\).*/\1/p"
}

variants=(ddp zero1 zero2 zero3 zero3_sharded)
for round in 1 2; do
  for v in "${variants[@]}"; do
    case $v in
      zero3_sharded) run "$v.$round" zero3 "${sharded[@]}" ;;
      *) run "$v.$round" "$v" ;;
    esac
  done
done
printf "%s at 2 ranks x 1 thread, global batch 8 x %s tokens, %s steps (medians of steps 3..)\n" \
  "$model" "$seq" "$steps"
printf "peak bytes per rank (the largest over ranks)\n"
printf "%-14s %9s %9s %7s %11s %10s %10s %10s %9s\n" variant "step (s)" "ddp (s)" "ratio" "bytes/step" params grads optimizer comm
for v in "${variants[@]}"; do
  best=""
  for round in 1 2; do
    t=$(median "$v.$round" step_time_s)
    d=$(median "ddp.$round" step_time_s)
    r=$(awk -v a="$t" -v b="$d" 'BEGIN { printf "%.3f", a / b }')
    if [ -z "$best" ] || awk -v a="$r" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$r bt=$t bd=$d br=$round; fi
  done
  printf "%-14s %9.4f %9.4f %7s %11d %10d %10d %10d %9d\n" "$v" "$bt" "$bd" "$best" \
    "$(median "$v.$br" bytes_sent)" "$(peak "$v.$br" params)" "$(peak "$v.$br" grads)" \
    "$(peak "$v.$br" optimizer)" "$(peak "$v.$br" comm)"
done
