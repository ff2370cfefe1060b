#!/usr/bin/env bash
# The output head in chunks of tokens against the whole (N, V) logits at
# once, in one script: gpt2-124m at 8 x 1024 tokens a step (the issue's long
# shape, where the logits are 1.5 GiB), world 1, 2 threads, fp32.
# [model] loss_chunk_tokens = 1024 is the default; loss_chunk_tokens = N
# puts the whole batch in one chunk, which is how the head ran before
# chunks. The two
# alternate, ROUNDS times (default 2); each run trains STEPS steps (default
# 4) from the same seed. Printed per round: the median step time from step
# 3 on, the measured peak of the device's activations, the process's peak
# RSS, and the loss of every step (the same model: they agree to fp32
# rounding).
#
#   bench/bench_head_chunks.sh [BUILD_DIR] [ROUNDS] [STEPS] [BATCH] [SEQ]
set -euo pipefail
build=${1:-build}
rounds=${2:-2}
steps=${3:-4}
batch=${4:-8}
seq=${5:-1024}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--model gpt2-124m --set model.seq_len="$seq" --set train.micro_batch_size="$batch"
  --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0
  --set train.save_final=false --set train.grad_accum=1 --set device.threads=2)
source "$src/bench/metrics.sh"

run() {  # run NAME CHUNK_TOKENS
  /usr/bin/time -f "%M" -o "$out/$1.rss" "$ztrain" "${common[@]}" \
    --set model.loss_chunk_tokens="$2" --set train.out_dir="$out/$1" \
    "$src/configs/run.toml" > "$out/$1.log" 2>&1 || { cat "$out/$1.log"; exit 1; }
}
activations() {
  grep '"split": "train"' "$out/$1/metrics.jsonl" | tail -n 1 |
    sed -n 's/.*"device": {[^}]*"activations": \([0-9]*\).*/\1/p'
}
losses() {
  grep '"split": "train"' "$out/$1/metrics.jsonl" | sed -n 's/.*"loss": \([-0-9.e+]*\).*/\1/p' |
    tr '\n' ' '
}

tokens=$((batch * seq))
printf "gpt2-124m, %d x %d tokens a step, %d steps a run, world 1, 2 threads\n" "$batch" "$seq" "$steps"
printf "%-6s %-14s %10s %14s %12s  %s\n" round head "step (s)" "activations" "peak RSS" losses
for r in $(seq 1 "$rounds"); do
  for mode in chunks whole; do
    if [ "$mode" = chunks ]; then run "$mode$r" 1024; else run "$mode$r" "$tokens"; fi
    printf "%-6s %-14s %10.3f %10.0f MiB %8.0f MiB  %s\n" "$r" "$mode" \
      "$(median "$mode$r" step_time_s)" "$(echo "$(activations "$mode$r") / 1048576" | bc -l)" \
      "$(echo "$(cat "$out/$mode$r.rss") / 1024" | bc -l)" "$(losses "$mode$r")"
  done
  printf "round %d: chunks / whole step time %.3f, activations %.3f, peak RSS %.3f\n" "$r" \
    "$(echo "$(median "chunks$r" step_time_s) / $(median "whole$r" step_time_s)" | bc -l)" \
    "$(echo "$(activations "chunks$r") / $(activations "whole$r")" | bc -l)" \
    "$(echo "$(cat "$out/chunks$r.rss") / $(cat "$out/whole$r.rss")" | bc -l)"
done
