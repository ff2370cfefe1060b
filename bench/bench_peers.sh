#!/usr/bin/env bash
# Every multi-rank row against its peers at world 2 (2 ranks x 1 thread, fp32,
# global batch 8 x 256 tokens for gpt2-tiny and 4 x 64 for gpt2-124m): ztrain
# started by mpirun (`--nproc 2`) and torchrun-style (RANK/WORLD_SIZE, gloo),
# against PyTorch DDP, ZeRO-1 (ZeroRedundancyOptimizer), FSDP and FSDP2 in
# both sharding modes and DeepSpeed ZeRO 1-3 with and without CPU offload, as
# the peer programs of PEERS_DIR run them (peer_gpt2.py, peer_ds.py: the same
# GPT-2, tied head, AdamW lr 1e-3 betas (0.9, 0.95) wd 0.1, clip 1.0, torch's
# fused AdamW; DeepSpeedCPUAdam under offload). Rounds alternate ztrain and
# its peers row by row; each round's ratio is the peer's median step over
# ztrain's in the same round (rank 0's medians after 3 warm-up steps on both
# sides). Goal: every ratio >= 1.5, but for gpt2-tiny's ddp row, whose goal
# is its step at >= 95 % of one rank's roofline (below): torch DDP there runs
# faster than 1.5 times any step at OpenBLAS's GEMM rate could (issue 50).
# Needs PYTHON with torch and deepspeed.
#
# Each round also measures what one rank's step could be at best: two
# bench_cpu_step runs at once (one rank's batch, 1 thread each, as the two
# ranks share the machine) print the step's roofline, every matmul at
# sgemm's rate for its shape and the other ops at the stream's; the larger
# of the two is the floor. A peer's step over that floor, the ceiling
# column, is the ratio a step running at its roofline would reach with
# communication free: passing it takes GEMMs faster than OpenBLAS's at the
# step's shapes, or fewer FLOPs than the roofline counts (attention's
# blocks of 64 queries run about a fifth more than the causal triangle).
# The bound column is the peer's step over the least a step could take on
# this processor by any implementation: its least FLOPs (attention's exact
# triangle) at the measured multiply-add peak, all else free. A cell whose
# bound is under 1.5 cannot reach the goal here. Last, every ztrain row's
# step against that floor: the floor over the step, 100 % for a step at its
# roofline with communication free.
#
#   bench/bench_peers.sh BUILD_DIR PYTHON PEERS_DIR [ROUNDS] [SHAPES] [ROWS]
#   e.g. bench/bench_peers.sh build /tmp/peers-venv/venv/bin/python ../shared/peers 2 "tiny 124m"
set -euo pipefail
build=${1:?build dir}
python=${2:?python with torch and deepspeed}
peers=$(realpath "${3:?the directory of peer_gpt2.py and peer_ds.py}")
rounds=${4:-2}
shapes=${5:-tiny 124m}
rows=${6:-ddp zero1 zero2 zero3 zero2_offload zero3_offload}
src=$(cd "$(dirname "$0")/.." && pwd)
ztrain=$(realpath "$build/bin/ztrain")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
source "$src/bench/metrics.sh"

peers_of() {  # the peer runs of a ztrain strategy, one NAME:PROGRAM:ARGS a line
  case $1 in
    ddp) echo "torch_ddp:peer_gpt2.py:--mode ddp" ;;
    zero1) printf "%s\n" "torch_zero1:peer_gpt2.py:--mode zero1" "ds_zero1:peer_ds.py:--stage 1" ;;
    zero2) printf "%s\n" "fsdp_gradop:peer_gpt2.py:--mode fsdp_gradop" \
      "fsdp2_gradop:peer_gpt2.py:--mode fsdp2_gradop" "ds_zero2:peer_ds.py:--stage 2" ;;
    zero3) printf "%s\n" "fsdp_full:peer_gpt2.py:--mode fsdp_full" \
      "fsdp2_full:peer_gpt2.py:--mode fsdp2_full" "ds_zero3:peer_ds.py:--stage 3" ;;
    zero2_offload) echo "ds_zero2_offload:peer_ds.py:--stage 2 --offload" ;;
    zero3_offload) echo "ds_zero3_offload:peer_ds.py:--stage 3 --offload" ;;
  esac
}
ztrain_args() {  # the shape's model and batch
  case $1 in
    tiny) echo "--model gpt2-tiny --set train.micro_batch_size=4" ;;
    124m) echo "--model gpt2-124m --set model.seq_len=64 --set train.micro_batch_size=2" ;;
  esac
}
step_args() {  # one rank's step for bench_cpu_step
  case $1 in
    tiny) echo "--model gpt2-tiny --batch 4 --seq 256" ;;
    124m) echo "--model gpt2-124m --batch 2 --seq 64" ;;
  esac
}
common=(--set train.steps=13 --set train.log_every=1 --set train.eval_every=0
  --set train.save_final=false --set train.grad_accum=1 --set device.threads=1)

run_mpi() {  # run_mpi NAME SHAPE STRATEGY
  # shellcheck disable=SC2046
  "$ztrain" --nproc 2 $(ztrain_args "$2") "${common[@]}" --strategy "$3" \
    --set train.out_dir="$out/$1" "$src/configs/run.toml" > "$out/$1.log" 2>&1 ||
    { cat "$out/$1.log"; exit 1; }
}
run_env() {  # run_env NAME SHAPE STRATEGY: two ranks started on their own
  local port=$((20000 + RANDOM % 40000)) pids=() r
  for r in 0 1; do
    # shellcheck disable=SC2046
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$ztrain" $(ztrain_args "$2") "${common[@]}" --strategy "$3" --set train.out_dir="$out/$1" \
      "$src/configs/run.toml" > "$out/$1.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || { cat "$out/$1.$r.log"; exit 1; }; done
}
run_peer() {  # run_peer NAME SHAPE PROGRAM ARGS...: its median step in $out/NAME.s
  # A peer that printed its RESULT and then failed (torch's process-group
  # teardown aborts now and then, after the timed steps) still counts: its
  # steps are complete. Without a RESULT the run fails.
  local name=$1 shape=$2 program=$3 port=$((20000 + RANDOM % 40000)) rc=0
  shift 3
  (cd "$out" && "$python" "$peers/$program" --shape "$shape" "$@" --adam fused --steps 10 \
    --port "$port") < /dev/null > "$out/$name.log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    grep -q '^RESULT ' "$out/$name.log" || { tail -30 "$out/$name.log"; exit 1; }
    echo "note: $name exited $rc after printing its result (kept)" >&2
  fi
  sed -n 's/^RESULT //p' "$out/$name.log" |
    "$python" -c 'import json, sys; print(json.load(sys.stdin)["median_step_s"])' > "$out/$name.s"
}

larger_s() {  # larger_s LABEL LOG...: the larger of the logs' "LABEL: X ms", in seconds
  sed -n "s/.*$1: \([0-9.]*\) ms.*/\1/p" "${@:2}" | sort -g | tail -1 | awk '{ print $1 / 1000 }'
}

run_floor() {  # run_floor NAME SHAPE: the larger roofline (s) of two at once in $out/NAME.s,
  # the larger FMA-peak bound (s) in $out/NAME.bound.s
  local r pids=()
  for r in 0 1; do
    # shellcheck disable=SC2046
    "$build/bin/bench_cpu_step" $(step_args "$2") --threads 1 --steps 5 > "$out/$1.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || { cat "$out/$1.$r.log"; exit 1; }; done
  larger_s "step against its roofline" "$out/$1".[01].log > "$out/$1.s"
  larger_s "step at the FMA peak" "$out/$1".[01].log > "$out/$1.bound.s"
  if ! [ -s "$out/$1.s" ] || ! [ -s "$out/$1.bound.s" ]; then
    cat "$out/$1.0.log"
    exit 1
  fi
}

for round in $(seq "$rounds"); do
  for shape in $shapes; do
    run_floor "$shape.floor.$round" "$shape"
    for row in $rows; do
      run_mpi "$shape.$row.mpi.$round" "$shape" "$row"
      run_env "$shape.$row.env.$round" "$shape" "$row"
      while IFS=: read -r name program args; do
        # shellcheck disable=SC2086
        run_peer "$shape.$row.$name.$round" "$shape" "$program" $args
      done < <(peers_of "$row")
    done
  done
done

printf "world 2 (2 ranks x 1 thread, fp32), median step of rank 0; ratio = peer / ztrain (goal >= 1.5)\n"
printf "%-5s %-14s %-17s %s\n" shape ztrain peer \
  "per round: peer s, ztrain mpirun s (ratio), ztrain torchrun-style s (ratio), ceiling, bound"
for shape in $shapes; do
  line=""
  for round in $(seq "$rounds"); do
    line+=$(awk -v f="$(cat "$out/$shape.floor.$round.s")" \
      -v b="$(cat "$out/$shape.floor.$round.bound.s")" 'BEGIN { printf "  %.3f, %.3f", f, b }')
  done
  printf "%-5s %-14s %-17s%s\n" "$shape" "(one rank's" "roofline, peak s)" "$line"
  for row in $rows; do
    peers_of "$row" | while IFS=: read -r name _; do
      line=""
      for round in $(seq "$rounds"); do
        p=$(cat "$out/$shape.$row.$name.$round.s")
        m=$(median "$shape.$row.mpi.$round" step_time_s)
        e=$(median "$shape.$row.env.$round" step_time_s)
        f=$(cat "$out/$shape.floor.$round.s")
        b=$(cat "$out/$shape.floor.$round.bound.s")
        line+=$(awk -v p="$p" -v m="$m" -v e="$e" -v f="$f" -v b="$b" 'BEGIN {
          printf "  %.3f, %.3f (%.2f), %.3f (%.2f), %.2f, %.2f", p, m, p / m, e, p / e, p / f, p / b }')
      done
      printf "%-5s %-14s %-17s%s\n" "$shape" "$row" "$name" "$line"
    done
  done
done

printf "\nztrain's step against one rank's roofline, floor / step (goal for tiny's ddp >= 95 %%)\n"
printf "%-5s %-14s %s\n" shape ztrain "per round: mpirun, torchrun-style"
for shape in $shapes; do
  for row in $rows; do
    line=""
    for round in $(seq "$rounds"); do
      line+=$(awk -v f="$(cat "$out/$shape.floor.$round.s")" \
        -v m="$(median "$shape.$row.mpi.$round" step_time_s)" \
        -v e="$(median "$shape.$row.env.$round" step_time_s)" \
        'BEGIN { printf "  %.1f %%, %.1f %%", 100 * f / m, 100 * f / e }')
    done
    printf "%-5s %-14s%s\n" "$shape" "$row" "$line"
  done
done

printf "\nztrain's sharded stages over its ddp, same rounds (mpirun; goals: zero2 <= 1.05, zero3 <= 1.10)\n"
for shape in $shapes; do
  [[ " $rows " == *" ddp "* ]] || continue
  for row in $rows; do
    [ "$row" != ddp ] || continue
    line=""
    for round in $(seq "$rounds"); do
      line+=$(awk -v z="$(median "$shape.$row.mpi.$round" step_time_s)" \
        -v d="$(median "$shape.ddp.mpi.$round" step_time_s)" 'BEGIN { printf "  %.3f", z / d }')
    done
    printf "%-5s %-14s%s\n" "$shape" "$row" "$line"
  done
done
