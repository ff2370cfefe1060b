#!/usr/bin/env bash
# A rank that dies or hangs ends the whole job within a bounded time, with a
# message naming a rank: (a) rank 1 killed with SIGKILL mid-run: mpirun
# reports it and stops the job; (b) rank 1 frozen with SIGSTOP: rank 0's
# next collective hits [comm] timeout and aborts the job naming itself and
# the operation.
#
# usage: test_rank_failure.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mpirun=$(command -v mpirun) || fail "mpirun not found (install openmpi-bin)"

# start NAME: a long 2-rank run in the background; sets $job and $victim
# (the pid of rank 1) once rank 1 is training.
start() {
  local name=$1
  "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -np 2 "$ZTRAIN" \
    --set train.steps=100000 --set train.log_every=1 --set device.threads=1 \
    --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=16 --set train.micro_batch_size=2 \
    --set comm.timeout=3s --set train.save_final=false --set train.out_dir="$scratch/$name" \
    "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 &
  job=$!
  victim=""
  for _ in $(seq 1 300); do
    for pid in $(pgrep -f "train.out_dir=$scratch/$name" || true); do
      if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then
        victim=$pid
      fi
    done
    if [ -n "$victim" ] && grep -q "step 3/" "$scratch/$name.out" 2>/dev/null; then return; fi
    sleep 0.1
  done
  kill -9 "$job" 2>/dev/null || true
  fail "$name: the job did not start training (rank 1 pid '${victim}')"
}

# finish NAME LIMIT: the job must end within LIMIT seconds, non-zero.
finish() {
  local name=$1 limit=$2
  for _ in $(seq 1 $((limit * 10))); do
    if ! kill -0 "$job" 2>/dev/null; then
      if wait "$job"; then fail "$name: the job exited 0 after losing a rank"; fi
      return
    fi
    sleep 0.1
  done
  kill -9 "$job" 2>/dev/null || true
  pkill -9 -f "train.out_dir=$scratch/$name" || true
  fail "$name: the job was still running $limit s after losing a rank"
}

start killed
kill -9 "$victim"
finish killed 30
grep -qi "rank 1" "$scratch/killed.out" || { cat "$scratch/killed.out" >&2; fail "killed: no message names rank 1"; }
echo "killed rank: job ended; $(grep -i -m1 "rank 1" "$scratch/killed.out")"

start frozen
kill -STOP "$victim"
finish frozen 30
kill -9 "$victim" 2>/dev/null || true
grep -q "rank 0: .* did not finish within 3 s" "$scratch/frozen.out" ||
  { cat "$scratch/frozen.out" >&2; fail "frozen: no timeout message naming rank 0 and the operation"; }
echo "frozen rank: $(grep -m1 "did not finish" "$scratch/frozen.out")"
echo "PASS"
