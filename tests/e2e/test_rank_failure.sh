#!/usr/bin/env bash
# A rank that dies or hangs ends the whole job within a bounded time, and
# ztrain itself names it (from the heartbeats every rank exchanges with
# rank 0), not only mpirun: (a) rank 1 killed with SIGKILL mid-run: mpirun
# stops the job with SIGTERM, on which rank 0 says rank 1 went silent;
# (b) rank 1 frozen with SIGSTOP: rank 0's next collective hits [comm]
# timeout and aborts the job naming itself, the operation and the silent
# rank; (c) at world 3 with rank 2 frozen, the rank whose timeout ends the
# job names rank 2, whichever it is (rank 1 learns it from rank 0); (d) a
# rank frozen in a sequence-parallel job (Ulysses' all-to-alls in its
# sequence group) ends it the same way.
#
# usage: test_rank_failure.sh ZTRAIN_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mpirun=$(command -v mpirun) || fail "mpirun not found (install openmpi-bin)"

# start NAME [RANKS [VICTIM]]: a long run in the background (2 ranks unless
# given, with the settings in ${extra[@]}); sets $job and $victim (the pid
# of rank VICTIM, default 1) once that rank is training.
extra=()
start() {
  local name=$1 np=${2:-2} target=${3:-1}
  "$mpirun" --allow-run-as-root --oversubscribe --bind-to none -np "$np" "$ZTRAIN" \
    --set train.steps=100000 --set train.log_every=1 --set device.threads=1 \
    --set model.n_layer=1 --set model.n_embd=32 --set model.seq_len=16 --set train.micro_batch_size=2 --set train.grad_accum=1 \
    --set comm.timeout=3s --set train.save_final=false --set train.out_dir="$scratch/$name" \
    "${extra[@]}" "$SRC/configs/run.toml" > "$scratch/$name.out" 2>&1 &
  job=$!
  victim=""
  for _ in $(seq 1 300); do
    for pid in $(pgrep -f "train.out_dir=$scratch/$name" || true); do
      if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$target"; then
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
grep -q "\[rank 0\] ztrain: stopped by SIGTERM.*rank 1 has sent no heartbeat for" "$scratch/killed.out" ||
  { cat "$scratch/killed.out" >&2; fail "killed: ztrain's own message does not name rank 1"; }
echo "killed rank: $(grep -m1 "ztrain: stopped by SIGTERM" "$scratch/killed.out")"

# frozen NAME RANKS VICTIM PATTERN: VICTIM stopped with SIGSTOP; the job
# must end, and a timeout message match PATTERN.
frozen() {
  local name=$1 pattern=$4
  start "$name" "$2" "$3"
  kill -STOP "$victim"
  finish "$name" 30
  kill -9 "$victim" 2> /dev/null || true
  grep -q "$pattern" "$scratch/$name.out" ||
    { cat "$scratch/$name.out" >&2; fail "$name: no timeout message matches '$pattern'"; }
  echo "$name: $(grep -m1 "did not finish" "$scratch/$name.out")"
}
frozen frozen 2 1 "rank 0: .* did not finish within 3 s; rank 1 has sent no heartbeat for"
frozen frozen3 3 2 "rank [01]: .* did not finish within 3 s; .*rank 2 has sent no heartbeat for"
extra=(--set parallel.sequence=2)
frozen frozen_ulysses 2 1 "rank 0: .* did not finish within 3 s; rank 1 has sent no heartbeat for"
grep -q "mesh: sequence 2" "$scratch/frozen_ulysses.out" || fail "frozen_ulysses did not split its sequences"
# A rank frozen mid-ring: its neighbours wait on a pass that never comes.
extra=(--set parallel.context=2)
frozen frozen_ring 2 1 "rank 0: .* did not finish within 3 s; rank 1 has sent no heartbeat for"
grep -q "mesh: context 2" "$scratch/frozen_ring.out" || fail "frozen_ring did not split its sequences"
echo "PASS"
