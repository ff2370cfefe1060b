#!/usr/bin/env bash
# The two launch paths against each other: the same run started by mpirun
# (`ztrain --nproc N`, Open MPI) and torchrun-style (RANK/WORLD_SIZE: gloo),
# under ddp and zero3, at world 2 and 4 (1 thread per rank), with [comm]
# shared_memory on (the default: the ranks share this host, so both run
# their collectives through one shared segment) and off (each backend's own
# transport: gloo's TCP, Open MPI's shared-memory BTL). Prints each
# torchrun-style step over mpirun's from the same round (goal <= 1.05), and
# the collectives' bus bandwidth of both backends at world 2 with the segment
# and without (build/bin/bench_comm). Rounds alternate the two launchers.
#
#   bench/bench_launch.sh [BUILD_DIR] [ROUNDS] [SHAPES] [WORLDS] [STRATEGIES]
#   e.g. bench/bench_launch.sh build 2 "tiny 124m" "2 4" "ddp zero3"
set -euo pipefail
build=${1:-build}
rounds=${2:-2}
shapes=${3:-tiny 124m}
worlds=${4:-2 4}
strategies=${5:-ddp zero3}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
bench_comm=$(realpath "$build/bin/bench_comm")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
source "$src/bench/metrics.sh"
common=(--set train.steps=12 --set train.log_every=1 --set train.eval_every=0
  --set train.save_final=false --set train.grad_accum=1 --set device.threads=1)

model_args() {  # model_args SHAPE: the model and its global batch (8 x 256 or 4 x 64 tokens)
  case $1 in
    tiny) echo "--model gpt2-tiny --set train.global_batch_size=8" ;;
    124m) echo "--model gpt2-124m --set model.seq_len=64 --set train.global_batch_size=4" ;;
  esac
}
# env_ranks N COMMAND...: N ranks started on their own, meeting at rank 0.
env_ranks() {
  local n=$1 port=$((20000 + RANDOM % 40000)) pids=() r
  shift
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port "$@" > "$out/env.$r.log" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < n; r++)); do wait "${pids[$r]}" || { cat "$out/env.$r.log"; exit 1; }; done
}
run() {  # run NAME LAUNCHER SHAPE WORLD STRATEGY SHM
  local name=$1 launcher=$2 shape=$3 world=$4
  # shellcheck disable=SC2207
  local args=($(model_args "$shape") "${common[@]}" --strategy "$5" --set comm.shared_memory="$6"
    --set train.out_dir="$out/$name" "$src/configs/run.toml")
  if [ "$launcher" = mpi ]; then
    "$ztrain" --nproc "$world" "${args[@]}" > "$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
  else
    env_ranks "$world" "$ztrain" "${args[@]}"
  fi
}

cases=()
for shape in $shapes; do
  for world in $worlds; do
    for strategy in $strategies; do
      for shm in true false; do cases+=("$shape:$world:$strategy:$shm"); done
    done
  done
done
for round in $(seq "$rounds"); do
  for c in "${cases[@]}"; do
    IFS=: read -r shape world strategy shm <<< "$c"
    for launcher in mpi env; do run "$c.$launcher.$round" "$launcher" "$shape" "$world" "$strategy" "$shm"; done
  done
done

printf "median step (s) of rank 0, 1 thread per rank; ratio = torchrun-style (gloo) / mpirun (goal <= 1.05)\n"
printf "%-5s %5s %-6s %-13s  %s\n" shape world ztrain shared_memory "per round: mpirun s, torchrun-style s (ratio)"
for c in "${cases[@]}"; do
  IFS=: read -r shape world strategy shm <<< "$c"
  line=""
  for round in $(seq "$rounds"); do
    m=$(median "$c.mpi.$round" step_time_s)
    e=$(median "$c.env.$round" step_time_s)
    line+=$(awk -v m="$m" -v e="$e" 'BEGIN { printf "  %.3f, %.3f (%.3f)", m, e, e / m }')
  done
  printf "%-5s %5s %-6s %-13s %s\n" "$shape" "$world" "$strategy" "$shm" "$line"
done

printf "\ncollectives at world 2 (build/bin/bench_comm, fp32): bus GB/s\n"
sizes=1048576,33554432
for shm in 1 0; do
  mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 \
    "$bench_comm" --sizes $sizes --shared-memory $shm > "$out/comm.mpi.$shm" 2>&1
  env_ranks 2 "$bench_comm" --sizes $sizes --shared-memory $shm
  cp "$out/env.0.log" "$out/comm.env.$shm"
done
printf "%-15s %10s %14s %14s %14s %14s\n" collective elements "mpi+shm" "gloo+shm" "mpi (own)" "gloo (tcp)"
paste "$out/comm.mpi.1" "$out/comm.env.1" "$out/comm.mpi.0" "$out/comm.env.0" |
  awk 'NF == 16 && $2 ~ /^[0-9]+$/ { printf "%-15s %10s %14s %14s %14s %14s\n", $1, $2, $4, $8, $12, $16 }'
