#!/usr/bin/env bash
# DDP on one machine: gpt2-tiny at 2 ranks x 1 thread (micro-batch 4 each)
# against 1 rank x 2 threads (micro-batch 8), the same global batch of 8
# sequences of 256 tokens, in one script;
# the communication wait with overlap_comm on and off (how much of it backward
# hides); bytes per step against ring all-reduce theory 2 psi (N-1)/N; and
# the same 2 ranks started torchrun-style (RANK/WORLD_SIZE: gloo) against
# mpirun's, under ddp and under zero3 (gloo's all-gather and our ring
# reduce-scatter on gloo's transport).
#
#   bench/bench_ddp.sh [BUILD_DIR] [STEPS]
set -euo pipefail
build=${1:-build}
steps=${2:-12}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--model gpt2-tiny --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0
  --set train.save_final=false --set train.grad_accum=1)

run() {  # run NAME NPROC THREADS [ARGS...]
  local name=$1 np=$2 threads=$3
  shift 3
  local launch=()
  if [ "$np" -gt 1 ]; then launch=(--nproc "$np"); fi
  "$ztrain" "${launch[@]}" "${common[@]}" --set device.threads="$threads" \
    --set train.micro_batch_size=$((8 / np)) \
    --set train.out_dir="$out/$name" "$@" "$src/configs/run.toml" > "$out/$name.log" 2>&1
}
source "$src/bench/metrics.sh"

run one_rank 1 2
# run_env NAME [ARGS...]: 2 ranks started on their own, meeting at rank 0
run_env() {
  local name=$1 port=$((20000 + RANDOM % 40000)) pids=() r
  shift
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$ztrain" "${common[@]}" --set device.threads=1 --set train.micro_batch_size=4 \
      --set train.out_dir="$out/$name" "$@" "$src/configs/run.toml" > "$out/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
}
run two_ranks 2 1
run two_ranks_no_overlap 2 1 --set strategy.overlap_comm=false
run_env two_ranks_gloo
run two_ranks_zero3 2 1 --strategy zero3
run_env two_ranks_zero3_gloo --strategy zero3
t1=$(median one_rank tokens_per_s)
t2=$(median two_ranks tokens_per_s)
w_on=$(median two_ranks comm_wait_s)
w_off=$(median two_ranks_no_overlap comm_wait_s)
bytes=$(median two_ranks bytes_sent)
params=$(sed -n 's/.*(gpt2, \([0-9.]*\)M params).*/\1/p' "$out/one_rank.log")
printf "gpt2-tiny, global batch 8 x 256 tokens, %s steps (medians of steps 3..)\n" "$steps"
printf "  1 rank x 2 threads   %8.0f tokens/s\n" "$t1"
printf "  2 ranks x 1 thread   %8.0f tokens/s   ratio %.2f (goal >= 0.9)\n" "$t2" "$(awk -v a="$t2" -v b="$t1" 'BEGIN { print a / b }')"
printf "  comm wait per step   %8.4f s with overlap_comm, %.4f s without: %.0f%% hidden behind backward\n" \
  "$w_on" "$w_off" "$(awk -v a="$w_on" -v b="$w_off" 'BEGIN { print (b > 0 ? 100 * (1 - a / b) : 0) }')"
printf "  bytes per step/rank  %8d  (theory 2 psi (N-1)/N x 4 B with psi = %sM: %.0f)\n" "$bytes" "$params" \
  "$(awk -v p="$params" 'BEGIN { print 2 * p * 1e6 * 0.5 * 4 }')"
# versus NAME REFERENCE LABEL: tokens/s and comm wait of NAME against REFERENCE's
versus() {
  local t r
  t=$(median "$1" tokens_per_s)
  r=$(median "$2" tokens_per_s)
  printf "  %-20s %8.0f tokens/s   mpirun %.0f, ratio %.2f; comm wait %.4f s per step (mpirun %.4f s)\n" \
    "$3" "$t" "$r" "$(awk -v a="$t" -v b="$r" 'BEGIN { print a / b }')" "$(median "$1" comm_wait_s)" \
    "$(median "$2" comm_wait_s)"
}
versus two_ranks_gloo two_ranks "ddp, 2 ranks on gloo"
versus two_ranks_zero3_gloo two_ranks_zero3 "zero3, 2 ranks gloo"
