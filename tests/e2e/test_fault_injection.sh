#!/usr/bin/env bash
# A rank killed (SIGKILL) at a random moment of training ends the job
# within the collective timeout, non-zero, with the survivor naming the
# lost rank, whatever the rank was doing (forward, backward, a gradient
# all-reduce or a ZeRO gather). Eight trials, alternating between mpirun
# and torchrun-style ranks (gloo) and between ddp and zero3, at random delays
# into training; each prints how long the job took to end.
#
# usage: test_fault_injection.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

job=(--model gpt2-tiny --set model.n_layer=4 --set model.n_embd=128 --set model.seq_len=64
  --set model.vocab_size=512 --set train.steps=100000 --set train.log_every=1 --set train.eval_every=0
  --set device.threads=1 --set train.save_final=false --set comm.timeout=5s)
mpirun=$(command -v mpirun) || fail "mpirun not found (install openmpi-bin)"
RANDOM=$$

# The pid of rank 1 of the job writing to out_dir $1 (mpirun: by its rank variable).
rank1_of_mpi() {
  local pid
  for pid in $(pgrep -f "train.out_dir=$1\$" || pgrep -f "train.out_dir=$1 " || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then
      echo "$pid"
      return
    fi
  done
}

for trial in 1 2 3 4 5 6 7 8; do
  name=t$trial
  backend=$([ $((trial % 2)) -eq 1 ] && echo mpi || echo gloo)
  strategy=$([ $(((trial + 1) / 2 % 2)) -eq 1 ] && echo ddp || echo zero3)
  out="$scratch/$name"
  if [ "$backend" = mpi ]; then
    "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$ZTRAIN" "${job[@]}" \
      --strategy "$strategy" --set train.out_dir="$out" "$SRC/configs/run.toml" > "$out.out" 2>&1 &
    lead=$!
  else
    reserve_port
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$ZTRAIN" "${job[@]}" \
        --strategy "$strategy" --set train.out_dir="$out" "$SRC/configs/run.toml" > "$out.$r.out" 2>&1 &
      [ "$r" -eq 0 ] && lead=$! || victim=$!
      spawned+=($!)
    done
  fi
  spawned+=("$lead")
  for _ in $(seq 300); do
    grep -q "step 2/" "$out".out "$out".0.out 2> /dev/null && break
    sleep 0.1
  done
  [ "$backend" = mpi ] && victim=$(rank1_of_mpi "$out")
  [ -n "$victim" ] || fail "$name: rank 1 not found"
  delay_ms=$((RANDOM % 700))
  sleep "$(printf '0.%03d' "$delay_ms")"
  kill -9 "$victim"
  start=$(date +%s%N)
  [ "$backend" = gloo ] && { wait "$victim" 2> /dev/null || true; }
  exit_within "$lead" 30
  took=$((($(date +%s%N) - start) / 1000000))
  [ "$status" -ne 0 ] || fail "$name: the job exited 0 after losing rank 1"
  log=$([ "$backend" = mpi ] && echo "$out.out" || echo "$out.0.out")
  grep -q "rank 1" "$log" || fail "$name: the survivor does not name rank 1: $(tail -3 "$log")"
  echo "$name ($backend, $strategy): rank 1 killed $delay_ms ms after step 2 began; job ended in $took ms: $(grep -m1 -o 'ztrain: .*rank 1[^;]*' "$log" | cut -c1-120)"
  pkill -9 -f "train.out_dir=$out" 2> /dev/null || true
done
echo "PASS"
